"""Multi-token (prefill, correction, strided-prefill) attention and the per-key attention mass that
scoring methods need (H2O, TOVA, SnapKV, Cascading's EMA, block scores).

Conventions: q [B, Hq, T, D], k/v [B, Hkv, L, D] (GQA: query head h reads KV head h // (Hq // Hkv)).
Visibility is by position: a query at position p sees the keys with position <= p. Without
positions the chunk is the last T of the L keys (lower-right causal). `k_pos` may hold a huge value
for slots no query may see (empty or evicted ring slots).

`attention_mass` returns, per query head, the attention probability each key received summed over
the queries (optionally weighted per query: Cascading's EMA weights): [B, Hq, L] fp32. It never
builds a [T, L] matrix: the torch reference works in query blocks sized to a memory bound, the
Triton version computes each query's log-sum-exp in one pass and the column sums in a second,
one key block per program.
"""
from __future__ import annotations

import torch
import torch.nn.attention
import torch.nn.functional as F

from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton

REF_BLOCK_BYTES = 1 << 28
SDPA_BACKENDS = [getattr(torch.nn.attention.SDPBackend, n) for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")]  # the torch reference's score block (256 MiB) bounds its memory


def prefill_attention(q, k, v, scale, q_pos=None, k_pos=None):
    """Causal attention of the T new queries over L keys -> [B, T, Hq*D] in q's dtype.

    Without positions the lower-right causal bias keeps SDPA on its fused (flash / memory-efficient)
    kernels on every device; an explicit [T, L] mask is built only when positions are given."""
    B, Hq, T, D = q.shape
    L = k.shape[2]
    mask = None
    if q_pos is None and k_pos is None:
        if T > 1:
            # imported here: torch.nn.attention.bias pulls in torch._dynamo (2-4 s per process)
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(T, L)
    else:
        mask = _visible(q_pos, k_pos, T, L, q.device)
        if mask.dim() == 3:  # per-sequence positions
            mask = mask.unsqueeze(1)
    if q.is_cuda and mask is not None and q_pos is None and k_pos is None:
        # causal: flash, not cuDNN's fused attention, which torch may prefer on Hopper and which failed
        # with an illegal memory access in bench.cascade's dense layer prefill on the H100 (torch 2.11).
        # (An explicit mask with GQA has no fused kernel but cuDNN's: math would build [H, T, L].)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(SDPA_BACKENDS):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != Hq)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != Hq)
    return out.transpose(1, 2).reshape(B, T, Hq * D)


def _visible(q_pos, k_pos, T, L, device):
    if q_pos is None:
        q_pos = torch.arange(L - T, L, device=device)
    if k_pos is None:
        k_pos = torch.arange(L, device=device)
    return k_pos.unsqueeze(-2) <= q_pos.unsqueeze(-1)  # [T, L] or [B, T, L]


# ----------------------------------------------------------------------------- attention mass

def attention_mass_ref(q, k, scale, q_pos=None, k_pos=None, weights=None):
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kf = k.float()
    out = torch.zeros(B, Hq, L, device=q.device, dtype=torch.float32)
    block = max(1, REF_BLOCK_BYTES // max(1, B * Hq * L * 4))
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        qb = q[:, :, t0:t1].float().view(B, Hkv, g, t1 - t0, D)
        s = torch.einsum("bhgtd,bhld->bhgtl", qb, kf).reshape(B, Hq, t1 - t0, L) * scale
        qp = torch.arange(L - T + t0, L - T + t1, device=q.device) if q_pos is None else q_pos[..., t0:t1]
        vis = _visible(qp, k_pos, t1 - t0, L, q.device)
        vis = vis.unsqueeze(1) if vis.dim() == 3 else vis
        # where(), not masked arithmetic: a garbage (NaN) key in a hidden slot must not leak.
        p = torch.softmax(torch.where(vis, s, float("-inf")), dim=-1)
        p = torch.where(vis, p, 0.0)
        if weights is not None:
            w = weights[..., t0:t1].float()
            p = p * (w.view(1, 1, -1, 1) if w.dim() == 1 else w.view(B, 1, -1, 1))
        out += p.sum(2)
    return out


if HAVE_TRITON:

    @triton.jit
    def _row_lse_kernel(Q, K, Qpos, Kpos, Lse, T, L, qk_scale,
                        s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_pb, s_kpb, HQ, G,
                        D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                        UPCAST: tl.constexpr):
        # One program per (batch, query head, block of BM queries): base-2 log-sum-exp of each
        # query's visible scores (online max/sum over key blocks).
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = pid % HQ
        kvh = h // G
        mm = tl.program_id(1) * BM + tl.arange(0, BM)
        dd = tl.arange(0, D)
        mrow = mm < T
        q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        qp = tl.load(Qpos + b * s_pb + mm, mask=mrow, other=-1)
        m_i = tl.full((BM,), -1e30, tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        for n0 in range(0, L, BN):
            nn = n0 + tl.arange(0, BN)
            ncol = nn < L
            kp = tl.load(Kpos + b * s_kpb + nn, mask=ncol, other=2**62)
            vis = (kp[None, :] <= qp[:, None]) & mrow[:, None]
            k = tl.load(K + b * s_kb + kvh * s_kh + nn[:, None] * s_kn + dd[None, :],
                        mask=ncol[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
            m_i = m_new
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("inf"))
        tl.store(Lse + pid.to(tl.int64) * T + mm, lse, mask=mrow)

    @triton.jit
    def _column_mass_kernel(Q, K, Qpos, Kpos, Lse, W, Out, T, L, qk_scale,
                            s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_pb, s_kpb, s_wb, HQ, G,
                            D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                            UPCAST: tl.constexpr, WEIGHTED: tl.constexpr):
        # One program per (batch, query head, block of BN keys): sum over every query of
        # w_q * exp2(s_qk - lse_q), the keys loaded once.
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = pid % HQ
        kvh = h // G
        nn = tl.program_id(1) * BN + tl.arange(0, BN)
        dd = tl.arange(0, D)
        ncol = nn < L
        k = tl.load(K + b * s_kb + kvh * s_kh + nn[:, None] * s_kn + dd[None, :], mask=ncol[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        kp = tl.load(Kpos + b * s_kpb + nn, mask=ncol, other=2**62)
        acc = tl.zeros((BN,), tl.float32)
        for m0 in range(0, T, BM):
            mm = m0 + tl.arange(0, BM)
            mrow = mm < T
            q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            qp = tl.load(Qpos + b * s_pb + mm, mask=mrow, other=-1)
            lse = tl.load(Lse + pid.to(tl.int64) * T + mm, mask=mrow, other=float("inf"))
            vis = (kp[None, :] <= qp[:, None]) & mrow[:, None] & ncol[None, :]
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            p = tl.where(vis, tl.exp2(s - lse[:, None]), 0.0)
            if WEIGHTED:
                w = tl.load(W + b * s_wb + mm, mask=mrow, other=0.0)
                p = p * w[:, None]
            acc += tl.sum(p, 0)
        tl.store(Out + pid.to(tl.int64) * L + nn, acc, mask=ncol)


def _positions(pos, default, B, device):
    """Positions as int64 [B, n] (a shared [n] vector is expanded, not copied)."""
    p = default if pos is None else pos.to(device=device, dtype=torch.int64)
    return (p.unsqueeze(0) if p.dim() == 1 else p).expand(B, -1).contiguous()


def attention_mass(q, k, scale, q_pos=None, k_pos=None, weights=None, *, block_m=None, block_n=None):
    """Per-key attention mass [B, Hq, L] fp32: sum over the T queries of (weight x) the softmax
    probability each key received. `weights` [T] or [B, T] (None = 1). Positions as in
    `prefill_attention`. Rows of keys no query sees are 0."""
    if backend_for(q) == "torch":
        return attention_mass_ref(q, k, scale, q_pos, k_pos, weights)
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    assert D == next_pow2(D) and D >= 16 and q.stride(-1) == 1 and k.stride(-1) == 1
    dev = q.device
    qp = _positions(q_pos, torch.arange(L - T, L, device=dev), B, dev)
    kp = _positions(k_pos, torch.arange(L, device=dev), B, dev)
    bm = block_m or (64 if q.is_cuda else 16)
    bn = block_n or (64 if q.is_cuda else 16)
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    lse = torch.empty(B, Hq, T, device=dev, dtype=torch.float32)
    common = dict(D=D, BM=bm, BN=bn, PREC=prec, UPCAST=upcast, num_warps=4)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               qp.stride(0), kp.stride(0))
    kernel_for(_row_lse_kernel, q)[(B * Hq, triton.cdiv(T, bm))](
        q, k, qp, kp, lse, T, L, scale * LOG2E, *strides, Hq, Hq // Hkv, **common)
    out = torch.empty(B, Hq, L, device=dev, dtype=torch.float32)
    w = None if weights is None else weights.to(device=dev, dtype=torch.float32)
    w = None if w is None else (w.unsqueeze(0) if w.dim() == 1 else w).expand(B, -1).contiguous()
    kernel_for(_column_mass_kernel, q)[(B * Hq, triton.cdiv(L, bn))](
        q, k, qp, kp, lse, w if w is not None else lse, out, T, L, scale * LOG2E, *strides,
        w.stride(0) if w is not None else 0, Hq, Hq // Hkv, WEIGHTED=w is not None, **common)
    return out
