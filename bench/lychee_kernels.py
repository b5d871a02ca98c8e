"""LycheeDecode kernel benchmark (lychee.fig4 shape), GPU: the hybrid-head decode kernel vs SDPA
flash decode (the FlashAttention-2 baseline of the paper) at the Llama-3-8B shape (Hq 32, Hkv 8,
D 128, bf16), 16K-128K, batch 1-8, 4/8..8/8 sparse KV heads, 90% sparsity on the sparse heads
(10% of the 64-slot blocks selected), plus each case's HBM floor (K/V bytes it must read / the
measured copy bandwidth); and the selection ops: retrieval scores (pooled and per token) and the
top-k kernel vs torch.topk + sort.

    python -m bench.lychee_kernels --out results/bench/lychee_kernels_h100.json [--quick]

No hydra/omegaconf here: it runs on the bare device image.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bench.kernel_ops import bench, tbs
from bench.kernel_ops import provenance as _kernel_ops_provenance
from kernels import hybrid as H, topk as T
from kernels.attention import topk_positions as torch_topk

HQ, HKV, D, EB = 32, 8, 128, 2
BLOCK = 64


def provenance(argv) -> dict:
    out = _kernel_ops_provenance(argv)
    out["command"] = out["command"].replace("bench.kernel_ops", "bench.lychee_kernels", 1)
    return out


def copy_tbs() -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda i: y.copy_(x), 1, graph=False)
    return tbs(2 * x.numel(), ms)


def inputs(B, S, n_sets):
    g = torch.Generator(device="cuda").manual_seed(S + B)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(B, HQ, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, HKV, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, HKV, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
        sets.append((q, k, v))
    return sets


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sparse-heads", type=int, nargs="+", default=[4, 5, 6, 7, 8])
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--topk", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="128K and 16K, batch 1 and 8 only")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if args.quick:
        args.contexts, args.batches = [16384, 131072], [1, 8]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    peak = copy_tbs()
    rows = []
    for S in args.contexts:
        for B in args.batches:
            one = 2 * B * HKV * S * D * EB
            sets = inputs(B, S, max(2, min(4, -(-256_000_000 // one))))
            lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")

            def sdpa(i):
                q, k, v = sets[i]
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)

            sdpa_ms = bench(sdpa, len(sets))
            n_blocks = S // BLOCK
            sel = max(1, round((1 - args.sparsity) * n_blocks))
            g = torch.Generator(device="cuda").manual_seed(1)
            index = torch.stack([torch.randperm(n_blocks, device="cuda", generator=g)[:sel].sort().values
                                 for _ in range(B * HKV)]).view(B, HKV, sel).int()
            counts = torch.full((B, HKV), sel, dtype=torch.int32, device="cuda")
            for n_sparse in args.sparse_heads:
                roles = tuple(h < HKV - n_sparse for h in range(HKV))
                ret = torch.tensor(roles, device="cuda")

                def hybrid(i):
                    q, k, v = sets[i]
                    return H.hybrid_decode(q, k, v, lengths, ret, index, counts, D ** -0.5, max_length=S, page=BLOCK,
                                           roles=roles)

                ms = bench(hybrid, len(sets))
                rows_read = (HKV - n_sparse) * S + n_sparse * sel * BLOCK
                nbytes = 2 * B * rows_read * D * EB
                floor = nbytes / (peak * 1e12) * 1e3
                rows.append({"op": "hybrid", "context": S, "batch": B, "sparse_heads": n_sparse,
                             "sparsity": args.sparsity, "block": BLOCK, "ms": ms, "sdpa_ms": sdpa_ms,
                             "speedup_vs_sdpa": sdpa_ms / ms, "floor_ms": floor, "over_floor": ms / floor,
                             "tbs": tbs(nbytes, ms)})
                print(f"hybrid S={S:>6} B={B} sparse={n_sparse}/8  {ms:.3f} ms  sdpa {sdpa_ms:.3f}  "
                      f"x{sdpa_ms / ms:.2f}  floor x{ms / floor:.2f}", flush=True)
            # selection ops of one layer with one retrieval KV head per sequence (the common case)
            heads = torch.tensor([0], device="cuda")
            for pool in (1, BLOCK):
                ms = bench(lambda i: H.retrieval_scores(sets[i][0], sets[i][1], lengths, heads, max_length=S,
                                                        block=pool), len(sets))
                nbytes = B * S * D * EB
                rows.append({"op": f"scores_pool{pool}", "context": S, "batch": B, "ms": ms, "tbs": tbs(nbytes, ms),
                             "over_floor": ms / (nbytes / (peak * 1e12) * 1e3)})
            for rows_h in (1, HKV, HQ):  # lychee (one set per retrieval head / all KV heads), tidal (per query head)
                sc = torch.randn(B, rows_h, S, device="cuda")
                k = min(args.topk, S)
                t_ms = bench(lambda i: T.topk_positions(sc, lengths, k, impl="radix"), 1)  # the kernel itself
                r_ms = bench(lambda i: torch_topk(sc, lengths, k), 1)
                rows.append({"op": "topk", "context": S, "batch": B, "rows_per_seq": rows_h, "k": k, "ms": t_ms,
                             "torch_ms": r_ms, "speedup_vs_torch": r_ms / t_ms})
                print(f"topk   S={S:>6} B={B} rows={rows_h}  {t_ms:.3f} ms  torch {r_ms:.3f}", flush=True)
            del sets
            torch.cuda.empty_cache()
    out = {"bench": "lychee_kernels", **provenance(argv), "device": torch.cuda.get_device_properties(0).name,
           "copy_tbs": peak, "shape": {"hq": HQ, "hkv": HKV, "d": D, "dtype": "bfloat16"}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
