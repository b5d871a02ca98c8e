"""End-to-end decode latency (TPOT) for lychee.fig3: full attention vs TidalDecode vs LycheeDecode
(both K = 4096) on the engine, Llama-3-8B shape with random weights, 16K-128K, with each run's
bandwidth floor (weights + the KV rows the method must read, over the measured copy rate).

    python -m bench.lychee_tpot --out results/bench/lychee_tpot_h100.json [--batch 1]

LycheeDecode runs the paper's retrieval-head budget (32 of 256 KV heads: layer 0's 8 + 24 drawn at
random, `heads=random:0:24`; random weights have no trained heads, and latency does not depend on
which heads they are) at token granularity (the accuracy path) and at block granularity (64-slot
blocks, the reference's e2e path). The target of issue 10: lychee at 128K >= 1.7x faster than full
and faster than tidal (the paper: 2.7x and 1.73x on an A800).
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

VARIANTS = {
    "full": {},
    "tidal": {"budget": 4096},
    "lychee": {"budget": 4096, "heads": "random:0:24"},
    "lychee_block": {"budget": 4096, "heads": "random:0:24", "block_size": 64},
}


def method_cfg(variant: str, info: ModelInfo) -> dict:
    name = variant.split("_")[0]
    cfg = {"name": name, **REGISTRY.get(name).Config.defaults(), **VARIANTS[variant]}
    if name == "tidal" and cfg.get("reselect_layer") is not None:
        cfg["reselect_layer"] = min(int(cfg["reselect_layer"]), info.num_layers - 1)
    return cfg


def kv_rows(variant: str, cfg: dict, info: ModelInfo, context: int) -> float:
    """KV rows (one head's K and V row) a decode step must read, summed over layers."""
    L, Hq, Hkv = info.num_layers, info.num_heads, info.num_kv_heads
    if variant == "full":
        return L * Hkv * context
    budget = min(int(cfg["budget"]), context)
    if variant == "tidal":
        dense = int(cfg["dense_layers"]) + 1 + (cfg.get("reselect_layer") is not None)
        per = Hq if cfg.get("select", "query_head") == "query_head" else Hkv
        return dense * Hkv * context + (L - dense) * per * budget
    from methods import build
    from omegaconf import OmegaConf

    heads = build(OmegaConf.create(cfg), info).cfg.head_set(info)
    n_ret = heads.count
    return n_ret * context + (L * Hkv - n_ret) * budget


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--graphs", choices=["on", "off"], default="on")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    model, info, device, dtype = load_bench_model(args.model, args.weights)
    elt = torch.finfo(dtype).bits // 8
    weight_bytes = sum(p.numel() for p in model.parameters()) * elt
    clock = Clock(device)
    bandwidth = copy_bandwidth(device, clock)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context in args.contexts:
        ids = torch.randint(0, info.vocab_size, (args.batch, context), generator=gen).to(device)
        for variant in args.variants:
            cfg = method_cfg(variant, info)
            kv_bytes = kv_rows(variant, cfg, info, context) * args.batch * 2 * info.head_dim * elt
            floor = 1e3 * (weight_bytes + kv_bytes) / bandwidth
            _, ms = bench_engine(model, info, ids, args.steps, clock, 1, graphs=args.graphs == "on", method_cfg=cfg,
                                 time_prefill=False)
            rows.append({"context": context, "variant": variant, "method": cfg["name"], "batch": args.batch,
                         "tpot_ms": ms, "floor_ms": floor, "over_floor": ms / floor, "kv_gb_read": kv_bytes / 1e9,
                         "semantics": {k: v for k, v in cfg.items() if k != "name"}})
            print(f"{context:>7} {variant:>12}  {ms:8.2f} ms  floor {floor:6.2f}  x{ms / floor:4.2f}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for context in args.contexts:  # the ratios, per context
        by = {r["variant"]: r["tpot_ms"] for r in rows if r["context"] == context}
        for v in ("lychee", "lychee_block"):
            if v in by and "full" in by:
                print(f"{context:>7} {v}: {by['full'] / by[v]:.2f}x vs full"
                      + (f", {by['tidal'] / by[v]:.2f}x vs tidal" if "tidal" in by else ""))
    env = environment()
    out = {"bench": "lychee_tpot", **provenance("bench.lychee_tpot", argv), "model": args.model,
           "weights": args.weights, "dtype": str(dtype), "device": env.get("gpu", "cpu"), "graphs": args.graphs,
           "steps": args.steps, "bandwidth_bytes_s": bandwidth, "weights_gb": weight_bytes / 1e9,
           "environment": env, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
