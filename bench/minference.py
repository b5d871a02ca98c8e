"""MInference prefill latency, one attention layer (the Cascading KV Cache paper's Tables 6 and 8 set
MInference's prefill latency beside theirs), one JSON recording its command and commit
(bench.engine.provenance):

    python -m bench.minference --model llama31_8b --out results/bench/minference_layer_h100.json

Per prompt length, on random bf16 q/k/v of the model's attention shape (Llama-3.1-8B: 32 query heads,
8 KV heads, head dim 128) with the model's rotary embedding, one prefill of the whole prompt:

  minference  the method's kernel path (methods/minference.py `kernel_prefill`): rope, the index
              estimation (torch, one head at a time, as the reference's minference_prefill_kernel
              times it), the block/column lists (kernels/block_sparse_prefill.py) and the sparse kernel, with
              the reference's fallback pattern for every head (vertical_slash 1000/6096); also each
              part alone (estimate_s, index_s, kernel_s) and the fraction of causal pairs attended;
  dense       rope + causal SDPA (flash), as bench.cascade's `layer` suite times it.

Two vertical-slash indexes per length (`--index`, row `index_mode`; default both):

  estimated  the index estimated from the random q/k, as the method does: random q/k have no attention
             structure, so the chosen diagonals scatter over the whole range instead of clustering near
             the main diagonal, each costs its own 64-key range per query block and the layer attends
             nearly every causal pair (row `density`): the kernel's WORST case;
  nearest    the pattern's sizes given to the NEAREST diagonals (offsets 0 .. S-1) and the FIRST V
             columns, the structured case a trained model's index approximates (its top slashes near the
             main diagonal, its top verticals near the start): merged into whole 64-key pieces, the
             kernel's BEST case. The estimation still runs (its cost does not depend on the data) and is
             timed in `seconds` and `estimate_s`, then replaced, so the totals of both modes compare.

`--tune` times the kernel alone (both indexes, one length, `--tune-length`) under each launch config
(kernels/block_sparse_prefill_triton.CONFIG: num_warps 4/8 x num_stages 1/2/3 x pair off/on), prints a table and
writes it under the JSON's `tune` key instead of the rows; `--kernel-config` then runs the rows under
the chosen config (recorded in `settings`). Lengths that do not fit
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
from kernels import block_sparse_prefill as KM
from methods.minference import kernel_prefill
from methods.parts import minference_patterns as P
from runners import models
from runners.results import environment

LONG = 131072    # above this, one timed run per point (a 1M-token dense prefill is tens of seconds)
MODES = ("estimated", "nearest")
TUNE = [{"num_warps": w, "num_stages": s, "pair": p} for w in (4, 8) for s in (1, 2, 3) for p in (False, True)]


def random_qkv(info, L: int, device, dtype):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, info.num_heads, L, info.head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(1, info.num_kv_heads, L, info.head_dim, device=device, dtype=dtype, generator=g)
    return q, k, torch.randn_like(k)


def nearest_index(heads, index, L: int, c: P.Consts):
    """`index` with each vertical_slash head's (columns, offsets) replaced by the first V columns and the
    nearest S diagonals, V and S clamped as minference_patterns.vertical_slash_index clamps them (same
    format: int64 [B, v], [B, s]); the other kinds keep their estimated index."""
    out = []
    for p, ix in zip(heads, index):
        if p.kind == "vertical_slash":
            B, dev = ix[0].shape[0], ix[0].device
            v, s = min(L, max(p.a, c.min_vertical)), min(L, max(p.b, c.min_slash))
            ix = tuple(torch.arange(n, device=dev)[None].expand(B, -1) for n in (v, s))
        out.append(ix)
    return out


def minference_layer(info, rope, L: int, pattern: P.Pattern, device, dtype, repeat: int,
                     mode: str = "estimated") -> dict:
    """Seconds of the whole sparse prefill, of each part alone, and the density it attended."""
    t = dict(zip("qkv", random_qkv(info, L, device, dtype)))
    pos = torch.arange(L, device=device)
    heads, c, scale, g = [pattern] * info.num_heads, P.Consts(), info.scaling, info.num_heads // info.num_kv_heads
    clock, state = Clock(device), {}
    pick = (lambda ix: nearest_index(heads, ix, L, c)) if mode == "nearest" else (lambda ix: ix)

    def whole():
        state.clear()                      # the last run's output and lists go first (tens of GB at 1M tokens)
        rope.new_step()
        qr, kr = rope.apply(t["q"], pos), rope.apply(t["k"], pos)
        if mode == "estimated":            # the method's own path
            state["out"], state["density"] = kernel_prefill(qr, kr, t["v"], pos, 0, heads, c, scale)
            return
        index = pick([P.head_index(p, qr[:, h], kr[:, h // g], pos, c, scale) for h, p in enumerate(heads)])
        idx = KM.build_index(heads, index, 0, L, L, 1, c.block, device)
        state["out"], pairs = KM.mixed_sparse_attention(qr, kr, t["v"], idx, scale, count=True)
        state["density"] = pairs.sum(dtype=torch.int64).double() / (info.num_heads * L * (L + 1) // 2)

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
        state["idx"] = KM.build_index(heads, pick(state["index"]), 0, L, L, 1, c.block, device)

    parts = {"estimate_s": clock(estimate, repeat), "index_s": clock(build, repeat)}
    parts["kernel_s"] = clock(lambda: KM.mixed_sparse_attention(qr, kr, v, state["idx"], scale, count=True), repeat)
    idx = state["idx"]
    lists = {"blocks_per_query_block_max": int(idx.block_count.max()),
             "unmasked_blocks_fraction": float(idx.block_free.sum() / idx.block_count.sum().clamp(min=1)),
             "columns_per_query_block_max": int(idx.column_count.max())}
    return {"seconds": seconds, **parts, "density": density, **lists}


def tune(args, device, dtype) -> list[dict]:
    """Kernel seconds per launch config (TUNE) and index mode at one length; a table on stdout."""
    info, rope = layer_setup(args.model, device, dtype)
    pattern = P.parse_one(args.pattern, args.pattern)
    L = args.tune_length or (65536 if device.type == "cuda" else 512)
    heads, c, scale, g = [pattern] * info.num_heads, P.Consts(), info.scaling, info.num_heads // info.num_kv_heads
    q, k, v = random_qkv(info, L, device, dtype)
    pos = torch.arange(L, device=device)
    q, k = rope.apply(q, pos), rope.apply(k, pos)
    est = [P.head_index(p, q[:, h], k[:, h // g], pos, c, scale) for h, p in enumerate(heads)]
    clock, table = Clock(device), []
    if kernels.backend_for(q) != "triton":
        print("torch reference backend: the configs do not apply (a smoke run of the script)", flush=True)
    for mode in args.index:
        idx = KM.build_index(heads, nearest_index(heads, est, L, c) if mode == "nearest" else est, 0, L, L, 1,
                             c.block, device)
        for cfg in TUNE:
            row = {"length": L, "index_mode": mode, **cfg}
            fn = lambda cfg=cfg, idx=idx: KM.mixed_sparse_attention(q, k, v, idx, scale, count=True, config=cfg)
            try:
                fn()                                           # compiles this config
                row["kernel_s"] = clock(fn, args.repeat)
            except Exception as e:  # noqa: BLE001  (a config the device cannot compile or run: shared memory)
                row.update({"kernel_s": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            table.append(row)
            print(row, flush=True)
    print(f"\n{'index':10} {'warps':>5} {'stages':>6} {'pair':>5} {'kernel_s':>9}")
    for r in sorted(table, key=lambda r: (r["index_mode"], r["kernel_s"] is None, r["kernel_s"] or 0)):
        ks = "failed" if r["kernel_s"] is None else f"{r['kernel_s']:.4f}"
        print(f"{r['index_mode']:10} {r['num_warps']:>5} {r['num_stages']:>6} {r['pair']!s:>5} {ks:>9}")
    return table


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
    for mode in args.index:
        minference_layer(info, rope, L0, pattern, device, dtype, 1, mode)
    dense_layer(info, rope, L0, device, dtype)
    rows = []
    for L in args.contexts:
        repeat = args.repeat if L <= LONG else 1
        base = {"length": L, "repeat": repeat}
        for mode in args.index:
            rows.append(attempt(lambda L=L, r=repeat, m=mode: minference_layer(info, rope, L, pattern, device, dtype,
                                                                               r, m),
                                {"method": "minference", "pattern": pattern.text(), "index_mode": mode, **base}))
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
    ap.add_argument("--index", nargs="+", choices=MODES, default=list(MODES),
                    help="vertical-slash index: estimated (from the random q/k) and/or nearest (default both)")
    ap.add_argument("--tune", action="store_true", help="time the kernel alone per launch config instead")
    ap.add_argument("--tune-length", type=int, default=None, help="--tune's length (65536 on CUDA, 512 otherwise)")
    ap.add_argument("--kernel-config", type=json.loads, default=None,
                    help='JSON overriding kernels/block_sparse_prefill_triton.CONFIG for this run (the method\'s path too), '
                         'e.g. \'{"num_warps": 4, "num_stages": 3, "pair": true}\'')
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    q = torch.empty(0, device=device)
    if args.kernel_config:
        from kernels import block_sparse_prefill_triton as minference_triton

        assert set(args.kernel_config) <= set(minference_triton.CONFIG), args.kernel_config
        minference_triton.CONFIG.update(args.kernel_config)
    with torch.inference_mode():
        result = {"tune": tune(args, device, dtype)} if args.tune else {"rows": run(args, device, dtype)}
    out = {**provenance("bench.minference", argv), "device": environment().get("gpu") or str(device),
           "model": args.model, "dtype": str(dtype), "suite": "tune" if args.tune else "layer",
           "backend": kernels.backend_for(q), **result,
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
