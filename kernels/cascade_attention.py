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

`rotated_decode_mass` is the decode step: the cache keeps keys un-rotated (their in-cache positions
change as the rings move), so each step must rotate every cached key. Rotating them into a copy and
then attending moved each key three times (read, write, read again): the rotation alone took 5 of the
15 ms of a Llama-3.1-8B decode step with a 32K cache (H100 profile). The kernel rotates each key tile
in registers, between its load and the q.k product, reading the per-slot cos/sin table beside it.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, LOG2E, backend_for, combine, kernel_for, next_pow2, num_sms, plan_splits, tl, triton
from .prefill import REF_BLOCK_BYTES

DECODE_CONFIG = dict(block_n=64, num_warps=4, num_stages=2, splits_per_sm=4.0)  # 5 tiles a step: 4 stages overflow shared memory


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


# ----------------------------------------------------------------------------- decode over un-rotated keys

def rotated_decode_mass_ref(q, k, v, cos, sin, lengths, scale, max_length):
    """Rotate the keys into a copy (kernels.fused.rope), then the kit's decode attention with mass."""
    from .attention import decode_attention_mass
    from .fused import rope

    S = int(max_length)
    keys = rope(k[:, :, :S], cos[:, :S], sin[:, :S])
    return decode_attention_mass(q, keys, v[:, :, :S], lengths, scale, max_length=S)


if HAVE_TRITON:

    @triton.jit
    def _rot_decode_kernel(Q, K, V, Cos, Sin, Lens, Sc, Op, Lp, qk_scale,
                           s_qb, s_qh, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_cb, s_cn, s_sb, s_sh,
                           HKV, S_OUT, CHUNK, NS,
                           G: tl.constexpr, R_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                           PREC: tl.constexpr, UPCAST: tl.constexpr):
        # One program per (sequence, KV head, split): the GQA group's queries over its slot range.
        pid = tl.program_id(0)
        sid = tl.program_id(1)
        b = pid // HKV
        kvh = pid % HKV
        b64 = b.to(tl.int64)
        rows = tl.arange(0, R_PAD)
        rmask = rows < G
        dd = tl.arange(0, D)
        half = D // 2
        partner = (dd + half) % D                     # rotate_half: [-x2, x1]
        sign = tl.where(dd < half, -1.0, 1.0)
        q = tl.load(Q + b64 * s_qb + (kvh * G + rows)[:, None] * s_qh + dd[None, :], mask=rmask[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        kbase = K + b64 * s_kb + kvh * s_kh
        vbase = V + b64 * s_vb + kvh * s_vh
        cbase = b64 * s_cb
        length = tl.load(Lens + b)
        lo = sid * CHUNK
        hi = tl.minimum(lo + CHUNK, S_OUT)
        m_i = tl.full((R_PAD,), -1e30, tl.float32)
        l_i = tl.zeros((R_PAD,), tl.float32)
        acc = tl.zeros((R_PAD, D), tl.float32)
        for start in range(lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            smask = pos < hi
            valid = smask & (pos < length)
            kp = kbase + pos[:, None] * s_kn
            k = tl.load(kp + dd[None, :], mask=valid[:, None], other=0.0)
            k2 = tl.load(kp + partner[None, :], mask=valid[:, None], other=0.0)
            cp = cbase + pos[:, None] * s_cn + dd[None, :]
            c = tl.load(Cos + cp, mask=smask[:, None], other=0.0)
            s = tl.load(Sin + cp, mask=smask[:, None], other=0.0)
            # products rounded to the cache dtype, as rope_ref's elementwise ops do, then one sum
            # (computed in fp32 and rounded explicitly: the interpreter's bf16 arithmetic is wrong)
            a = (k.to(tl.float32) * c.to(tl.float32)).to(k.dtype).to(tl.float32)
            a2 = (k2.to(tl.float32) * s.to(tl.float32)).to(k.dtype).to(tl.float32)
            kr = (a + a2 * sign[None, :]).to(k.dtype)
            if UPCAST:
                kr = kr.to(tl.float32)
            qk = tl.dot(q, tl.trans(kr), input_precision=PREC)
            tl.store(Sc + b64 * s_sb + (kvh * G + rows)[:, None] * s_sh + pos[None, :],
                     tl.where(valid[None, :], qk, float("-inf")), mask=rmask[:, None] & smask[None, :])
            sc = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vv = tl.load(vbase + pos[:, None] * s_vn + dd[None, :], mask=valid[:, None], other=0.0)
            pv = p.to(vv.dtype)
            if UPCAST:
                pv = pv.to(tl.float32)
                vv = vv.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(pv, vv, input_precision=PREC)
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        prow = (b64 * (HKV * G) + kvh * G + rows) * NS + sid
        tl.store(Op + prow[:, None] * D + dd[None, :], o, mask=rmask[:, None])
        tl.store(Lp + prow, lse, mask=rmask)


def rotated_decode_mass(q, k, v, cos, sin, lengths, scale, *, max_length):
    """Decode attention of q [B, Hq, D] (rotated) over slots 0..max_length-1 of un-rotated keys k and
    values v [B, Hkv, S_cap, D], key slot s rotated by cos/sin [B or 1, >= max_length, D] (the RoPE
    table of the slots' positions). Slots at or past lengths [B] are masked. Returns (out [B, Hq, D],
    probs [B, Hq, max_length] fp32: each slot's attention probability, 0 past the length), as
    `decode_attention_mass` over the rotated keys."""
    S = int(max_length)
    if backend_for(q) == "torch":
        return rotated_decode_mass_ref(q, k, v, cos, sin, lengths, scale, S)
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    assert Hq % Hkv == 0 and D >= 16 and D == next_pow2(D)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1 and cos.shape[-2] >= S
    G = Hq // Hkv
    block = DECODE_CONFIG["block_n"] if q.is_cuda else 16
    ns, chunk = plan_splits(S, B * Hkv, block, num_sms(q), DECODE_CONFIG["splits_per_sm"])
    op = torch.empty(B, Hq, ns, D, device=q.device, dtype=torch.float32)
    lp = torch.empty(B, Hq, ns, device=q.device, dtype=torch.float32)
    scores = torch.empty(B, Hq, S, device=q.device, dtype=torch.float32)
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    kernel_for(_rot_decode_kernel, q)[(B * Hkv, ns)](
        q, k, v, cos, sin, lengths, scores, op, lp, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(-2), scores.stride(0), scores.stride(1),
        Hkv, S, chunk, ns, G=G, R_PAD=max(16, next_pow2(G)), D=D, BLOCK_N=block, PREC=prec, UPCAST=upcast,
        num_warps=DECODE_CONFIG["num_warps"], num_stages=DECODE_CONFIG["num_stages"] if q.is_cuda else 1)
    out = combine(op, lp, torch.empty(B, Hq, D, device=q.device, dtype=q.dtype))
    return out, torch.softmax(scores * scale, dim=-1)
