"""MInference + Cascade latency, one attention layer: the Cascading KV Cache paper's Table 8 row
"MInference + Cascade" (appendix C.2: MInference as the leading chunk, a 100K stride), one JSON recording its
command and commit (bench.engine.provenance):

    python -m bench.minference_cascade --model llama31_8b --out results/bench/minference_cascade_layer_h100.json

Per length (16K .. 1M), as bench/cascade.py's `layer` suite times Cascade (its `stream_layer`): the method
object itself (methods/minference_cascade.py) streams random q/k/v of the model's attention shape (Llama-3.1-8B:
32 query heads, 8 KV heads, head dim 128; bf16 on CUDA) with the model's rotary embedding through one layer,
in chunks of `--stride` (100000, the paper's) into a cache of `--cache` (16384, as the Table 8 Cascade row)
+ `--sink` (64) sinks, 4 cascades: per chunk the host plan, rope, the chunk's index estimation (torch, one
head at a time), its block/column lists, the chunk kernels (output + EMA mass) and the cache update. Every
head's pattern is `--pattern` (vertical_slash:1000:6096, the reference's fallback, as bench/minference.py).

Index modes (`--index`, row `index_mode`), as bench/minference.py:
  estimated  the method's own path: on random q/k the chosen diagonals scatter and a chunk attends nearly
             all its causal pairs (row `chunk_density`): the worst case;
  nearest    the estimation runs (and is timed), then its index is replaced by the first V columns and
             the nearest S diagonals (bench.minference.nearest_index), a trained model's structure: the
             best case.

Times are CUDA-event seconds of one run per point, after one warm-up per mode over two chunks (every kernel
compiled, evictions included). Lengths that do not fit are rows with `seconds: null` and the reason.
`--device cpu` with tiny lengths is a smoke run (torch reference backend): it checks the script, it
measures nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import kernels
from bench.cascade import layer_setup, stream_layer
from bench.engine import provenance
from bench.minference import MODES, attempt, nearest_index
from methods.minference_cascade import MInferenceCascade, MInferenceCascadeConfig
from methods.parts import minference_patterns as P
from runners import models
from runners.results import environment


class NearestIndex(MInferenceCascade):
    """The method with each chunk's estimated vertical-slash index replaced by the nearest one (not registered:
    a benchmark mode, not a method)."""

    def _adjust_index(self, heads, index, T):
        return nearest_index(heads, index, T, self._consts)


def method_for(args, info, mode: str):
    cfg = MInferenceCascadeConfig.parse({"sink": args.sink, "cache_size": args.cache, "cascades": args.cascades,
                                         "stride": args.stride, "patterns": f"all:{args.pattern}"}, info)
    return (NearestIndex if mode == "nearest" else MInferenceCascade)(cfg)


def run(args, device, dtype) -> list[dict]:
    info, rope = layer_setup(args.model, device, dtype)
    pattern = P.parse_one(args.pattern, args.pattern)
    rows = []
    for mode in args.index:
        m = method_for(args, info, mode)
        # warm-up over two chunks: the second has a cache (its mass kernel) and evicts (the update kernel)
        stream_layer(m, info, rope, min(max(args.lengths), 2 * args.stride), args.stride, device, dtype)
        for L in args.lengths:
            def one(L=L, m=m):
                seconds = stream_layer(m, info, rope, L, args.stride, device, dtype)
                st = m.stats()
                return {"seconds": seconds, "chunk_density": st.get("chunk_density_mean"),
                        "chunks": -(-L // args.stride)}
            rows.append(attempt(one, {"suite": "layer", "method": "minference_cascade", "index_mode": mode,
                                      "pattern": pattern.text(), "length": L, "cache": args.cache, "sink": args.sink,
                                      "cascades": args.cascades, "stride": args.stride}))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama31_8b", help="conf/model/<name>.yaml: shapes (and rope)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1 << i for i in range(14, 21)])
    ap.add_argument("--cache", type=int, default=16384, help="cascade slots |C| (Table 8: 16K)")
    ap.add_argument("--sink", type=int, default=64, help="sinks on top of the cache (bench/cascade.py's 64)")
    ap.add_argument("--cascades", type=int, default=4)
    ap.add_argument("--stride", type=int, default=100000, help="prefill stride (the paper's 100K)")
    ap.add_argument("--pattern", default=":".join(map(str, P.REFERENCE_DEFAULT)),
                    help="every head's pattern (default: the reference's fallback, vertical_slash:1000:6096)")
    ap.add_argument("--index", nargs="+", choices=MODES, default=list(MODES),
                    help="vertical-slash index: estimated (from the random q/k) and/or nearest (default both)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    with torch.inference_mode():
        rows = run(args, device, dtype)
    out = {**provenance("bench.minference_cascade", argv), "device": environment().get("gpu") or str(device),
           "model": args.model, "dtype": str(dtype), "suite": "layer",
           "backend": kernels.backend_for(torch.empty(0, device=device)), "rows": rows,
           "settings": {k: v for k, v in vars(args).items() if k != "out"}}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    else:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
