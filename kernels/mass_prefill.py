"""Causal prefill attention and every key's attention mass (column sums of the softmax) together:
H2O's prefill (issue 34), whose rule needs the post-softmax attention each prompt key received summed
over all query rows.

Flash attention never holds a finished softmax row, so the column sums need a second pass: a row's
probabilities exp(s - lse) are known only once its log-sum-exp (lse) over every visible key is. So:

  pass 1  the attention output and each row's lse: on CUDA (bf16/fp16, T == L) the same flash kernel
          full attention runs (torch's `_scaled_dot_product_flash_attention`, which returns the lse);
          otherwise SDPA for the output and a Triton pass for the lse (QK^T only, causal key blocks only);
  pass 2  `_causal_mass_kernel`: one program per (batch, query head, block of keys) loads its keys
          once and walks only the query blocks at or below the diagonal, summing exp2(s - lse): a QK^T
          over the causal triangle with no PV product.

Cost bound (what H2O states in describe()): pass 1 is full attention's prefill kernel itself, pass 2
at most one more QK^T over the causal triangle (half the matmul FLOPs of attention, the same number of
exponentials), so the attention part costs at most 2x full's; with a prompt in several chunks (T < L)
the lse pass adds one more triangle QK^T (at most 3x). `kernels.attention_mass` (kernels/prefill.py)
walked the whole square in both passes (4 triangles' worth of QK^T).

Visibility is lower-right causal: query t of T sees keys 0 .. t + L - T (the eviction base's
[kept | chunk] candidates: the kept tokens visible to every row, the chunk causal).
q [B, Hq, T, D], k/v [B, Hkv, L, D] (GQA: query head h reads KV head h // (Hq // Hkv)).
-> (out [B, T, Hq * D] in q's dtype, mass [B, Hq, L] fp32).
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton
from .prefill import attention_mass_ref, prefill_attention

# pass 2's tiles: 128 keys a program (each query tile loaded is used against 128 keys), 64 queries a step
CONFIG = {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 3}


def causal_attention_mass_ref(q, k, v, scale):
    """Torch reference: SDPA's output and kernels.prefill's mass reference (lower-right causal)."""
    return prefill_attention(q, k, v, scale), attention_mass_ref(q, k, scale)


if HAVE_TRITON:

    @triton.jit
    def _causal_lse_kernel(Q, K, Lse, T, L, qk_scale, s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, HQ, G,
                           D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                           UPCAST: tl.constexpr):
        # One program per (batch x query head, block of BM queries): base-2 lse of each row over its
        # visible keys, key blocks past the block's last row skipped.
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = (pid % HQ).to(tl.int64)
        off = L - T
        mm = tl.program_id(1) * BM + tl.arange(0, BM)
        dd = tl.arange(0, D)
        mrow = mm < T
        q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full((BM,), -1e30, tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        hi = tl.minimum((tl.program_id(1) + 1) * BM + off, L)      # one past the block's last visible key
        for n0 in range(0, hi, BN):
            nn = n0 + tl.arange(0, BN)
            k = tl.load(K + b * s_kb + (h // G) * s_kh + nn[:, None] * s_kn + dd[None, :], mask=(nn < L)[:, None],
                        other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            s = tl.where((nn[None, :] <= mm[:, None] + off) & (nn[None, :] < L), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
            m_i = m_new
        lse = m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))
        tl.store(Lse + pid.to(tl.int64) * T + mm, lse, mask=mrow)

    @triton.jit
    def _causal_mass_kernel(Q, K, Lse, Out, T, L, qk_scale, s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, HQ, G,
                            D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                            UPCAST: tl.constexpr):
        # One program per (batch x query head, block of BN keys): sum over the rows that see them of
        # exp2(s - lse), the keys loaded once, query blocks above the diagonal skipped.
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = (pid % HQ).to(tl.int64)
        off = L - T
        nn = tl.program_id(1) * BN + tl.arange(0, BN)
        dd = tl.arange(0, D)
        ncol = nn < L
        k = tl.load(K + b * s_kb + (h // G) * s_kh + nn[:, None] * s_kn + dd[None, :], mask=ncol[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        acc = tl.zeros((BN,), tl.float32)
        first = tl.maximum(tl.program_id(1) * BN - off, 0) // BM * BM     # first query block that sees a key here
        for m0 in range(first, T, BM):
            mm = m0 + tl.arange(0, BM)
            mrow = mm < T
            q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            lse = tl.load(Lse + pid.to(tl.int64) * T + mm, mask=mrow, other=float("inf"))
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            vis = (nn[None, :] <= mm[:, None] + off) & mrow[:, None]
            acc += tl.sum(tl.where(vis, tl.exp2(s - lse[:, None]), 0.0), 0)
        tl.store(Out + pid.to(tl.int64) * L + nn, acc, mask=ncol)


_FLASH_GQA = {}   # device type -> whether torch's flash op took GQA-shaped k/v (else k/v are repeated)


def _flash_with_lse(q, k, v, scale):
    """(out [B, Hq, T, D], natural-log lse [B, Hq, T] fp32) from torch's flash kernel, or None where it cannot run
    (not CUDA, fp32, T != L: its causal mask is then not the lower-right one)."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or q.shape[2] != k.shape[2]:
        return None
    op = torch.ops.aten._scaled_dot_product_flash_attention
    g = q.shape[1] // k.shape[1]
    if g > 1 and not _FLASH_GQA.get("cuda", True):
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    try:
        res = op(q, k, v, 0.0, True, False, scale=scale)
        _FLASH_GQA.setdefault("cuda", True)
    except RuntimeError:
        if g == 1 or not _FLASH_GQA.setdefault("cuda", True):
            raise
        _FLASH_GQA["cuda"] = False   # this torch's flash op wants as many KV heads as query heads
        return _flash_with_lse(q, k, v, scale)
    return res[0], res[1][..., :q.shape[2]]


def causal_lse(q, k, scale, config=None):
    """Base-2 log-sum-exp [B, Hq, T] fp32 of each query row over its visible keys (Triton)."""
    cfg = {**CONFIG, **(config or {})}
    B, Hq, T, D = q.shape
    lse = torch.empty(B, Hq, T, device=q.device, dtype=torch.float32)
    bm = cfg["block_m"] if q.is_cuda else 16
    upcast = not q.is_cuda
    kernel_for(_causal_lse_kernel, q)[(B * Hq, triton.cdiv(T, bm))](
        q, k, lse, T, k.shape[2], scale * LOG2E, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), Hq, Hq // k.shape[1], D=D, BM=bm, BN=64 if q.is_cuda else 16,
        PREC="ieee" if (q.dtype == torch.float32 or upcast) else "tf32", UPCAST=upcast,
        **({"num_warps": 4} if q.is_cuda else {}))
    return lse


def causal_mass(q, k, lse2, scale, config=None):
    """Pass 2: column sums [B, Hq, L] fp32 of exp2(q.k * scale * log2 e - lse2) over the visible rows."""
    cfg = {**CONFIG, **(config or {})}
    B, Hq, T, D = q.shape
    L = k.shape[2]
    out = torch.empty(B, Hq, L, device=q.device, dtype=torch.float32)
    bm, bn = (cfg["block_m"], cfg["block_n"]) if q.is_cuda else (16, 16)
    upcast = not q.is_cuda
    launch = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]} if q.is_cuda else {}
    kernel_for(_causal_mass_kernel, q)[(B * Hq, triton.cdiv(L, bn))](
        q, k, lse2.contiguous(), out, T, L, scale * LOG2E, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), Hq, Hq // k.shape[1], D=D, BM=bm, BN=bn,
        PREC="ieee" if (q.dtype == torch.float32 or upcast) else "tf32", UPCAST=upcast, **launch)
    return out


def causal_attention_mass(q, k, v, scale, config=None):
    """Lower-right causal attention of q over k, v and each key's attention mass: (out [B, T, Hq * D],
    mass [B, Hq, L] fp32). Triton on CUDA (HARNESS_KERNELS forces), the torch reference elsewhere."""
    if backend_for(q) == "torch":
        return causal_attention_mass_ref(q, k, v, scale)
    B, Hq, T, D = q.shape
    assert D == next_pow2(D) and D >= 16 and q.stride(-1) == 1 and k.stride(-1) == 1
    flash = _flash_with_lse(q, k, v, scale)
    if flash is not None:
        o, lse = flash
        out, lse2 = o.transpose(1, 2).reshape(B, T, Hq * D), lse * LOG2E
    else:
        out, lse2 = prefill_attention(q, k, v, scale), causal_lse(q, k, scale, config)
    return out, causal_mass(q, k, lse2, scale, config)
