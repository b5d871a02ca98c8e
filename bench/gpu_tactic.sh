#!/usr/bin/env bash
# Tactic on the GPU (repo root; after `source bench/device_setup.sh`), results under ${OUT:-results/bench}.
#   1. the registry-driven method suite for tactic (CUDA vs CPU, graph replay vs eager) and the real-shape
#      k-means CUDA-vs-CPU check (8 KV heads x 32K keys);
#   2. bench.tactic: prefill, k-means after it (ratio to the prefill) and decode ms/token beside full,
#      Quest and TidalDecode at 32K, Llama-3.1-8B layer shape cut to 4 layers, random weights.
# Expected: ~40 s of tests + ~40 s of benchmark (model init, 5 configurations x 4 prefills of 32K).
set -euo pipefail
out=${OUT:-results/bench}
mkdir -p "$out"
# a failing test is reported and the benchmark still runs (its numbers are independent of the tests)
{ python -m pytest -q -p no:cacheprovider -m gpu tests/test_methods_gpu.py tests/test_methods_tactic.py -k tactic \
    || echo "GPU TESTS FAILED"; } 2>&1 | tail -15 | tee "$out/gpu_tactic_tests.log"
python -m bench.tactic --model llama31_8b --layers 4 --context 32768 --steps 32 --repeat 3 --budget 1024 \
  --out "$out/tactic_h100.json" 2>&1 | tee "$out/gpu_tactic_bench.log"
