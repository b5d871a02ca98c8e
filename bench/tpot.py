"""End-to-end decode latency (TPOT) of methods x budgets x contexts, with each one's floor.

    python -m bench.tpot --model llama3 --weights random --contexts 10240 32768 102400 \\
        --methods full quest tidal --budgets 32 256 1024 4096 --out results/bench/tpot_llama3_h100.json

The floor is the bytes a decode step must read at least (every weight once, plus the KV rows the
method attends: all of them in dense layers, `budget` per head elsewhere, Quest's page bounds)
over --bandwidth (default: a copy measured on this device at start). TidalDecode's items
(tidal.table5-6, fig6) render from these files; `python -m analysis bench FILE` runs the one command
the catalogue declares for each, and the JSON records that command and its commit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.engine import Clock, bench_engine, copy_bandwidth, load_bench_model, provenance
from methods import REGISTRY, ModelInfo
from runners.results import environment


def method_cfg(name: str, budget: int | None, info: ModelInfo) -> dict:
    base = {"name": name, **REGISTRY.get(name).Config.defaults()}
    if budget is not None and "budget" in base:
        base["budget"] = budget
    if name == "tidal" and base.get("reselect_layer") is not None:
        # the paper's re-selection layer is for 32-layer Llama; keep it inside smaller models
        base["reselect_layer"] = min(int(base["reselect_layer"]), info.num_layers - 1)
    return base


def kv_rows_read(name: str, cfg: dict, info: ModelInfo, context: int) -> float:
    """KV rows (one row = one head's D values of K and of V) a decode step reads, summed over layers."""
    L, Hq, Hkv = info.num_layers, info.num_heads, info.num_kv_heads
    if name == "full":
        return L * Hkv * context
    dense = int(cfg.get("dense_layers", 2))
    budget = min(int(cfg["budget"]), context)
    per_query = cfg.get("select", "query_head") == "query_head" if name == "tidal" else cfg.get("pool") != "kv_head"
    sparse_rows = (Hq if per_query else Hkv) * budget
    if name == "tidal":
        n_sel = 1 + (cfg.get("reselect_layer") is not None)
        return (dense + n_sel) * Hkv * context + (L - dense - n_sel) * sparse_rows
    if name == "quest":
        pages = -(-context // int(cfg.get("page_size", 16)))
        return dense * Hkv * context + (L - dense) * (sparse_rows + 2 * Hkv * pages / 2)  # min+max ~ 1 row/page
    raise ValueError(f"no floor model for {name}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[10240, 32768, 102400])
    ap.add_argument("--methods", nargs="+", default=["full", "quest", "tidal"])
    ap.add_argument("--budgets", type=int, nargs="+", default=[32, 256, 1024, 4096])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--graphs", choices=["on", "off"], default="on")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s for the floor (default: a copy measured on this device at start)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)

    model, info, device, dtype = load_bench_model(args.model, args.weights)
    elt = torch.finfo(dtype).bits // 8
    weight_bytes = sum(p.numel() for p in model.parameters()) * elt
    clock = Clock(device)
    bandwidth = args.bandwidth or copy_bandwidth(device, clock)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context in args.contexts:
        ids = torch.randint(0, info.vocab_size, (args.batch, context), generator=gen).to(device)
        for name in args.methods:
            for budget in ([None] if name == "full" else args.budgets):
                cfg = method_cfg(name, budget, info)
                kv_bytes = kv_rows_read(name, cfg, info, context) * args.batch * 2 * info.head_dim * elt
                floor = 1e3 * (weight_bytes + kv_bytes) / bandwidth
                _, ms = bench_engine(model, info, ids, args.steps, clock, 1, graphs=args.graphs == "on",
                                     method_cfg=cfg, time_prefill=False)
                row = {"context": context, "method": name, "budget": budget, "batch": args.batch,
                       "tpot_ms": ms, "floor_ms": floor, "over_floor": ms / floor,
                       "kv_gb_read": kv_bytes / 1e9, "semantics": {k: v for k, v in cfg.items() if k != "name"}}
                rows.append(row)
                print(f"{context:>7} {name:>6} {str(budget):>5}  {ms:8.2f} ms  floor {floor:6.2f}  x{ms / floor:4.2f}",
                      flush=True)
                torch.cuda.empty_cache() if device.type == "cuda" else None
    env = environment()
    out = {"bench": "tpot", **provenance("bench.tpot", argv), "model": args.model, "weights": args.weights,
           "dtype": str(dtype), "device": env.get("gpu", "cpu"), "graphs": args.graphs, "steps": args.steps,
           "bandwidth_bytes_s": bandwidth, "bandwidth_source": "--bandwidth" if args.bandwidth else "measured copy",
           "weights_gb": weight_bytes / 1e9, "environment": env, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
