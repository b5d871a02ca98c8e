"""GPU and CPU benchmarks (not part of the run library): each script writes one JSON under
results/bench/ that records the command that wrote it and the commit it ran at.

  python -m bench.engine       engine vs HF StaticCache decode and prefill
  python -m bench.tpot         end-to-end ms/token of methods x budgets x contexts
  python -m bench.kernel_ops   the decode kernels against SDPA and their HBM floors
  python -m bench.profile_decode   a torch-profiler view of one decode step
  bash bench/gpu_session.sh    one device-machine session: GPU tests, then the benchmarks
"""
