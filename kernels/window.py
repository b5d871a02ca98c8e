"""Multi-token attention restricted to a band of distances, with its log-sum-exp, and the attention
mass keys receive under an external normaliser: the prefill half of a two-part attention (InfLLM /
Ltri-LLM local window + memory, LM-Infinite's Lambda mask) whose parts are merged by
`kernels.lse.merge_attention`.

Conventions: q [B, Hq, T, D], k/v [B, Hkv, L, D] (GQA: query head h reads KV head h // (Hq // Hkv));
q_pos [T] or [B, T], k_pos [L] or [B, L] int64 (absolute positions, used for the mask only: the
caller rotates q and k as it needs). Key j is visible to query t iff dmin <= q_pos[t] - k_pos[j] <= dmax
(a huge k_pos hides a slot whenever dmin > -2**40). lse is fp32 natural log of the scaled logits, -inf for a query that sees
nothing (its out row is 0).

`window_mass(..., lse)` returns [B, Hq, L] fp32: sum over queries of exp(scale * q.k - lse[t]) over the
visible pairs, i.e. the probability each key received under the softmax whose log-normaliser is
`lse` (the merged one of all parts: InfLLM scores local tokens by their share of the joint softmax).
Neither op builds a [T, L] matrix beyond a memory-bounded block of queries (torch) or a tile (Triton).
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton

REF_BLOCK_BYTES = 1 << 27
LN2 = 0.6931471805599453
FAR = 1 << 62  # "no upper bound" for dmax


def _pos(p: torch.Tensor, B: int, n: int, device) -> torch.Tensor:
    p = p.to(device=device, dtype=torch.int64)
    return (p.unsqueeze(0) if p.dim() == 1 else p).expand(B, n).contiguous()


def _visible(qp: torch.Tensor, kp: torch.Tensor, dmin: int, dmax: int) -> torch.Tensor:
    """qp [B, t], kp [B, L] -> [B, 1, t, L] bool."""
    d = qp.unsqueeze(-1) - kp.unsqueeze(-2)
    return ((d >= dmin) & (d <= dmax)).unsqueeze(1)


def _scores(q, k, t0, t1):
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    qb = q[:, :, t0:t1].float().view(B, Hkv, Hq // Hkv, t1 - t0, D)
    return torch.einsum("bhgtd,bhld->bhgtl", qb, k.float()).reshape(B, Hq, t1 - t0, k.shape[2])


def _block(B, Hq, L) -> int:
    return max(1, REF_BLOCK_BYTES // max(1, B * Hq * L * 4))


def window_attention_lse_ref(q, k, v, scale, q_pos, k_pos, dmin=0, dmax=FAR):
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    qp, kp = _pos(q_pos, B, T, q.device), _pos(k_pos, B, L, q.device)
    vf = v.float().repeat_interleave(Hq // Hkv, 1)
    out = torch.empty(B, Hq, T, D, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, T, device=q.device, dtype=torch.float32)
    step = _block(B, Hq, L)
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        vis = _visible(qp[:, t0:t1], kp, dmin, dmax)
        s = torch.where(vis, _scores(q, k, t0, t1) * scale, float("-inf"))  # where(): NaN keys never leak
        ls = torch.logsumexp(s, -1)
        p = torch.where(vis, torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0).unsqueeze(-1)), 0.0)
        vv = torch.where(vis.any(-2, keepdim=True).transpose(-1, -2), vf, 0.0)   # hidden rows of V -> 0
        out[:, :, t0:t1] = (p @ vv).to(q.dtype)
        lse[:, :, t0:t1] = ls
    return out, lse


def window_mass_ref(q, k, scale, q_pos, k_pos, lse, dmin=0, dmax=FAR):
    B, Hq, T, D = q.shape
    L = k.shape[2]
    qp, kp = _pos(q_pos, B, T, q.device), _pos(k_pos, B, L, q.device)
    acc = torch.zeros(B, Hq, L, device=q.device, dtype=torch.float32)
    step = _block(B, Hq, L)
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        ls = lse[:, :, t0:t1].float()
        vis = _visible(qp[:, t0:t1], kp, dmin, dmax) & torch.isfinite(ls).unsqueeze(-1)
        s = _scores(q, k, t0, t1) * scale
        acc += torch.where(vis, torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0).unsqueeze(-1)), 0.0).sum(2)
    return acc


if HAVE_TRITON:

    @triton.jit
    def _window_attn_kernel(Q, K, V, Qpos, Kpos, Out, Lse, T, L, qk_scale, dmin, dmax,
                            s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_ot,
                            HQ, G, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            PREC: tl.constexpr, UPCAST: tl.constexpr):
        # One program per (batch, query head, block of BM queries): online softmax over all key
        # blocks with the distance-band mask; writes the normalised output and the base-e lse.
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
        qp = tl.load(Qpos + b * T + mm, mask=mrow, other=0)
        m_i = tl.full((BM,), -1e30, tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        for n0 in range(0, L, BN):
            nn = n0 + tl.arange(0, BN)
            ncol = nn < L
            kp = tl.load(Kpos + b * L + nn, mask=ncol, other=2**62)
            dist = qp[:, None] - kp[None, :]
            vis = (dist >= dmin) & (dist <= dmax) & mrow[:, None] & ncol[None, :]
            kv_rows = tl.max(vis.to(tl.int32), 0) > 0  # keys some query sees: the only rows loaded
            k = tl.load(K + b * s_kb + kvh * s_kh + nn[:, None] * s_kn + dd[None, :], mask=kv_rows[:, None], other=0.0)
            v = tl.load(V + b * s_vb + kvh * s_vh + nn[:, None] * s_vn + dd[None, :], mask=kv_rows[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            pv = p.to(v.dtype)
            acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PREC)
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(Out + b * s_ob + h * s_oh + mm[:, None] * s_ot + dd[None, :], o.to(Out.dtype.element_ty),
                 mask=mrow[:, None])
        tl.store(Lse + pid.to(tl.int64) * T + mm, lse, mask=mrow)

    @triton.jit
    def _window_mass_kernel(Q, K, Qpos, Kpos, Lse, Out, T, L, qk_scale, dmin, dmax,
                            s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, HQ, G,
                            D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
                            UPCAST: tl.constexpr):
        # One program per (batch, query head, block of BN keys): sum over all queries of
        # exp2(s - lse2) on the visible pairs, the keys loaded once.
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = pid % HQ
        kvh = h // G
        nn = tl.program_id(1) * BN + tl.arange(0, BN)
        dd = tl.arange(0, D)
        ncol = nn < L
        kp = tl.load(Kpos + b * L + nn, mask=ncol, other=2**62)
        k = tl.load(K + b * s_kb + kvh * s_kh + nn[:, None] * s_kn + dd[None, :], mask=ncol[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        acc = tl.zeros((BN,), tl.float32)
        for m0 in range(0, T, BM):
            mm = m0 + tl.arange(0, BM)
            mrow = mm < T
            q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            qp = tl.load(Qpos + b * T + mm, mask=mrow, other=0)
            lse = tl.load(Lse + pid.to(tl.int64) * T + mm, mask=mrow, other=float("-inf"))
            fin = lse > float("-inf")
            dist = qp[:, None] - kp[None, :]
            vis = (dist >= dmin) & (dist <= dmax) & (mrow & fin)[:, None] & ncol[None, :]
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
            lse2 = tl.where(fin, lse * 1.4426950408889634, 0.0)
            p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
            acc += tl.sum(p, 0)
        tl.store(Out + pid.to(tl.int64) * L + nn, acc, mask=ncol)


def _prep(q, k, q_pos, k_pos):
    B, Hq, T, D = q.shape
    L = k.shape[2]
    assert D == next_pow2(D) and D >= 16 and q.stride(-1) == 1 and k.stride(-1) == 1
    qp, kp = _pos(q_pos, B, T, q.device), _pos(k_pos, B, L, q.device)
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    return qp, kp, dict(D=D, PREC=prec, UPCAST=upcast, num_warps=4)


def _bound(x: int) -> int:
    return max(-FAR, min(FAR, int(x)))


def window_attention_lse(q, k, v, scale, q_pos, k_pos, dmin=0, dmax=FAR, *, block_m=None, block_n=None):
    """(out [B, Hq, T, D] in q's dtype, lse [B, Hq, T] fp32) of the queries over the keys they see."""
    if backend_for(q) == "torch" or k.shape[2] == 0 or q.shape[2] == 0:
        return window_attention_lse_ref(q, k, v, scale, q_pos, k_pos, dmin, dmax)
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    assert v.stride(-1) == 1
    qp, kp, common = _prep(q, k, q_pos, k_pos)
    bm = block_m or (64 if q.is_cuda else 16)
    bn = block_n or (64 if q.is_cuda else 16)
    out = torch.empty(B, Hq, T, D, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, T, device=q.device, dtype=torch.float32)
    kernel_for(_window_attn_kernel, q)[(B * Hq, triton.cdiv(T, bm))](
        q, k, v, qp, kp, out, lse, T, L, scale * LOG2E, _bound(dmin), _bound(dmax),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        Hq, Hq // Hkv, BM=bm, BN=bn, **common)
    return out, lse


def window_mass(q, k, scale, q_pos, k_pos, lse, dmin=0, dmax=FAR, *, block_m=None, block_n=None):
    """[B, Hq, L] fp32: the probability mass each key received from the queries that see it, under
    the per-query log-normaliser `lse` [B, Hq, T] (natural log)."""
    if backend_for(q) == "torch" or k.shape[2] == 0 or q.shape[2] == 0:
        return window_mass_ref(q, k, scale, q_pos, k_pos, lse, dmin, dmax)
    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    qp, kp, common = _prep(q, k, q_pos, k_pos)
    bm = block_m or (64 if q.is_cuda else 16)
    bn = block_n or (64 if q.is_cuda else 16)
    out = torch.empty(B, Hq, L, device=q.device, dtype=torch.float32)
    kernel_for(_window_mass_kernel, q)[(B * Hq, triton.cdiv(L, bn))](
        q, k, qp, kp, lse.float().contiguous(), out, T, L, scale * LOG2E, _bound(dmin), _bound(dmax),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        Hq, Hq // Hkv, BM=bm, BN=bn, **common)
    return out
