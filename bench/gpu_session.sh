#!/usr/bin/env bash
# GPU checks on the device machine (repo root), logs under $OUT. Start with `source bench/device_setup.sh`.
#   bash bench/gpu_session.sh tests    kernel, engine and method parity at real and tiny shapes (registry-driven)
#   bash bench/gpu_session.sh golden   the embedded SmolLM2 fast path vs the recorded tokens/NLL (needs the GGUF)
# The latency benchmarks are declared per file with their one command: `python -m analysis bench KEY|FILE`
# (set HARNESS_COMMIT=<sha> on a copy without .git); see `python -m analysis list`.
set -uo pipefail
out=${OUT:-results/bench}
case ${1:-tests} in
  tests)  python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_fused.py tests/test_engine_gpu.py \
            tests/test_methods_gpu.py tests/test_kernels_gpu.py 2>&1 | tail -30 | tee "$out/gpu_tests.log" ;;
  golden) python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_golden.py 2>&1 | tail -15 | tee "$out/gpu_golden.log" ;;
  *) echo "usage: bash bench/gpu_session.sh tests|golden"; exit 2 ;;
esac
