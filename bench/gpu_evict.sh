#!/usr/bin/env bash
# GPU work of the eviction family (issue 9, branch evict), one H100 session, ~120 s of GPU time.
# Run from the repo root after `source bench/device_setup.sh`; logs and JSON under ${OUT:-results/bench}.
#   1. the registry-driven GPU suite for the evict methods: CUDA path == CPU path on tiny llama/qwen3,
#      captured CUDA graph == eager (tests/test_methods_gpu.py; ~15-30 s)
#   2. bench.bounded: decode ms/token of h2o, tova, streaming_llm at a 1M-token nominal context with a
#      4K and a 32K cache, beside full attention at the cache size (Llama-3.1-8B shape, random
#      weights, CUDA graphs; the bar: ratio <= 1.3; ~60-80 s, most of it the 32K prefills)
# Both steps run; the script exits non-zero if either failed.
set -euo pipefail
out=${OUT:-results/bench}
mkdir -p "$out"
py=${PYTHON:-python}
status=0

sel="h2o or tova or snapkv or pyramidkv or bigbird or truncate or streaming_llm"
t0=$SECONDS
"$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_methods_gpu.py -k "$sel" >"$out/gpu_evict_tests.log" 2>&1 \
  || status=$?
tail -25 "$out/gpu_evict_tests.log"
echo "gpu tests: exit $status, $((SECONDS - t0)) s"

t0=$SECONDS
"$py" -m bench.bounded --model llama31_8b --weights random --caches 4096 32768 --context 1048576 --steps 32 \
  --methods h2o tova streaming_llm --out "$out/bounded_llama31_8b_h100.json" || status=$?
echo "bench.bounded: $((SECONDS - t0)) s"
exit "$status"
