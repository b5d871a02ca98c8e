#!/usr/bin/env bash
# LycheeDecode / DuoAttention on the device machine (issue 10), repo root, after
# `source bench/device_setup.sh`. About 2 minutes of GPU time in all (shrunken sweeps: the commands below
# are the ones analysis/papers/lychee_latency.py declares for lychee.fig3 / lychee.fig4).
#   1. GPU tests: the hybrid-head decode and retrieval-score kernels and the radix top-k at the
#      Llama-3-8B shape vs their torch references; lychee/duo CUDA path == CPU path and graph replay.
#   2. lychee.fig4: hybrid kernel vs SDPA flash decode and its HBM floor, 16K/128K, batch 1/8,
#      4/6/8 of 8 KV heads sparse at 90% sparsity; the selection ops (scores, top-k vs torch.topk).
#   3. lychee.fig3: engine TPOT full / tidal / lychee (tokens) / lychee (64-blocks), K=4096,
#      Llama-3-8B shape with random weights, batch 1, 32K and 128K, CUDA graphs.
# Logs and JSON under ${OUT:-results/bench}; render with `python -m analysis render lychee.fig3 lychee.fig4`.
set -euo pipefail
out=${OUT:-results/bench}
mkdir -p "$out"
py=${PYTHON:-python}
t0=$SECONDS
rc=0  # a failing test is reported at the end; the benchmarks still run

# (1) `-m gpu` keeps the interpreter-shape tests of these files out (they run on the CPU in `make test`)
$py -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_hybrid.py tests/test_kernels_topk.py \
    2>&1 | tail -15 | tee "$out/gpu_lychee_kernel_tests.log" || rc=1
$py -m pytest -q -p no:cacheprovider -m gpu tests/test_methods_gpu.py -k "lychee or duo" \
    2>&1 | tail -15 | tee "$out/gpu_lychee_method_tests.log" || rc=1
echo "tests: $((SECONDS - t0)) s"

# (2) lychee.fig4
$py -m bench.lychee_kernels --quick --sparse-heads 4 6 8 --out "$out/lychee_kernels_h100.json" \
    2>&1 | tee "$out/lychee_kernels.log"
echo "kernels: $((SECONDS - t0)) s"

# (3) lychee.fig3
$py -m bench.lychee_tpot --model llama3 --weights random --contexts 32768 131072 --steps 16 \
    --out "$out/lychee_tpot_llama3_h100.json" 2>&1 | tee "$out/lychee_tpot.log"
echo "total: $((SECONDS - t0)) s"
exit $rc
