#!/usr/bin/env bash
# Cascading KV Cache on the GPU, in about 2 minutes (repo root; after `source bench/device_setup.sh`):
#   1. the cascade kernels' GPU tests (strided attention + EMA mass, the update kernel: real shapes,
#      Triton vs the torch references) and the registry-driven method GPU suite for cascade (CUDA path
#      vs CPU path, CUDA-graph replay vs eager: the warm-up's save/restore of buffers() included);
#   2. shrunken runs of bench/cascade.py (Llama-3.1-8B shapes, random inputs/weights): one attention
#      layer to 256K through a 32K cache vs dense SDPA prefill, per-token cache adds, and the whole
#      model (random weights) at 64K: strided prefill + bounded decode vs full decode at the cache size.
# The smoke JSONs are named *_smoke_* on purpose: the catalogue's files (analysis/papers/cascade_latency.py)
# come from the full commands in analysis/targets.mk (`python -m analysis bench KEY`), minutes each.
set -euo pipefail
out=${OUT:-results/bench}
mkdir -p "$out"
python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_cascade.py 2>&1 | tail -15 | tee "$out/gpu_cascade_tests.log"
python -m pytest -q -p no:cacheprovider -m gpu tests/test_methods_gpu.py -k cascade 2>&1 | tail -15 \
  | tee -a "$out/gpu_cascade_tests.log"
python -m bench.cascade layer --model llama31_8b --cache 32768 --lengths 65536 262144 --streaming-max 65536 \
  --strides 4096 16384 --out "$out/cascade_layer_smoke_h100.json"
python -m bench.cascade cacheadd --cache 16384 --tokens 4096 --out "$out/cascade_cacheadd_smoke_h100.json"
python -m bench.cascade e2e --model llama31_8b --weights random --methods cascade full --cache 32768 \
  --lengths 65536 --dense-max 32768 --steps 16 --out "$out/cascade_e2e_smoke_h100.json"
