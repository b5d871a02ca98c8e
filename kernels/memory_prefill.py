"""A prefill chunk's two-part attention in one kernel: InfLLM / Ltri-LLM's local window (keys rotated at
their positions, query q1) and memory (un-rotated keys, the query q2 rotated by the fixed distance), one
online softmax over both, with its log-sum-exp.

Against two `kernels.window.window_attention_lse` calls and `kernels.lse.merge_attention` (the reference,
`two_part_prefill_lse_ref`), the merge's ~30 small kernels per layer and chunk are gone (the prefill is
bound by kernel launches on the host), and neither part is copied first: part 1 reads the window ring
in place (each slot's absolute position given, a stale or empty slot at FAR), part 2 either a contiguous
buffer with its positions or, `blocks2` given, InfLLM's memory read straight from a positional store
(every token at its absolute position): [init_len sinks | the retrieved blocks | the remainder from
rem_start], the blocks' ids int32 [B, U, >= nsel] (U = 1: shared by every KV head, or one per KV head),
each block b the positions n_init + b * bs ..; a key's position for the mask is its own. Conventions
of kernels/window.py: q [B, Hq, T, D], k/v [B, Hkv, L, D], q_pos [B, T] and k_pos [B, L] int64, key j
visible to query t iff dmin <= q_pos[t] - k_pos[j] <= dmax. Float rounding differs from the reference
(the order of the softmax's sums), nothing else.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton
from .lse import merge_attention
from .window import FAR, window_attention_lse_ref


def memory_positions(blocks: torch.Tensor, kv_heads: int, init_len: int, n_init: int, bs: int, nsel: int,
                     rem_start: int, n_mem: int) -> torch.Tensor:
    """Absolute positions int64 [B, Hkv, n_mem] of the memory `blocks2` describes (the kernel's formula)."""
    B, U = blocks.shape[:2]
    j = torch.arange(n_mem, device=blocks.device)
    jb = j - init_len
    slot = jb.div(bs, rounding_mode="floor").clamp(0, max(nsel - 1, 0))
    ids = blocks[..., :max(nsel, 1)].long() if nsel else torch.zeros(B, U, 1, dtype=torch.long, device=j.device)
    blk = ids.gather(-1, slot.expand(B, U, -1))
    pos = torch.where(j < init_len, j, torch.where(jb < nsel * bs, n_init + blk * bs + jb.remainder(bs),
                                                   rem_start + jb - nsel * bs))
    return pos.expand(B, kv_heads, n_mem) if U == 1 else pos


def _part2_ref(q, k, v, scale, q_pos, k_pos, blocks, dmin, dmax):
    if blocks is None:
        return window_attention_lse_ref(q, k, v, scale, q_pos, k_pos, dmin, dmax)
    Hq, D = q.shape[1], q.shape[3]
    Hkv = k.shape[1]
    G = Hq // Hkv
    idx = memory_positions(blocks[0], Hkv, *blocks[1:]).clamp(0, k.shape[2] - 1)
    outs, lses = [], []
    for h in range(Hkv):
        gi = idx[:, h].unsqueeze(-1).expand(-1, -1, D)
        kh, vh = k[:, h].gather(1, gi).unsqueeze(1), v[:, h].gather(1, gi).unsqueeze(1)
        o, lse = window_attention_lse_ref(q[:, h * G:(h + 1) * G], kh, vh, scale, q_pos, idx[:, h], dmin, dmax)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def two_part_prefill_lse_ref(q1, k1, v1, pos1, dmin1, dmax1, q2, k2, v2, pos2, dmin2, dmax2, q_pos, scale,
                             *, blocks2=None):
    """(out [B, Hq, T, D], lse [B, Hq, T]) of one softmax over both parts: two window attentions merged.
    blocks2 = (ids [B, U, >= nsel], init_len, n_init, block_size, nsel, rem_start, n_mem) or None."""
    a = window_attention_lse_ref(q1, k1, v1, scale, q_pos, pos1, dmin1, dmax1)
    b = _part2_ref(q2, k2, v2, scale, q_pos, pos2, blocks2, dmin2, dmax2)
    return merge_attention([a, b])


if HAVE_TRITON:

    @triton.jit
    def _part(Q, K, V, P, Ids, b, h, kvh, mm, mrow, qp, dd, L, dmin, dmax, qk_scale, m_i, l_i, acc,
              s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ib, s_ih, init_len, n_init, bs, nsel, rem_start,
              BN: tl.constexpr, BLOCKS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        # the online softmax of one part, continued from (m_i, l_i, acc); only keys some query of the
        # block sees are loaded (stale ring slots or store rows may hold anything, NaN included)
        q = tl.load(Q + b * s_qb + h * s_qh + mm[:, None] * s_qt + dd[None, :], mask=mrow[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        for n0 in range(0, L, BN):
            nn = n0 + tl.arange(0, BN)
            ncol = nn < L
            if BLOCKS:   # [sinks | blocks | remainder] -> absolute positions (memory_positions' formula)
                jb = nn - init_len
                in_blk = (jb >= 0) & (jb < nsel * bs)
                blk = tl.load(Ids + b * s_ib + kvh * s_ih + jb // bs, mask=ncol & in_blk, other=0).to(tl.int64)
                pos = tl.where(nn < init_len, nn, tl.where(in_blk, n_init + blk * bs + jb % bs,
                                                          rem_start + jb - nsel * bs)).to(tl.int64)
                pos = tl.where(ncol, pos, 0)
                kp = pos
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
    def _two_part_kernel(Q1, K1, V1, P1, Q2, K2, V2, P2, Ids, Qpos, Out, Lse, T, L1, L2, qk_scale,
                         dmin1, dmax1, dmin2, dmax2,
                         s_q1b, s_q1h, s_q1t, s_k1b, s_k1h, s_k1n, s_v1b, s_v1h, s_v1n,
                         s_q2b, s_q2h, s_q2t, s_k2b, s_k2h, s_k2n, s_v2b, s_v2h, s_v2n, s_ib, s_ih,
                         init_len, n_init, bs, nsel, rem_start,
                         s_ob, s_oh, s_ot, HQ, G, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BLOCKS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
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
        m_i, l_i, acc = _part(Q1, K1, V1, P1, Ids, b, h, kvh, mm, mrow, qp, dd, L1, dmin1, dmax1, qk_scale,
                              m_i, l_i, acc, s_q1b, s_q1h, s_q1t, s_k1b, s_k1h, s_k1n, s_v1b, s_v1h, s_v1n,
                              s_ib, s_ih, init_len, n_init, bs, nsel, rem_start, BN=BN, BLOCKS=False, PREC=PREC,
                              UPCAST=UPCAST)
        m_i, l_i, acc = _part(Q2, K2, V2, P2, Ids, b, h, kvh, mm, mrow, qp, dd, L2, dmin2, dmax2, qk_scale,
                              m_i, l_i, acc, s_q2b, s_q2h, s_q2t, s_k2b, s_k2h, s_k2n, s_v2b, s_v2h, s_v2n,
                              s_ib, s_ih, init_len, n_init, bs, nsel, rem_start, BN=BN, BLOCKS=BLOCKS, PREC=PREC,
                              UPCAST=UPCAST)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, (m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(Out + b * s_ob + h * s_oh + mm[:, None] * s_ot + dd[None, :], o.to(Out.dtype.element_ty),
                 mask=mrow[:, None])
        tl.store(Lse + pid.to(tl.int64) * T + mm, lse, mask=mrow)


def _bound(x: int) -> int:
    return max(-FAR, min(FAR, int(x)))


def two_part_prefill_lse(q1, k1, v1, pos1, dmin1, dmax1, q2, k2, v2, pos2, dmin2, dmax2, q_pos, scale,
                         *, blocks2=None):
    """Module docstring: q_pos int64 [B, T], pos1 int64 [B, L1], pos2 int64 [B, L2] (None with blocks2 =
    (ids, init_len, n_init, block_size, nsel, rem_start, n_mem), host ints); Triton on CUDA, the reference
    elsewhere."""
    if backend_for(q1) == "torch":
        return two_part_prefill_lse_ref(q1, k1, v1, pos1, dmin1, dmax1, q2, k2, v2, pos2, dmin2, dmax2, q_pos,
                                        scale, blocks2=blocks2)
    B, Hq, T, D = q1.shape
    Hkv = k1.shape[1]
    assert D == next_pow2(D) and D >= 16 and q_pos.shape == (B, T) and pos1.shape == (B, k1.shape[2])
    assert all(t.stride(-1) == 1 for t in (q1, k1, v1, q2, k2, v2)) and q_pos.is_contiguous() and pos1.is_contiguous()
    if blocks2 is not None:
        ids, geo, L2, P2 = blocks2[0], blocks2[1:6], blocks2[6], q_pos
        assert ids.stride(-1) == 1 and ids.shape[1] in (1, Hkv) and (geo[3] == 0 or ids.shape[-1] >= geo[3])
        s_ib, s_ih = ids.stride(0), ids.stride(1) if ids.shape[1] > 1 else 0
    else:
        L2, P2, geo = k2.shape[2], pos2, (0, 0, 1, 0, 0)
        ids, s_ib, s_ih = q_pos, 0, 0
        assert P2.shape == (B, L2) and P2.is_contiguous()
    upcast = not q1.is_cuda
    prec = "ieee" if (q1.dtype == torch.float32 or upcast) else "tf32"
    bm = 64 if q1.is_cuda else 16
    bn = 64 if q1.is_cuda else 16
    out = torch.empty(B, Hq, T, D, device=q1.device, dtype=q1.dtype)
    lse = torch.empty(B, Hq, T, device=q1.device, dtype=torch.float32)
    kernel_for(_two_part_kernel, q1)[(B * Hq, triton.cdiv(T, bm))](
        q1, k1, v1, pos1, q2, k2, v2, P2, ids, q_pos, out, lse, T, k1.shape[2], L2, scale * LOG2E,
        _bound(dmin1), _bound(dmax1), _bound(dmin2), _bound(dmax2),
        q1.stride(0), q1.stride(1), q1.stride(2), k1.stride(0), k1.stride(1), k1.stride(2),
        v1.stride(0), v1.stride(1), v1.stride(2),
        q2.stride(0), q2.stride(1), q2.stride(2), k2.stride(0), k2.stride(1), k2.stride(2),
        v2.stride(0), v2.stride(1), v2.stride(2), s_ib, s_ih, *geo,
        out.stride(0), out.stride(1), out.stride(2), Hq, Hq // Hkv,
        D=D, BM=bm, BN=bn, BLOCKS=blocks2 is not None, PREC=prec, UPCAST=upcast, num_warps=4)
    return out, lse
