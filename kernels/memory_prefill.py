"""A prefill chunk's two-part attention in one kernel: InfLLM / Ltri-LLM's local window (keys rotated at
their positions, query q1) and memory (un-rotated keys, the query q2 rotated by the fixed distance), one
online softmax over both, with its log-sum-exp.

Against two `kernels.window.window_attention_lse` calls and `kernels.lse.merge_attention` (the reference,
`two_part_prefill_lse_ref`), the merge's ~30 small kernels per layer and chunk are gone (the prefill is
bound by kernel launches on the host), and neither part is copied first: part 1 reads the window ring
in place (each slot's absolute position given, a stale or empty slot at FAR), part 2 either a contiguous
buffer with its positions or, `index2` given, token positions into a positional store (int32
[B, Hkv, W], the first counts2 [B, Hkv] valid; a key's position for the mask is its index). Conventions
of kernels/window.py: q [B, Hq, T, D], k/v [B, Hkv, L, D], q_pos [B, T] and k_pos [B, L] int64, key j
visible to query t iff dmin <= q_pos[t] - k_pos[j] <= dmax. Float rounding differs from the reference
(the order of the softmax's sums), nothing else.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton
from .lse import merge_attention
from .window import FAR, window_attention_lse_ref


def _part2_ref(q, k, v, scale, q_pos, k_pos, index, counts, dmin, dmax):
    if index is None:
        return window_attention_lse_ref(q, k, v, scale, q_pos, k_pos, dmin, dmax)
    Hq, D = q.shape[1], q.shape[3]
    Hkv, W = index.shape[1], index.shape[2]
    G = Hq // Hkv
    live = torch.arange(W, device=q.device) < counts.unsqueeze(-1).long()        # [B, Hkv, W]
    idx = index.long().clamp(0, k.shape[2] - 1)
    outs, lses = [], []
    for h in range(Hkv):
        gi = idx[:, h].unsqueeze(-1).expand(-1, -1, D)
        kh, vh = k[:, h].gather(1, gi).unsqueeze(1), v[:, h].gather(1, gi).unsqueeze(1)
        ph = torch.where(live[:, h], idx[:, h], -FAR)    # past the count: hidden under any band (dmax <= FAR)
        o, lse = window_attention_lse_ref(q[:, h * G:(h + 1) * G], kh, vh, scale, q_pos, ph, dmin, dmax)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def two_part_prefill_lse_ref(q1, k1, v1, pos1, dmin1, dmax1, q2, k2, v2, pos2, dmin2, dmax2, q_pos, scale,
                             *, index2=None, counts2=None):
    """(out [B, Hq, T, D], lse [B, Hq, T]) of one softmax over both parts: two window attentions merged."""
    a = window_attention_lse_ref(q1, k1, v1, scale, q_pos, pos1, dmin1, dmax1)
    b = _part2_ref(q2, k2, v2, scale, q_pos, pos2, index2, counts2, dmin2, dmax2)
    return merge_attention([a, b])


if HAVE_TRITON:

    @triton.jit
    def _part(Q, K, V, P, Idx, Cnt, b, h, kvh, mm, mrow, qp, dd, L, dmin, dmax, qk_scale, m_i, l_i, acc,
              s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ib, s_ih, s_cb,
              BN: tl.constexpr, INDEXED: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        # the online softmax of one part, continued from (m_i, l_i, acc); only keys some query of the
        # block sees are loaded (stale ring slots or store rows may hold anything, NaN included)
        q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        n = L
        if INDEXED:
            n = tl.load(Cnt + b * s_cb + kvh)
        for n0 in range(0, L, BN):
            nn = n0 + tl.arange(0, BN)
            ncol = nn < n
            if INDEXED:
                pos = tl.load(Idx + b * s_ib + kvh * s_ih + nn, mask=ncol, other=0).to(tl.int64)
                kp = tl.where(ncol, pos, 2**62)
            else:
                pos = nn.to(tl.int64)
                kp = tl.load(P + b * L + nn, mask=ncol, other=2**62)
            dist = qp[:, None] - kp[None, :]
            vis = (dist >= dmin) & (dist <= dmax) & mrow[:, None] & ncol[None, :]
            rows = tl.max(vis.to(tl.int32), 0) > 0
            k = tl.load(K + b * s_kb + kvh * s_kh + pos[:, None] * s_kn + dd[None, :], mask=rows[:, None], other=0.0)
            v = tl.load(V + b * s_vb + kvh * s_vh + pos[:, None] * s_vn + dd[None, :], mask=rows[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.where(vis, tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def _two_part_kernel(Q1, K1, V1, P1, Q2, K2, V2, P2, Idx, Cnt, Qpos, Out, Lse, T, L1, L2, qk_scale,
                         dmin1, dmax1, dmin2, dmax2,
                         s_q1b, s_q1h, s_q1t, s_k1b, s_k1h, s_k1n, s_v1b, s_v1h, s_v1n,
                         s_q2b, s_q2h, s_q2t, s_k2b, s_k2h, s_k2n, s_v2b, s_v2h, s_v2n, s_ib, s_ih, s_cb,
                         s_ob, s_oh, s_ot, HQ, G, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         INDEXED: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        # One program per (batch, query head, block of BM queries): part 1 then part 2, one softmax.
        pid = tl.program_id(0)
        b = (pid // HQ).to(tl.int64)
        h = pid % HQ
        kvh = h // G
        mm = tl.program_id(1) * BM + tl.arange(0, BM)
        dd = tl.arange(0, D)
        mrow = mm < T
        qp = tl.load(Qpos + b * T + mm, mask=mrow, other=0)
        m_i = tl.full((BM,), -1e30, tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        m_i, l_i, acc = _part(Q1, K1, V1, P1, Idx, Cnt, b, h, kvh, mm, mrow, qp, dd, L1, dmin1, dmax1, qk_scale,
                              m_i, l_i, acc, s_q1b, s_q1h, s_q1t, s_k1b, s_k1h, s_k1n, s_v1b, s_v1h, s_v1n,
                              s_ib, s_ih, s_cb, BN=BN, INDEXED=False, PREC=PREC, UPCAST=UPCAST)
        m_i, l_i, acc = _part(Q2, K2, V2, P2, Idx, Cnt, b, h, kvh, mm, mrow, qp, dd, L2, dmin2, dmax2, qk_scale,
                              m_i, l_i, acc, s_q2b, s_q2h, s_q2t, s_k2b, s_k2h, s_k2n, s_v2b, s_v2h, s_v2n,
                              s_ib, s_ih, s_cb, BN=BN, INDEXED=INDEXED, PREC=PREC, UPCAST=UPCAST)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(Out + b * s_ob + h * s_oh + mm[:, None] * s_ot + dd[None, :], o.to(Out.dtype.element_ty),
                 mask=mrow[:, None])
        tl.store(Lse + pid.to(tl.int64) * T + mm, lse, mask=mrow)


def _bound(x: int) -> int:
    return max(-FAR, min(FAR, int(x)))


def two_part_prefill_lse(q1, k1, v1, pos1, dmin1, dmax1, q2, k2, v2, pos2, dmin2, dmax2, q_pos, scale,
                         *, index2=None, counts2=None):
    """Module docstring: q_pos int64 [B, T], pos1 int64 [B, L1], pos2 int64 [B, L2] (None with index2);
    Triton on CUDA, the reference elsewhere."""
    if backend_for(q1) == "torch":
        return two_part_prefill_lse_ref(q1, k1, v1, pos1, dmin1, dmax1, q2, k2, v2, pos2, dmin2, dmax2, q_pos,
                                        scale, index2=index2, counts2=counts2)
    B, Hq, T, D = q1.shape
    Hkv = k1.shape[1]
    assert D == next_pow2(D) and D >= 16 and q_pos.shape == (B, T) and pos1.shape == (B, k1.shape[2])
    assert all(t.stride(-1) == 1 for t in (q1, k1, v1, q2, k2, v2)) and q_pos.is_contiguous() and pos1.is_contiguous()
    indexed = index2 is not None
    if indexed:
        L2, P2, idx, cnt = index2.shape[-1], q_pos, index2, counts2
    else:
        L2, P2 = k2.shape[2], pos2
        idx = cnt = torch.zeros(1, 1, dtype=torch.int32, device=q1.device)
        assert P2.shape == (B, L2) and P2.is_contiguous()
    upcast = not q1.is_cuda
    prec = "ieee" if (q1.dtype == torch.float32 or upcast) else "tf32"
    bm = 64 if q1.is_cuda else 16
    bn = 64 if q1.is_cuda else 16
    out = torch.empty(B, Hq, T, D, device=q1.device, dtype=q1.dtype)
    lse = torch.empty(B, Hq, T, device=q1.device, dtype=torch.float32)
    kernel_for(_two_part_kernel, q1)[(B * Hq, triton.cdiv(T, bm))](
        q1, k1, v1, pos1, q2, k2, v2, P2, idx, cnt, q_pos, out, lse, T, k1.shape[2], L2, scale * LOG2E,
        _bound(dmin1), _bound(dmax1), _bound(dmin2), _bound(dmax2),
        q1.stride(0), q1.stride(1), q1.stride(2), k1.stride(0), k1.stride(1), k1.stride(2),
        v1.stride(0), v1.stride(1), v1.stride(2),
        q2.stride(0), q2.stride(1), q2.stride(2), k2.stride(0), k2.stride(1), k2.stride(2),
        v2.stride(0), v2.stride(1), v2.stride(2), idx.stride(0), idx.stride(1), cnt.stride(0),
        out.stride(0), out.stride(1), out.stride(2), Hq, Hq // Hkv,
        D=D, BM=bm, BN=bn, INDEXED=indexed, PREC=prec, UPCAST=upcast, num_warps=4)
    return out, lse
