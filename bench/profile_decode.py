"""Profile one engine decode step (torch.profiler): where the time goes, by op.

    python -m bench.profile_decode --model llama3 --weights random --context 8192
    python -m bench.profile_decode --model llama3 --weights random --context 131072 --method lychee \
        --set heads=random:0:24 block_size=64

Kernel totals are per decode step (the profiled steps' sum over --steps); eager launches, so the
CPU-side gaps a CUDA graph removes are in the wall time but not in the kernel times.
"""
from __future__ import annotations

import argparse
import time

import torch
from omegaconf import OmegaConf

from methods import build
from bench.engine import CONF, load_bench_model
from runners.engine import Engine


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--weights", default="pretrained")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--method", default="full")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--phase", choices=["decode", "prefill"], default="decode",
                    help="prefill: profile one whole prefill of --context tokens (--steps ignored)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="method option overrides")
    args = ap.parse_args(argv)
    model, info, device, _ = load_bench_model(args.model, args.weights)
    mcfg_method = OmegaConf.merge(OmegaConf.load(CONF / "method" / f"{args.method}.yaml"),
                                  OmegaConf.from_dotlist(args.set))
    eng = Engine(model, build(mcfg_method, info))
    ids = torch.randint(0, info.vocab_size, (1, args.context), device=device)
    eng.reset(1, args.context + 64)
    eng.prefill(ids)
    tok = ids[:, -1]
    for _ in range(3):
        eng.decode(tok)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if args.phase == "prefill":
        args.steps = 1
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        if args.phase == "prefill":
            eng.reset(1, args.context + 64)
            eng.prefill(ids)
        for _ in range(args.steps if args.phase == "decode" else 0):
            eng.decode(tok)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / args.steps
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows))
    if device.type == "cuda":
        kern = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in kern) / args.steps / 1e3
        print(f"{args.method} {' '.join(args.set)} @ {args.context}: {args.phase} GPU kernel time {total:.3f} ms/step, "
              f"{sum(e.count for e in kern) / args.steps:.0f} kernels/step")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows))
    print(f"{args.method} {' '.join(args.set)} @ {args.context}: {args.phase} wall {wall:.1f} ms/step (profiled, eager)")


if __name__ == "__main__":
    main()
