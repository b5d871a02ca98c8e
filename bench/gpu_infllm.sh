#!/usr/bin/env bash
# GPU work of the infllm branch (InfLLM, Ltri-LLM, LM-Infinite), ~2 minutes on one H100. Run from the
# repo root after `source bench/device_setup.sh`; logs and JSON under ${OUT:-results/bench}.
#   1. GPU tests: real-shape parity of the lse / distance-band kernels, InfLLM's offload holding less
#      measured device memory (flat in context) with the same outputs, and the registry-driven CUDA vs
#      CPU path and graph checks for the three methods.
#   2. bench.memory_offload, shrunk (1 layer of Llama-3-8B's shape, random weights, contexts 4K-32K,
#      4 timed decode steps): decode latency, measured device/host memory, block loads per token for
#      full, InfLLM with and without offload, Ltri-LLM and StreamingLLM. ltri.table4's own file
#      (100K-800K) is the longer command `python -m analysis bench ltri.table4` prints.
# Each step has its own time limit; a step that fails or times out is logged and the next one runs (the
# bench prints each row as JSON as it goes: a timed-out sweep keeps its rows in the log).
set -euo pipefail
out=${OUT:-results/bench}
mkdir -p "$out"
status=0

step() {   # step NAME LIMIT_S CMD...: run with a time limit, log the tail, remember a failure
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" > "$out/gpu_infllm_$name.log" 2>&1 || rc=$?
  tail -25 "$out/gpu_infllm_$name.log"
  echo "== $name: exit $rc in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/gpu_infllm_steps.log"
  [[ $rc == 0 ]] || status=1
}

step tests 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu_merge.py \
  tests/test_methods_gpu_infllm.py tests/test_methods_gpu.py -k "infllm or ltri or lm_infinite or real or offload"

step memory_offload 75 python -m bench.memory_offload --model llama3 --weights random --layers 1 \
  --lengths 4224 16384 32768 --methods full infllm infllm:offload=false ltri streaming_llm:sink=128,window=4096 \
  --steps 4 --setup-only full --out "$out/memory_offload_small_llama3_h100.json"

exit $status
