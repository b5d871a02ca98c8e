"""Decode with a bounded cache costs what the cache costs: per-token decode latency of bounded-cache
methods after reading a long context (default 1M tokens) beside full attention over a context the
size of their cache, same model, same run.

    python -m bench.bounded --model llama31_8b --weights random --caches 4096 16384 32768 \\
        --context 1048576 --methods h2o tova streaming_llm --out results/bench/bounded_llama31_8b_h100.json

How the long context is reached without prefilling it: a bounded method's decode step reads its
store, whose size is fixed, whatever came before. So each bounded method prefills `cache` random
tokens (its store then holds `cache` tokens: full, nothing evicted yet), then the engine's position
jumps to --context and `steps` tokens are decoded from there: positions >= context exercise the
long-context rotary path, each step evicts as in steady state. (The store's content is the prefill's,
not that of a 1M-token text: a latency measurement, not an accuracy one.) Full attention prefills
`cache` tokens and decodes at that length. Budgets: every method attends `cache` + 1 tokens per step
(full: cache + the current; h2o/tova: budget = cache, the incoming token on top; streaming_llm:
sink 4 + window cache - 4, the current on top; other methods: `budget` = cache).

The JSON records the one command (minus --out), the commit, the device, and per (method, cache) the
decode ms/token, full attention's at the same cache size, and their ratio (the issue's bar: <= 1.3).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import Clock, load_bench_model, provenance, release
from methods import REGISTRY, build
from runners.engine import Engine
from runners.results import environment


def method_cfg(name: str, cache: int) -> dict:
    cfg = {"name": name, **REGISTRY.get(name).Config.defaults()}
    if name == "streaming_llm":
        cfg.update(budget=cache, window=max(cache - cfg["sink"], 1), stride=None)
    elif "budget" in cfg:
        cfg["budget"] = cache
    else:
        raise SystemExit(f"error: method {name} has no budget option")
    return cfg


def decode_ms(model, info, cfg: dict, cache: int, context: int, steps: int, clock: Clock, graphs: bool,
              device) -> float:
    """Prefill `cache` random tokens, move to position `context`, time `steps` decode steps."""
    eng = Engine(model, build(OmegaConf.create(cfg), info), use_graphs=graphs)
    ids = torch.randint(0, info.vocab_size, (1, cache), generator=torch.Generator().manual_seed(0)).to(device)
    eng.reset(1, context + steps + 8)
    eng.prefill(ids)
    eng.seq_len = context                       # the jump (see the module docstring)
    tok = ids[:, -1]
    for _ in range(2):                          # warm-up: graph capture, allocator
        eng.decode(tok)

    def run():
        for _ in range(steps):
            eng.decode(tok)

    ms = 1e3 * clock(run, 1) / steps
    release(eng)
    return ms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama31_8b")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--caches", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--context", type=int, default=1 << 20, help="nominal context the bounded methods decode at")
    ap.add_argument("--methods", nargs="+", default=["h2o", "tova", "streaming_llm"])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--graphs", choices=["on", "off"], default="on")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)

    model, info, device, dtype = load_bench_model(args.model, args.weights)
    clock = Clock(device)
    graphs = args.graphs == "on"
    rows = []
    for cache in args.caches:
        full = decode_ms(model, info, {"name": "full", "prefill_chunk": None}, cache, cache, args.steps, clock,
                         graphs, device)
        print(f"cache {cache:>7}  full @ {cache:>7}: {full:8.3f} ms/token", flush=True)
        for name in args.methods:
            cfg = method_cfg(name, cache)
            ms = decode_ms(model, info, cfg, cache, args.context, args.steps, clock, graphs, device)
            rows.append({"method": name, "cache": cache, "context": args.context, "decode_ms": ms,
                         "full_decode_ms_at_cache": full, "ratio_to_full_at_cache": ms / full,
                         "within_1_3x": ms / full <= 1.3, "config": {k: v for k, v in cfg.items() if k != "name"}})
            print(f"cache {cache:>7}  {name:>13} @ {args.context:>7}: {ms:8.3f} ms/token  x{ms / full:5.2f}",
                  flush=True)
    env = environment()
    out = {"bench": "bounded_decode", **provenance("bench.bounded", argv), "model": args.model,
           "weights": args.weights, "dtype": str(dtype), "device": env.get("gpu", "cpu"), "graphs": args.graphs,
           "steps": args.steps, "method": "prefill `cache` tokens, jump to `context`, decode `steps` (see "
                                         "bench/bounded.py)", "environment": env, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.out}")
    else:
        print(json.dumps(out, indent=2)[:2000])
        print("(not written: pass --out FILE to keep the JSON)")


if __name__ == "__main__":
    main()
