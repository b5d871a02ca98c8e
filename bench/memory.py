"""Engine memory: what issue 8 found running out of memory, measured.

  1. Engines built one after another in one process, each dropped by reference only (no close(), no
     gc.collect()): full, then tidal, then quest at a long context. Before the kit, the engine and its
     CUDA-graph wrapper formed a reference cycle, so the third ran out of memory on an 80 GB H100 at
     128K; now each engine's KV cache goes back when it is dropped.
  2. One long batched prefill in a single chunk (e.g. 8 x 32K tokens): the MLP intermediate of all
     tokens at once was 14 GiB; the engine now runs the MLP in row chunks.

    python -m bench.memory --model llama3 --weights random --context 131072 --batch-prefill 8 32768 --out results/bench/memory_llama3_h100.json

Writes JSON: per stage, allocated and peak GiB, the KV-cache GiB it needs, and whether it fit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import load_bench_model, provenance
from methods import build
from runners.engine import Engine

GIB = 2 ** 30


def _kv_gib(info, batch, tokens, dtype) -> float:
    return 2 * info.num_layers * batch * info.num_kv_heads * tokens * info.head_dim * torch.finfo(dtype).bits / 8 / GIB


def _stage(name, fn) -> dict:
    torch.cuda.reset_peak_memory_stats()
    row = {"stage": name}
    try:
        fn(row)
        row["fit"] = True
    except torch.cuda.OutOfMemoryError as e:
        row["fit"], row["error"] = False, str(e).splitlines()[0][:200]
    row["allocated_gib"] = round(torch.cuda.memory_allocated() / GIB, 2)
    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--methods", nargs="+", default=["full", "tidal", "quest"])
    ap.add_argument("--batch-prefill", type=int, nargs=2, default=[8, 32768], metavar=("BATCH", "TOKENS"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: bench.memory measures CUDA memory; run it on a GPU machine")
    model, info, dev, dtype = load_bench_model(args.model, args.weights)
    rows = [{"stage": "weights", "allocated_gib": round(torch.cuda.memory_allocated() / GIB, 2)}]
    ids = torch.randint(0, info.vocab_size or 1000, (1, args.context), device=dev)

    def engine_run(name):
        def run(row):
            eng = Engine(model, build(OmegaConf.create({"name": name}), info))
            eng.reset(1, args.context + 8)
            eng.prefill(ids)
            for _ in range(4):
                eng.decode(ids[:, -1])
            torch.cuda.synchronize()
            row["kv_gib"] = round(_kv_gib(info, 1, args.context + 8, dtype), 2)
            # `eng` is dropped here by reference only: what is still allocated afterwards leaked
        return run

    for name in args.methods:
        rows.append(_stage(f"engine {name} at {args.context} (dropped, no close)", engine_run(name)))
    B, T = args.batch_prefill

    def prefill(row):
        big = torch.randint(0, info.vocab_size or 1000, (B, T), device=dev)
        eng = Engine(model, build(OmegaConf.create({"name": "full"}), info))
        eng.reset(B, T)
        eng.prefill(big, logits="none")
        torch.cuda.synchronize()
        row["kv_gib"] = round(_kv_gib(info, B, T, dtype), 2)
        eng.close()

    rows.append(_stage(f"prefill {B} x {T} in one chunk", prefill))
    out = {"bench": "memory", "model": args.model, "weights": args.weights, "dtype": str(dtype),
           "device": torch.cuda.get_device_name(0), "total_gib": round(torch.cuda.get_device_properties(0).total_memory / GIB, 1),
           **provenance("bench.memory", sys.argv[1:] if argv is None else argv), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
