"""MInference prefill latency, one attention layer (the Cascading KV Cache paper's Tables 6 and 8 set
MInference's prefill latency beside theirs), one JSON recording its command and commit
(bench.engine.provenance):

    python -m bench.minference --model llama31_8b --out results/bench/minference_layer_h100.json

Per prompt length, on random bf16 q/k/v of the model's attention shape (Llama-3.1-8B: 32 query heads,
8 KV heads, head dim 128) with the model's rotary embedding, one prefill of the whole prompt:

  minference  the method's kernel path (methods/minference.py `kernel_prefill`): rope, the index
              estimation (torch, one head at a time, as the reference's minference_prefill_kernel
              times it), the block/column lists (kernels/minference.py) and the sparse kernel, with
              the reference's fallback pattern for every head (vertical_slash 1000/6096); also each
              part alone (estimate_s, index_s, kernel_s) and the fraction of causal pairs attended;
  dense       rope + causal SDPA (flash), as bench.cascade's `layer` suite times it.

Random q/k have no attention structure: the chosen diagonals scatter over the whole range instead of
clustering near the main diagonal as in a trained model, so each costs its own 64-key range per query
block and MInference attends more here (row `density`) than on real prompts. Lengths that do not fit
the device are rows with `seconds: null` and the reason. Times are CUDA-event seconds (median of
`--repeat` runs up to 128K tokens, one run above). `--device cpu` is a smoke run (torch reference
backend, tiny lengths): it checks the script, it measures nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import kernels
from bench.cascade import dense_layer, layer_setup
from bench.engine import Clock, provenance
from kernels import minference as KM
from methods import minference_patterns as P
from methods.minference import kernel_prefill
from runners import models
from runners.results import environment

LONG = 131072    # above this, one timed run per point (a 1M-token dense prefill is tens of seconds)


def random_qkv(info, L: int, device, dtype):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, info.num_heads, L, info.head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(1, info.num_kv_heads, L, info.head_dim, device=device, dtype=dtype, generator=g)
    return q, k, torch.randn_like(k)


def minference_layer(info, rope, L: int, pattern: P.Pattern, device, dtype, repeat: int) -> dict:
    """Seconds of the whole sparse prefill, of each part alone, and the density it attended."""
    t = dict(zip("qkv", random_qkv(info, L, device, dtype)))
    pos = torch.arange(L, device=device)
    heads, c, scale, g = [pattern] * info.num_heads, P.Consts(), info.scaling, info.num_heads // info.num_kv_heads
    clock, state = Clock(device), {}

    def whole():
        state.clear()                      # the last run's output and lists go first (tens of GB at 1M tokens)
        rope.new_step()
        qr, kr = rope.apply(t["q"], pos), rope.apply(t["k"], pos)
        state["out"], state["density"] = kernel_prefill(qr, kr, t["v"], pos, 0, heads, c, scale)

    seconds = clock(whole, repeat)
    density = float(state.pop("density"))
    state.clear()
    rope.new_step()                        # the parts start from rotated q/k (the originals freed: 1M tokens)
    t["q"], t["k"] = rope.apply(t["q"], pos), rope.apply(t["k"], pos)
    qr, kr, v = t["q"], t["k"], t["v"]

    def estimate():
        state["index"] = [P.head_index(p, qr[:, h], kr[:, h // g], pos, c, scale) for h, p in enumerate(heads)]

    def build():
        state.pop("idx", None)
        state["idx"] = KM.build_index(heads, state["index"], 0, L, L, 1, c.block, device)

    parts = {"estimate_s": clock(estimate, repeat), "index_s": clock(build, repeat)}
    parts["kernel_s"] = clock(lambda: KM.mixed_sparse_attention(qr, kr, v, state["idx"], scale, count=True), repeat)
    idx = state["idx"]
    lists = {"blocks_per_query_block_max": int(idx.block_count.max()),
             "columns_per_query_block_max": int(idx.column_count.max())}
    return {"seconds": seconds, **parts, "density": density, **lists}


def attempt(fn, row: dict) -> dict:
    """row + what fn returns, or row with seconds None and why (a length the device cannot hold)."""
    try:
        row.update(fn())
    except torch.cuda.OutOfMemoryError as e:
        row.update({"seconds": None, "skipped": f"out of memory: {str(e).splitlines()[0]}"})
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(row, flush=True)
    return row


def run(args, device, dtype) -> list[dict]:
    info, rope = layer_setup(args.model, device, dtype)
    pattern = P.parse_one(args.pattern, args.pattern)
    # warm-up at the smallest length: Triton compiles, the allocator and SDPA pick their paths
    L0 = min(args.contexts)
    minference_layer(info, rope, L0, pattern, device, dtype, 1)
    dense_layer(info, rope, L0, device, dtype)
    rows = []
    for L in args.contexts:
        repeat = args.repeat if L <= LONG else 1
        base = {"length": L, "repeat": repeat}
        rows.append(attempt(lambda L=L, r=repeat: minference_layer(info, rope, L, pattern, device, dtype, r),
                            {"method": "minference", "pattern": pattern.text(), **base}))
        rows.append(attempt(lambda L=L, r=repeat: {"seconds": statistics.median(
                            dense_layer(info, rope, L, device, dtype) for _ in range(r))}, {"method": "dense", **base}))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama31_8b", help="conf/model/<name>.yaml: shapes (and rope)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1 << i for i in range(14, 21)],
                    help="prompt lengths (default 16K .. 1M; those that do not fit are recorded as skipped)")
    ap.add_argument("--pattern", default=":".join(map(str, P.REFERENCE_DEFAULT)),
                    help="every head's pattern (default: the reference's fallback, vertical_slash:1000:6096)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per point up to 128K tokens (median)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    q = torch.empty(0, device=device)
    with torch.inference_mode():
        rows = run(args, device, dtype)
    out = {**provenance("bench.minference", argv), "device": environment().get("gpu") or str(device),
           "model": args.model, "dtype": str(dtype), "suite": "layer",
           "backend": kernels.backend_for(q), "rows": rows,
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
