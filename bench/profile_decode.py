"""Profile one engine decode step (torch.profiler): where the time goes, by op.

    python -m bench.profile_decode --model llama3 --weights random --context 8192
"""
from __future__ import annotations

import argparse

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
    args = ap.parse_args(argv)
    model, info, device, _ = load_bench_model(args.model, args.weights)
    mcfg_method = OmegaConf.load(CONF / "method" / f"{args.method}.yaml")
    eng = Engine(model, build(mcfg_method, info))
    ids = torch.randint(0, info.vocab_size, (1, args.context), device=device)
    eng.reset(1, args.context + 64)
    eng.prefill(ids)
    tok = ids[:, -1]
    for _ in range(3):
        eng.decode(tok)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.steps):
            eng.decode(tok)
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
