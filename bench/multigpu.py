"""Decode ms/token of a model split over the GPUs of one host, beside the pipeline floor (issue 35).

Random weights of the model's real shapes, its layers over --devices GPUs (runners/plan.py's
balanced split, runners/pipeline.py), batch 1. The cache is filled with random values at the
context length instead of a real prefill (a 1M-token prefill of Llama-3-8B is ~10 minutes of
attention; a decode step's cost depends on how many rows it reads, not on their values), then
--steps decode steps are timed (after 2 warm-up steps), all GPUs synchronized at both ends.

The floor is a pipeline's: the GPUs run one after the other, so it is the sum over GPUs of (bytes
of weights and KV rows that GPU reads in a step) / (the copy bandwidth measured on that GPU).

    python -m bench.multigpu --model llama3 --contexts 524288 1048576 --methods full --devices 2 --out results/bench/multigpu_llama3_h100x2.json
    python -m bench.multigpu --model llama3_70b --contexts 32768 102400 --methods full tidal quest --budget 512 --devices 4 --out results/bench/multigpu_llama3_70b_h100x4.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import CONF, Clock, copy_bandwidth, provenance
from bench.tpot import method_cfg
from methods import ModelInfo, build
from runners import models
from runners import plan as P
from runners.engine import Engine
from runners.pipeline import split_engine
from runners.placement import load_placed
from runners.results import environment

GIB = 2 ** 30


def layer_rows(name: str, cfg: dict, info: ModelInfo, context: int, layer: int) -> float:
    """KV rows (one KV head's D values of K and of V) layer `layer` reads in a decode step (bench.tpot's model, per layer)."""
    Hq, Hkv = info.num_heads, info.num_kv_heads
    if name == "full":
        return Hkv * context
    dense = int(cfg.get("dense_layers", 2))
    budget = min(int(cfg["budget"]), context)
    per_query = cfg.get("select", "query_head") == "query_head" if name == "tidal" else cfg.get("pool") != "kv_head"
    sparse = (Hq if per_query else Hkv) * budget
    if name == "tidal":
        selection = {dense} | ({int(cfg["reselect_layer"])} if cfg.get("reselect_layer") is not None else set())
        return Hkv * context if layer < dense or layer in selection else sparse
    if name == "quest":
        pages = -(-context // int(cfg.get("page_size", 16)))
        return Hkv * context if layer < dense else sparse + Hkv * pages   # + min and max of each page
    raise ValueError(f"no floor model for {name}")


def fill(engine, context: int) -> None:
    """The cache as a prefill of `context` tokens would leave it, with random values (see the docstring)."""
    gen = None
    for t in engine.method.buffers().values():
        if t is not None and t.is_floating_point():
            t.normal_(0, 1, generator=gen)
    engine.seq_len = context
    engine.history.zero_()


def sync_all():
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3_70b")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 102400])
    ap.add_argument("--methods", nargs="+", default=["full", "tidal", "quest"])
    ap.add_argument("--budget", type=int, default=None, help="sparse methods' token budget (default: their own)")
    ap.add_argument("--devices", type=int, default=None, help="GPUs to split over (default: all visible)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not torch.cuda.is_available():
        sys.exit("error: bench.multigpu measures GPUs; run it on a machine with CUDA")
    n = args.devices or torch.cuda.device_count()
    mcfg = OmegaConf.load(CONF / "model" / f"{args.model}.yaml")
    mcfg.weights = "random"
    dtype = torch.bfloat16
    info = ModelInfo.from_hf_config(models.config_from_arch(mcfg.arch))
    # the split: the plan at the longest context with the largest storage of the methods asked for
    longest = max(args.contexts) + args.steps + 8
    biggest = build(OmegaConf.create(method_cfg("full", None, info)), info)
    fp, _ = P.footprint(models.config_from_arch(mcfg.arch), biggest, info, 1, longest, dtype,
                        f"{args.model}, full, batch 1 x {longest}")
    fp = P.Footprint(**{**fp.__dict__, "activations": P.activation_bytes(info, 0, 1, 16, dtype)})  # decode only
    p = P.plan(fp, P.inventory()[:n], n)
    print(p.line, flush=True)
    if not p.fits:
        sys.exit(f"error: {p.line}")
    placement = [(f"cuda:{g}", a, b) for g, a, b, _ in p.segments]
    t0 = time.time()
    model, _ = load_placed(mcfg, torch.device(placement[0][0]), dtype, placement=placement if n > 1 else None)
    load_s = time.time() - t0
    bw = {}
    for g, *_ in p.segments:   # each GPU's own copy rate (its events and streams: that GPU current)
        with torch.cuda.device(g):
            bw[g] = copy_bandwidth(torch.device(f"cuda:{g}"), Clock(torch.device(f"cuda:{g}")))
    weights_on = {g: 0 for g, *_ in p.segments}
    for dev, a, b in placement:
        g = int(dev.split(":")[1])
        weights_on[g] += sum(q.numel() * q.element_size() for i in range(a, b) for q in model.model.layers[i].parameters())
    first = int(placement[0][0].split(":")[1])
    weights_on[first] += sum(q.numel() * q.element_size() for m in (model.model.embed_tokens, model.model.norm, model.lm_head)
                             for q in m.parameters())
    elt = 2
    rows = []
    for context in args.contexts:
        for name in args.methods:
            cfg = method_cfg(name, None if name == "full" else args.budget, info)
            eng = split_engine(Engine(model, build(OmegaConf.create(cfg), info)), placement if n > 1 else None)
            eng.reset(1, context + args.steps + 8)
            fill(eng, context)
            tok = torch.zeros(1, dtype=torch.long, device=eng.device)
            for _ in range(2):
                eng.decode(tok)
            sync_all()
            t = time.perf_counter()
            for _ in range(args.steps):
                eng.decode(tok)
            sync_all()
            ms = 1e3 * (time.perf_counter() - t) / args.steps
            per_gpu = []
            for dev, a, b in placement:
                g = int(dev.split(":")[1])
                kv = sum(layer_rows(name, cfg, info, context, i) for i in range(a, b)) * 2 * info.head_dim * elt
                per_gpu.append({"gpu": g, "layers": [a, b], "weights_gb": weights_on[g] / 1e9, "kv_gb": kv / 1e9,
                                "bandwidth_gb_s": bw[g] / 1e9, "floor_ms": 1e3 * (weights_on[g] + kv) / bw[g]})
            floor = sum(x["floor_ms"] for x in per_gpu)
            row = {"context": context, "method": name, "devices": n, "tpot_ms": ms, "floor_ms": floor,
                   "over_floor": ms / floor, "graphs": eng.graphs is not None,
                   "peak_gib": [round(torch.cuda.max_memory_allocated(g) / GIB, 1) for g, *_ in p.segments],
                   "per_gpu": per_gpu, "semantics": {k: v for k, v in cfg.items() if k != "name"}}
            rows.append(row)
            print(f"{args.model} {context:>8} {name:>6} on {n} GPUs: {ms:8.2f} ms/token  floor {floor:7.2f}  "
                  f"x{ms / floor:4.2f}", flush=True)
            eng.close()
            del eng
            torch.cuda.empty_cache()
    env = environment()
    out = {"bench": "multigpu", **provenance("bench.multigpu", argv), "model": args.model, "weights": "random",
           "dtype": str(dtype), "devices": n, "device": env.get("gpu", "cuda"), "plan": p.line,
           "load_s": load_s, "steps": args.steps, "cache": "random values at the context length (no prefill)",
           "environment": env, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
