"""Tactic's costs beside full attention, Quest and TidalDecode: prefill, the k-means clustering after
it (the paper: a small fraction of the prefill), and decode ms/token, on one model shape.

    python -m bench.tactic --model llama31_8b --layers 4 --context 32768 --out results/bench/tactic_h100.json

Random weights of the model's real layer shape, cut to --layers decoder layers (prefill, clustering
and decode all scale with the layer count, so cluster/prefill is the whole model's ratio; the
embedding and LM head are a fixed extra per token in decode ms). Random weights give flat attention,
so Tactic's fit mode would select most of the context: decode speed is measured at fixed budgets
(Tactic mode=topk, Quest, TidalDecode at --budget; the fit mode is timed too, with the tokens it
attended recorded). Clustering time is Tactic's own record (CUDA-synchronised wall time of every
layer's k-means, `clustering` in its stats), taken on the first decode step after a prefill: the
median of --repeat such cycles (each listed in cluster_s_runs), after one untimed prefill + decode has
warmed its kernels up.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import CONF, Clock, provenance, release
from methods import ModelInfo, build
from runners import models
from runners.engine import Engine
from runners.results import environment


def load(name: str, layers: int | None, device, dtype):
    mcfg = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    mcfg.weights = "random"
    if layers:
        mcfg.arch.num_hidden_layers = int(layers)
    model, _ = models.load(mcfg, device, dtype)
    return model, ModelInfo.from_hf_config(model.config)


def configs(budget: int, target: float, cluster_size: int, info: ModelInfo) -> dict[str, dict]:
    from methods import REGISTRY

    tidal = {"name": "tidal", "budget": budget}
    layer = REGISTRY.get("tidal").Config.defaults().get("reselect_layer")
    if layer is not None:   # the paper's layer is for 32 layers: keep it inside a cut model (as bench.tpot)
        tidal["reselect_layer"] = min(int(layer), info.num_layers - 1)
    return {"full": {"name": "full"},
            f"tactic_topk{budget}": {"name": "tactic", "mode": "topk", "budget": budget, "cluster_size": cluster_size},
            f"tactic_fit{target:g}": {"name": "tactic", "target": target, "cluster_size": cluster_size},
            f"quest{budget}": {"name": "quest", "budget": budget, "page_size": cluster_size},
            f"tidal{budget}": tidal}


def measure(model, info, cfg: dict, ids, steps: int, clock, repeat: int) -> dict:
    eng = Engine(model, build(OmegaConf.create(cfg), info))
    B, L = ids.shape
    tok = ids[:, -1]

    def prefill():
        eng.reset(B, L + steps + 8)
        eng.prefill(ids)

    prefill()                                  # warm-up (kernel selection, allocator)
    if cfg["name"] == "tactic":                # and of the clustering (first launches compile): the first
        eng.decode(tok)                        # Tactic config's record had included it (0.158 s against 0.058)
    prefill_s = clock(prefill, repeat)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    cluster_runs = []
    # Tactic clusters once per prefill: `repeat` prefill + first-decode cycles give the median of its
    # clustering time (one cycle's record moved by ~2x between two H100 machines)
    for _ in range(repeat if cfg["name"] == "tactic" else 1):
        prefill()
        sync()
        t = time.perf_counter()
        eng.decode(tok)                        # Tactic clusters here (and captures its graph)
        sync()
        first_s = time.perf_counter() - t
        if cfg["name"] == "tactic":
            cluster_runs.append(sum(e["seconds"] for e in eng.method.stats().get("clustering") or []))
    eng.decode(tok)

    def decode():
        for _ in range(steps):
            eng.decode(tok)

    decode_ms = 1e3 * clock(decode, 1) / steps
    stats = eng.method.stats()
    out = {"config": cfg, "prefill_s": prefill_s, "first_decode_s": first_s, "decode_ms_per_token": decode_ms}
    if cfg["name"] == "tactic":
        events = stats.get("clustering") or []
        out["cluster_s"] = statistics.median(cluster_runs)
        out["cluster_s_runs"] = cluster_runs
        out["cluster_iterations_max"] = max((e["iterations_max"] for e in events), default=0)
        out["cluster_over_prefill"] = out["cluster_s"] / prefill_s
        out["attended_mean"] = (stats.get("sample_metrics") or {}).get("attended")
    release(eng)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama31_8b")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers kept (null = all)")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--cluster-size", type=int, default=32)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype("auto", device)
    model, info = load(args.model, args.layers, device, dtype)
    clock = Clock(device)
    ids = torch.randint(0, int(model.config.vocab_size), (1, args.context),
                        generator=torch.Generator().manual_seed(0)).to(device)
    results = {}
    for name, cfg in configs(args.budget, args.target, args.cluster_size, info).items():
        results[name] = measure(model, info, cfg, ids, args.steps, clock, args.repeat)
        r = results[name]
        extra = (f"  cluster {r['cluster_s'] * 1e3:.1f} ms = {r['cluster_over_prefill']:.3f} x prefill, attended "
                 f"{r['attended_mean']:.0f}" if "cluster_s" in r else "")
        print(f"{name:>16}: prefill {r['prefill_s'] * 1e3:.1f} ms, decode {r['decode_ms_per_token']:.3f} ms/token{extra}")
    full = results["full"]["decode_ms_per_token"]
    for r in results.values():
        r["speedup_vs_full"] = full / r["decode_ms_per_token"]
    doc = {"bench": "tactic", "model": args.model, "layers": info.num_layers, "context": args.context,
           "steps": args.steps, "dtype": str(dtype), "results": results,
           "provenance": provenance("bench.tactic", sys.argv[1:] if argv is None else argv),
           "environment": environment()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
