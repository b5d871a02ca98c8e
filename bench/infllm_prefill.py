"""InfLLM's prefill: where a chunk's time goes (issue 34). Per method spec, one untimed warm-up prefill,
then one timed prefill, with counts per (chunk, layer) of the torch ops and of the host syncs the method
asks for (.item / .tolist / .cpu / int() / bool() of a tensor, counted by wrapping them), and optionally
the top kernels of a torch.profiler trace.

    # CPU, a small random Llama (8 layers, 8 q / 2 kv heads of 64, InfLLM's options scaled by 1/16):
    python -m bench.infllm_prefill --context 4096 --methods full infllm infllm:offload=false
    # GPU, Llama-3-8B shape with random weights, YAML defaults:
    python -m bench.infllm_prefill --model llama3 --context 32768 --methods full infllm:offload=false infllm

Host syncs counted on the CPU are the calls a CUDA run would block on. `--count` (CPU) takes the GPU
code path (HARNESS_KERNELS=triton) with every Triton launch counted and skipped (outputs stay
uninitialised; only the counts mean something): what the host issues per chunk and layer on a GPU.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch

from bench.method_speed import method_cfg
from methods import build
from runners.engine import Engine

SMALL = {"n_init": 8, "n_local": 256, "block_size": 8, "topk": 16, "exc_block_size": 32, "max_cached_block": 32}  # 1/16 of the defaults
SYNCS = ("item", "tolist", "cpu", "__int__", "__bool__", "__float__", "nonzero")


class LaunchCounter:
    """Replaces kernel_for in every loaded kernels.* module: a launch is counted, not run."""

    def __init__(self):
        self.n = 0
        outer = self

        class _Skip:
            def __getitem__(self, grid):
                def launch(*a, **k):
                    outer.n += 1
                return launch
        self.skip = _Skip()

    def install(self):
        import sys
        for name, mod in list(sys.modules.items()):
            if name.startswith("kernels") and hasattr(mod, "kernel_for"):
                mod.kernel_for = lambda kernel, t: self.skip


class SyncCounter:
    """Counts the tensor methods that make a CUDA host wait (on any device) while active."""

    def __init__(self):
        self.counts: Counter = Counter()
        self._orig = {}

    def __enter__(self):
        for name in SYNCS:
            orig = getattr(torch.Tensor, name)
            self._orig[name] = orig

            def wrap(t, *a, _orig=orig, _name=name, **k):
                self.counts[_name] += 1
                return _orig(t, *a, **k)
            setattr(torch.Tensor, name, wrap)
        return self

    def __exit__(self, *exc):
        for name, orig in self._orig.items():
            setattr(torch.Tensor, name, orig)


def small_model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, vocab_size=256, max_position_embeddings=1 << 20)
    cfg._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="conf/model name (random weights); default: the small CPU model")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--warm", type=int, default=1024)
    ap.add_argument("--methods", nargs="+", default=["full", "infllm", "infllm:offload=false"])
    ap.add_argument("--profile", type=int, default=0, help="tokens of a second prefill under torch.profiler "
                    "(0: none): kernels and aten ops per chunk and layer, device-busy vs wall, top kernels")
    ap.add_argument("--count", action="store_true", help="CPU: the GPU code path's launches, counted not run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from methods.base import ModelInfo
    if args.model:
        from bench.engine import load_bench_model
        model, info, dev, _ = load_bench_model(args.model, "random")
    else:
        torch.set_num_threads(1)
        model, dev = small_model(), torch.device("cpu")
        info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, model.config.vocab_size, (1, args.context), device=dev)
    rows = []
    launches = None
    if args.count:
        import os
        os.environ["HARNESS_KERNELS"] = "triton"
        import kernels.attention  # every kernels module the methods use, loaded before patching
        import kernels.lse
        import kernels.topk
        import kernels.window
        try:
            import kernels.memory_prefill  # noqa: F401
        except ImportError:
            pass
        launches = LaunchCounter()
        launches.install()
    for spec in args.methods:
        cfg = method_cfg(spec)
        if not args.model and cfg.name != "full":
            cfg.update({k: v for k, v in SMALL.items() if k in cfg and f"{k}=" not in spec})
        eng = Engine(model, build(cfg, info), use_graphs=False)
        eng.reset(1, args.context + 8)
        eng.prefill(ids[:, :args.warm])
        eng.reset(1, args.context + 8)
        chunks = -(-args.context // (eng.method.prefill_chunk or args.context))
        sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
        n0 = launches.n if launches else 0
        with SyncCounter() as sc:
            sync()
            t = time.perf_counter()
            eng.prefill(ids)
            sync()
            secs = time.perf_counter() - t
        per = chunks * info.num_layers
        row = {"method": spec, "context": args.context, "chunks": chunks, "prefill_s": round(secs, 3),
               "syncs_per_chunk_layer": {k: round(v / per, 2) for k, v in sc.counts.items()}}
        if launches:
            row["triton_launches_per_chunk_layer"] = round((launches.n - n0) / per, 2)
        if args.profile:   # a second prefill of --profile tokens under the profiler (its overhead excluded above)
            n = args.profile
            eng.reset(1, args.context + 8)
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda"
                                                             else [])
            with torch.profiler.profile(activities=acts) as prof:
                sync()
                t = time.perf_counter()
                eng.prefill(ids[:, :n])
                sync()
                wall = time.perf_counter() - t
            per = -(-n // (eng.method.prefill_chunk or n)) * info.num_layers
            ev = prof.events()
            kern = [e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
            row["profile"] = {"tokens": n, "wall_s": round(wall, 3),
                              "device_busy_s": round(sum(e.time_range.elapsed_us() for e in kern) / 1e6, 3),
                              "cuda_kernels_per_chunk_layer": round(len(kern) / per, 1),
                              "top_level_aten_ops_per_chunk_layer": round(
                                  sum(1 for e in ev if e.name.startswith("aten::") and e.cpu_parent is None) / per, 1)}
            sort = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
            row["top"] = prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
        if args.profile:
            print(row["top"], flush=True)
        eng.close()
    if args.out:   # the one command and its commit recorded by the script, not added afterwards
        import sys

        from bench.engine import provenance
        from runners.results import environment
        argv = sys.argv[1:] if argv is None else list(argv)
        with open(args.out, "w") as f:
            json.dump({**provenance("bench.infllm_prefill", argv), "environment": environment(), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
