"""Speedup side of LycheeDecode Fig. 8 (appendix E.4): end-to-end TPOT of LycheeDecode over full
attention for token budgets {1024, 2048, 4096} x retrieval-head ratios {12.5, 25, 50}% of all KV heads,
Llama-3-8B shape with random weights, one context, CUDA graphs, side by side in one run.

    python -m bench.lychee_grid --out results/bench/lychee_grid_llama3_h100.json

Random weights have no trained heads: a ratio r keeps layer 0's heads (forced, counted in r) and draws
round(r x layers x KV heads) - KV heads others at random (`heads=random:0:N`), as bench.lychee_tpot does
for the paper's 12.5%. Latency does not depend on which heads they are, only on how many. The block
path (64-slot blocks, the reference's e2e path) is what the paper's benchmark ran.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.engine import Clock, bench_engine, copy_bandwidth, load_bench_model, provenance
from bench.lychee_tpot import kv_rows
from methods import REGISTRY
from runners.results import environment

BUDGETS = (1024, 2048, 4096)
RATIOS = (0.125, 0.25, 0.5)


def lychee_cfg(budget: int, ratio: float, layers: int, kv_heads: int, block: int) -> dict:
    n = round(ratio * layers * kv_heads) - kv_heads  # layer 0's heads are forced and count in the ratio
    return {"name": "lychee", **REGISTRY.get("lychee").Config.defaults(), "budget": budget,
            "heads": f"random:0:{n}", "block_size": block}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    ap.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    ap.add_argument("--block", type=int, default=64, help="LycheeDecode block_size (1: token sets)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    model, info, device, dtype = load_bench_model(args.model, args.weights)
    elt = torch.finfo(dtype).bits // 8
    weight_bytes = sum(p.numel() for p in model.parameters()) * elt
    clock = Clock(device)
    bandwidth = copy_bandwidth(device, clock)
    ids = torch.randint(0, info.vocab_size, (args.batch, args.context), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    configs = [("full", None, None, {"name": "full", "prefill_chunk": None})]
    configs += [("lychee", b, r, lychee_cfg(b, r, info.num_layers, info.num_kv_heads, args.block))
                for r in args.ratios for b in args.budgets]
    rows, full_ms = [], None
    for variant, budget, ratio, cfg in configs:
        kv = kv_rows(variant, {**cfg, "budget": budget or 0}, info, args.context) * args.batch * 2 * info.head_dim * elt
        floor = 1e3 * (weight_bytes + kv) / bandwidth
        _, ms = bench_engine(model, info, ids, args.steps, clock, 1, graphs=True, method_cfg=cfg, time_prefill=False)
        full_ms = ms if variant == "full" else full_ms
        rows.append({"context": args.context, "variant": variant, "batch": args.batch, "budget": budget,
                     "head_ratio": ratio, "tpot_ms": ms, "floor_ms": floor, "over_floor": ms / floor,
                     "kv_gb_read": kv / 1e9, "speedup_vs_full": full_ms / ms,
                     "semantics": {k: v for k, v in cfg.items() if k != "name"}})
        print(f"{variant:>6} K={budget!s:>5} r={ratio!s:>5}  {ms:7.2f} ms  floor {floor:6.2f}  "
              f"x{ms / floor:4.2f}  {full_ms / ms:4.2f}x full", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    env = environment()
    out = {"bench": "lychee_grid", **provenance("bench.lychee_grid", argv), "model": args.model,
           "weights": args.weights, "dtype": str(dtype), "device": env.get("gpu", "cpu"), "steps": args.steps,
           "block": args.block, "bandwidth_bytes_s": bandwidth, "weights_gb": weight_bytes / 1e9,
           "environment": env, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
