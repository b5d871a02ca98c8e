"""q.k of every decode query head against its KV head's first n cluster centroids, in one launch
(Tactic's cluster scores; issue 33).

`selection_attention` gave these scores before, as a by-product of a full attention over the centroids
(their values read, partial outputs, a split combine: four launches and a read of V whose output was
discarded). Here only the scores: a program per (sequence, KV head, block of centroids) takes the
group's queries against the block with the same `tl.dot` (same operand types and precision) as the
attention kernel's score pass, so the scores are the ones it wrote. The torch path is that attention's
reference (what Tactic ran on the CPU before). Tested in tests/test_kernels_centroid_scores.py.
"""
from __future__ import annotations

import torch

from . import attention
from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton

if HAVE_TRITON:

    @triton.jit
    def _scores_kernel(Q, K, Out, n, s_qb, s_qh, s_kb, s_kh, s_kn, s_ob, s_oh, H,
                       G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                       PREC: tl.constexpr, UPCAST: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = pid % H
        rows = tl.arange(0, G_PAD)
        rmask = rows < G
        dd = tl.arange(0, D)
        # rows beyond G are zero queries: tl.dot needs M >= 16 (as the attention kernel pads them)
        q = tl.load(Q + b * s_qb + (h * G + rows)[:, None] * s_qh + dd[None, :], mask=rmask[:, None], other=0.0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        cmask = offs < n
        k = tl.load(K + b * s_kb + h * s_kh + offs[:, None] * s_kn + dd[None, :], mask=cmask[:, None], other=0.0)
        if UPCAST:  # Triton 3.6's interpreter computes bf16 tl.dot wrongly (the attention kernel does the same)
            q = q.to(tl.float32)
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC)
        tl.store(Out + b * s_ob + (h * G + rows)[:, None] * s_oh + offs[None, :], qk,
                 mask=rmask[:, None] & cmask[None, :])


def cluster_scores_ref(q, cent, n: int, scale: float) -> torch.Tensor:
    lengths = torch.full((q.shape[0],), n, dtype=torch.int32, device=q.device)
    return attention.selection_attention(q, cent, cent, lengths, scale, max_length=n)[1]


def cluster_scores(q: torch.Tensor, cent: torch.Tensor, n: int, scale: float) -> torch.Tensor:
    """Unscaled q.c, fp32 [B, Hq, n], for the decode queries q [B, Hq, D] against the first n (host int)
    centroids cent [B, Hkv, >= n, D] of each query head's KV head: `selection_attention(q, cent, cent,
    n, scale, max_length=n)`'s scores without its attention (scale: the reference path's argument)."""
    if backend_for(q) == "torch":
        return cluster_scores_ref(q, cent, n, scale)
    B, Hq, D = q.shape
    Hkv = cent.shape[1]
    G = Hq // Hkv
    assert q.stride(-1) == 1 and cent.stride(-1) == 1 and D == next_pow2(D) and D >= 16
    out = torch.empty(B, Hq, n, device=q.device, dtype=torch.float32)
    block = 64 if q.is_cuda else 32
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    kernel_for(_scores_kernel, q)[(B * Hkv, max(1, -(-n // block)))](
        q, cent, out, n, q.stride(0), q.stride(1), cent.stride(0), cent.stride(1), cent.stride(2),
        out.stride(0), out.stride(1), Hkv, G=G, G_PAD=max(16, next_pow2(G)), D=D, BLOCK=block, PREC=prec,
        UPCAST=upcast, num_warps=4)
    return out
