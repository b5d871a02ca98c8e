"""Strided-prefill attention of the Cascading KV cache: a chunk of T queries over [cached keys ; the
chunk's own keys] (the last T of the L keys, lower-right causal), returning the attention output and,
per key, the EMA-weighted attention mass the chunk gave it.

    out  [B, T, Hq*D]  (q's dtype)
    mass [B, Hq, L]    fp32: sum over queries m of w[m] * softmax_m(key)

With w[m] = (1 - beta) * beta**(T-1-m) this is the reference's score accumulation (cascade/models/
flash_attention.py, `cascade_attn_eager`): the cached scores become beta**T * score + mass, and the
chunk's own keys enter the cache with their mass. The reference's Triton kernel accumulates it in one
pass with a running-normaliser approximation (p / (l_i + l_i * steps_left / steps_done)); ours is exact:
pass 1 is a flash-attention forward that also writes each query's log-sum-exp, pass 2 sums, per key
block, w[m] * exp2(s - lse[m]) over the queries that can see it (q.k recomputed, no [T, L] matrix).
The torch reference does both in one fp32 pass over query blocks; tests check it against the kit's
SDPA attention plus its blockwise attention mass.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton
from .prefill import REF_BLOCK_BYTES


def strided_attention_ref(q, k, v, scale, weights, block_bytes: int = REF_BLOCK_BYTES):
    """One pass over query blocks (fp32, memory-bounded): each block's probabilities give both its
    output rows and its share of the mass (the CPU path: q.k is computed once, not twice)."""
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kf, vf = k.float(), v.float()
    out = torch.empty(B, Hq, T, D, device=q.device, dtype=torch.float32)
    mass = torch.zeros(B, Hq, L, device=q.device, dtype=torch.float32)
    w = weights.to(device=q.device, dtype=torch.float32)
    block = max(1, block_bytes // max(1, B * Hq * L * 4))
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        qb = q[:, :, t0:t1].float().view(B, Hkv, g, t1 - t0, D)
        s = torch.einsum("bhgtd,bhld->bhgtl", qb, kf) * scale
        visible = torch.arange(L, device=q.device) <= torch.arange(L - T + t0, L - T + t1, device=q.device).view(-1, 1)
        p = torch.softmax(torch.where(visible, s, float("-inf")), -1)
        out[:, :, t0:t1] = torch.einsum("bhgtl,bhld->bhgtd", p, vf).reshape(B, Hq, t1 - t0, D)
        mass += torch.einsum("bhgtl,t->bhgl", p, w[t0:t1]).reshape(B, Hq, L)
    return out.to(q.dtype).transpose(1, 2).reshape(B, T, Hq * D), mass


if HAVE_TRITON:

    @triton.jit
    def _fwd_kernel(Q, K, V, Out, Lse, T, L, qk_scale,
                    s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_ot, HQ, G,
                    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = pid % HQ
        kvh = h // G
        mb = tl.program_id(1)
        mm = mb * BM + tl.arange(0, BM)
        dd = tl.arange(0, D)
        mrow = mm < T
        q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        qpos = L - T + mm                                     # a query sees keys 0..qpos
        m_i = tl.full((BM,), -1e30, tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        hi = tl.minimum(L, L - T + (mb + 1) * BM)
        kb = K + b * s_kb + kvh * s_kh
        vb = V + b * s_vb + kvh * s_vh
        for n0 in range(0, hi, BN):
            nn = n0 + tl.arange(0, BN)
            ncol = nn < L
            k = tl.load(kb + nn[:, None] * s_kn + dd[None, :], mask=ncol[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            s = tl.where((nn[None, :] <= qpos[:, None]) & ncol[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vv = tl.load(vb + nn[:, None] * s_vn + dd[None, :], mask=ncol[:, None], other=0.0)
            pv = p.to(vv.dtype)
            if UPCAST:
                pv = pv.to(tl.float32)
                vv = vv.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(pv, vv, input_precision=PREC)
            m_i = m_new
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(Out + b * s_ob + mm[:, None] * s_ot + h * D + dd[None, :], out.to(Out.dtype.element_ty),
                 mask=mrow[:, None])
        tl.store(Lse + pid.to(tl.int64) * T + mm, m_i + tl.log2(l_safe), mask=mrow)

    @triton.jit
    def _mass_kernel(Q, K, Lse, W, Out, T, L, qk_scale,
                     s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, HQ, G,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                     UPCAST: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = pid % HQ
        kvh = h // G
        nb = tl.program_id(1)
        nn = nb * BN + tl.arange(0, BN)
        dd = tl.arange(0, D)
        ncol = nn < L
        k = tl.load(K + b * s_kb + kvh * s_kh + nn[:, None] * s_kn + dd[None, :], mask=ncol[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        acc = tl.zeros((BN,), tl.float32)
        first = tl.maximum(nb * BN - (L - T), 0)             # the first query that sees this key block
        for m0 in range((first // BM) * BM, T, BM):
            mm = m0 + tl.arange(0, BM)
            mrow = mm < T
            q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            lse = tl.load(Lse + pid.to(tl.int64) * T + mm, mask=mrow, other=float("inf"))
            w = tl.load(W + mm, mask=mrow, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            vis = (nn[None, :] <= (L - T + mm)[:, None]) & mrow[:, None] & ncol[None, :]
            p = tl.where(vis, tl.exp2(s - lse[:, None]), 0.0) * w[:, None]
            acc += tl.sum(p, 0)
        tl.store(Out + pid.to(tl.int64) * L + nn, acc, mask=ncol)


def strided_attention(q, k, v, scale, weights, *, block_m=None, block_n=None):
    """q [B, Hq, T, D] over k, v [B, Hkv, L, D] (lower-right causal), weights [T] (per query) ->
    (out [B, T, Hq*D], mass [B, Hq, L] fp32). Keys and queries already rotated."""
    if backend_for(q) == "torch":
        return strided_attention_ref(q, k, v, scale, weights)
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    assert D == next_pow2(D) and D >= 16 and L >= T
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    dev = q.device
    bm = block_m or (64 if q.is_cuda else 16)
    bn = block_n or (64 if q.is_cuda else 16)
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    out = torch.empty(B, T, Hq * D, device=dev, dtype=q.dtype)
    lse = torch.empty(B, Hq, T, device=dev, dtype=torch.float32)
    common = dict(D=D, BM=bm, BN=bn, PREC=prec, UPCAST=upcast, num_warps=4)
    kernel_for(_fwd_kernel, q)[(B * Hq, triton.cdiv(T, bm))](
        q, k, v, out, lse, T, L, scale * LOG2E, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), Hq, Hq // Hkv, **common)
    mass = torch.empty(B, Hq, L, device=dev, dtype=torch.float32)
    w = weights.to(device=dev, dtype=torch.float32).contiguous()
    kernel_for(_mass_kernel, q)[(B * Hq, triton.cdiv(L, bn))](
        q, k, lse, w, mass, T, L, scale * LOG2E, q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2), Hq, Hq // Hkv, **common)
    return out, mass
