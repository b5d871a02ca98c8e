#!/usr/bin/env bash
# One device-machine session: GPU parity tests, then the latency benchmarks, logs under $OUT.
# Usage (on the GPU box, repo root): bash bench/gpu_session.sh [tests|engine|tpot|all]
set -uo pipefail
what=${1:-all}
out=${OUT:-results/bench}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels_fused.py tests/test_engine_gpu.py tests/test_methods_gpu.py \
    tests/test_kernels_gpu.py 2>&1 | tail -25 | tee "$out/gpu_tests.log"
fi
if [[ $what == engine || $what == all ]]; then
  python3 -m bench.engine --model llama3 --weights random --lengths 8192 32768 131072 --steps 32 \
    --repeat 2 --out "$out/engine_llama3_h100.json" 2>&1 | grep -v -i warn | tail -6
fi
if [[ $what == tpot || $what == all ]]; then
  python3 -m bench.tpot --model llama3 --weights random --contexts 10240 32768 102400 \
    --out "$out/tpot_llama3_h100.json" 2>&1 | grep -v -i warn
  python3 -m bench.tpot --model llama2_7b --weights random --contexts 10240 32768 \
    --out "$out/tpot_llama2_7b_h100.json" 2>&1 | grep -v -i warn
fi
