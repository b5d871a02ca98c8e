"""The eviction family's decode step in two launches around the attention (H2O, TOVA; issue 33).

The torch version of a step is a chain of small ops, each a kernel launch on the GPU (~2 us each inside
a CUDA graph, whatever the data): four scatters to put the token in its slot, then after the attention
a softmax, the group pooling, the accumulation, the protected-window mask, the arg-min and the victim
select. Here:

  bounded_put      the incoming token's key, value, position and zero score into its slot (one launch
                   for the four scatters of `BoundedStore.put`)
  eviction_decode  attention over the bounded store with its scores (`attention.selection_attention`),
                   one launch for each row's log-sum-exp of the scaled scores (a program per query
                   head; the cap's fp32 scores are ~1/64 of the K/V bytes the attention read), then
                   one launch, a program per (sequence, KV head, block of slots), that rebuilds each
                   probability from the score and the log-sum-exp, pools it (sum, mean or max over the KV group; or the mean over every
                   query head: TOVA's shared score), adds it to the accumulated scores (H2O), masks
                   the protected window and takes the arg-min (ties to the lower slot, as
                   torch.argmin) across the programs with one int64 atomic_min: the slot the next
                   token takes.

Each has a torch reference with exactly the ops the methods ran before, the CPU path (so the CPU's
choices do not move); tests/test_kernels_eviction_step.py checks the kernels against them.
"""
from __future__ import annotations

import torch

from . import attention
from ._common import HAVE_TRITON, LOG2E, backend_for, kernel_for, next_pow2, tl, triton

POOLS = ("sum", "mean", "max")

if HAVE_TRITON:

    @triton.jit
    def _put_kernel(K, V, P, A, Slot, Kn, Vn, Position,
                    s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_pb, s_ph, s_pn, s_ab, s_ah, s_an,
                    s_sb, s_sh, s_knb, s_knh, s_vnb, s_vnh, H, D: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = pid % H
        dd = tl.arange(0, D)
        slot = tl.load(Slot + b * s_sb + h * s_sh) & 0xFFFFFFFF   # the low half: the slot (see eviction_decode)
        tl.store(Slot + b * s_sb + h * s_sh, 9223372036854775807)   # eviction_decode's arg-min starts here
        tl.store(K + b * s_kb + h * s_kh + slot * s_kn + dd, tl.load(Kn + b * s_knb + h * s_knh + dd))
        tl.store(V + b * s_vb + h * s_vh + slot * s_vn + dd, tl.load(Vn + b * s_vnb + h * s_vnh + dd))
        tl.store(P + b * s_pb + h * s_ph + slot * s_pn, tl.load(Position))
        tl.store(A + b * s_ab + h * s_ah + slot * s_an, 0.0)

    @triton.jit
    def _row_lse_kernel(Sc, Lse, S, scale2, s_sb, s_sh, HQ, BLOCK: tl.constexpr):
        # one program per (sequence, query head): log2(sum(exp2(scale2 * score))) over the row, online
        pid = tl.program_id(0)
        row = Sc + (pid // HQ).to(tl.int64) * s_sb + (pid % HQ) * s_sh
        offs = tl.arange(0, BLOCK)
        m = tl.full((), float("-inf"), tl.float32)
        acc = tl.zeros((), tl.float32)
        for s0 in range(0, S, BLOCK):
            x = tl.load(row + s0 + offs, mask=s0 + offs < S, other=float("-inf")) * scale2
            m_new = tl.maximum(m, tl.max(x, 0))
            base = tl.where(m_new == float("-inf"), 0.0, m_new)
            acc = acc * tl.exp2(m - base) + tl.sum(tl.exp2(x - base), 0)
            m = m_new
        base = tl.where(m == float("-inf"), 0.0, m)
        tl.store(Lse + pid, tl.where(acc > 0, base + tl.log2(tl.where(acc > 0, acc, 1.0)), float("-inf")))

    @triton.jit
    def _evict_kernel(Sc, Lp, Acc, Pos, Free, Lens, Position, scale2, window,
                      s_sb, s_sh, s_lb, s_lh, s_ab, s_ah, s_pb, s_ph, s_fb, s_fh,
                      H, S, NS,
                      G: tl.constexpr, NR: tl.constexpr, R_PAD: tl.constexpr, NS_PAD: tl.constexpr,
                      BLOCK: tl.constexpr, POOL: tl.constexpr, ACCUM: tl.constexpr, PROTECT: tl.constexpr):
        # Program (b * H + h, c): slots c*BLOCK.. of sequence b, KV head h.
        pid = tl.program_id(0)
        cid = tl.program_id(1)
        b = (pid // H).to(tl.int64)
        h = pid % H
        length = tl.load(Lens + b)
        full = length == S
        row0 = h * G            # G = 0: every program reads every query head (TOVA's shared score)
        rows = tl.arange(0, R_PAD)
        rmask = rows < NR
        ss = tl.arange(0, NS_PAD)
        # each row's log-sum-exp (base 2) from its partial ones (NS of them; one: _row_lse_kernel's)
        lp = tl.load(Lp + b * s_lb + (row0 + rows)[:, None] * s_lh + ss[None, :],
                     mask=rmask[:, None] & (ss < NS)[None, :], other=float("-inf"))
        m = tl.max(lp, 1)
        m = tl.where(m == float("-inf"), 0.0, m)
        lse = tl.where(rmask, m + tl.log2(tl.sum(tl.exp2(lp - m[:, None]), 1)), 0.0)
        offs = cid * BLOCK + tl.arange(0, BLOCK)
        smask = offs < S
        qk = tl.load(Sc + b * s_sb + (row0 + rows)[:, None] * s_sh + offs[None, :],
                     mask=rmask[:, None] & smask[None, :], other=float("-inf"))
        p = tl.where(rmask[:, None], tl.exp2(qk * scale2 - lse[:, None]), 0.0)   # -inf -> 0
        if POOL == 2:
            sc = tl.max(p, 0)
        elif POOL == 1:
            sc = tl.sum(p, 0) / NR
        else:
            sc = tl.sum(p, 0)
        if ACCUM:
            sc = tl.load(Acc + b * s_ab + h * s_ah + offs, mask=smask, other=0.0) + sc
            tl.store(Acc + b * s_ab + h * s_ah + offs, sc, mask=smask)
        if PROTECT:
            pos = tl.load(Pos + b * s_pb + h * s_ph + offs, mask=smask, other=-1)
            sc = tl.where(pos > tl.load(Position) - window, float("inf"), sc)
        # the arg-min across programs: scores are >= 0 (or +inf), whose fp32 bits order as integers, so
        # (bits << 32 | slot) ordered as int64 is (score, slot): its minimum is torch.argmin's choice
        key = (sc.to(tl.int32, bitcast=True).to(tl.int64) << 32) | offs.to(tl.int64)
        key = tl.min(tl.where(smask, key, 9223372036854775807), 0)
        fp = Free + b * s_fb + h * s_fh
        if full:
            tl.atomic_min(fp, key)      # from int64 max, which the put of this step left there
        elif cid == 0:
            tl.store(fp, length.to(tl.int64))


# ----------------------------------------------------------------------------- torch references

def bounded_put_ref(k_store, v_store, pos_store, score_store, slot, k, v, position):
    idx = (slot & 0xFFFFFFFF).unsqueeze(-1)
    D = k.shape[-1]
    k_store.scatter_(2, idx.unsqueeze(-1).expand(-1, -1, 1, D), k)
    v_store.scatter_(2, idx.unsqueeze(-1).expand(-1, -1, 1, D), v)
    pos_store.scatter_(2, idx, position.view(1, 1, 1).expand_as(idx))
    score_store.scatter_(2, idx, 0.0)


def pooled(probs: torch.Tensor, kv_heads: int, pool: str, shared: bool) -> torch.Tensor:
    """Probabilities [B, Hq, N] -> one score per KV head [B, Hkv, N] (the ops of H2O's group_reduce and
    TOVA's score, unchanged)."""
    B, Hq, N = probs.shape
    if shared:
        return probs.mean(1, keepdim=True).expand(B, kv_heads, N)
    grouped = probs.view(B, kv_heads, Hq // kv_heads, N)
    return grouped.amax(2) if pool == "max" else grouped.mean(2) if pool == "mean" else grouped.sum(2)


def eviction_decode_ref(q, k, v, lengths, scale, acc, pos, free, position, *, cap, pool, shared, accumulate,
                        window):
    out, probs = attention.decode_attention_mass(q, k, v, lengths, scale, max_length=cap)
    score = pooled(probs, k.shape[1], pool, shared)
    if accumulate:
        acc += score
        score = acc
    if window is not None:
        score = torch.where(pos > position - window, float("inf"), score)
    victim = score.argmin(-1)
    B = q.shape[0]
    full = (lengths == cap).view(B, 1)
    free.copy_(torch.where(full, victim, lengths.view(B, 1).long()))
    return out


# ----------------------------------------------------------------------------- public ops

def bounded_put(k_store, v_store, pos_store, score_store, slot, k, v, position) -> None:
    """One token per (sequence, KV head) into the slot in the low 32 bits of slot[b, h] (int64 [B, Hkv]):
    k, v [B, Hkv, 1, D] into the layer's k_store, v_store [B, Hkv, cap, D], its position ([1] int64) into
    pos_store and a zero score into score_store [B, Hkv, cap] (`BoundedStore.put`'s four scatters). The
    kernel then sets slot to int64 max, where `eviction_decode`'s arg-min starts."""
    if backend_for(k) == "torch":
        return bounded_put_ref(k_store, v_store, pos_store, score_store, slot, k, v, position)
    B, H, _, D = k.shape
    assert k.stride(-1) == v.stride(-1) == k_store.stride(-1) == v_store.stride(-1) == 1
    assert D == next_pow2(D)
    kernel_for(_put_kernel, k)[(B * H,)](
        k_store, v_store, pos_store, score_store, slot, k, v, position,
        *k_store.stride()[:3], *v_store.stride()[:3], *pos_store.stride(), *score_store.stride(),
        *slot.stride(), k.stride(0), k.stride(1), v.stride(0), v.stride(1), H, D=D, num_warps=1)


def eviction_decode(q, k, v, lengths, scale, acc, pos, free, position, *, cap: int, pool: str = "sum",
                    shared: bool = False, accumulate: bool = False, window: int | None = None) -> torch.Tensor:
    """Decode attention of q [B, Hq, D] over a full-or-filling bounded store k, v [B, Hkv, cap, D]
    (lengths int32 [B]) -> out [B, Hq, D], and the next step's slots into free (int64 [B, Hkv], in place):
    the probabilities pooled per KV head (`pool` over the group, or the mean over every query head when
    `shared`), added into acc ([B, Hkv, cap] fp32, in place) when `accumulate`, slots whose pos > position
    - window protected (+inf) when `window` is set; when a sequence's store is full (length == cap) the
    arg-min slot (ties to the lower slot), else its next empty slot (its length).

    free holds the slot in its low 32 bits: the Triton path writes (score bits << 32 | slot) there, the
    minimum of the programs' keys by atomic_min from the int64 max that `bounded_put` left (so the put
    must run first in the step, as it does); the reference writes the bare slot."""
    if pool not in POOLS:
        raise ValueError(f"unknown pool {pool!r}; one of {POOLS}")
    kw = {"cap": cap, "pool": pool, "shared": shared, "accumulate": accumulate, "window": window}
    if backend_for(q) == "torch":
        return eviction_decode_ref(q, k, v, lengths, scale, acc, pos, free, position, **kw)
    B, Hq, _ = q.shape
    Hkv = k.shape[1]
    out, scores = attention.selection_attention(q, k, v, lengths, scale, max_length=cap)
    assert acc.stride(-1) == pos.stride(-1) == scores.stride(-1) == 1
    lp = torch.empty(B, Hq, 1, device=q.device, dtype=torch.float32)   # one "split": the row's whole lse
    kernel_for(_row_lse_kernel, q)[(B * Hq,)](scores, lp, cap, scale * LOG2E, scores.stride(0), scores.stride(1), Hq,
                                              BLOCK=min(1024, next_pow2(cap)) if q.is_cuda else 16)
    G = Hq // Hkv
    nr = Hq if shared else G
    r_pad = max(2, next_pow2(nr))
    ns = lp.shape[-1]
    block = max(64, min(next_pow2(cap), 4096 // r_pad)) if q.is_cuda else 16
    kernel_for(_evict_kernel, q)[(B * Hkv, -(-cap // block))](
        scores, lp, acc, pos, free, lengths, position, scale * LOG2E, 0 if window is None else int(window),
        scores.stride(0), scores.stride(1), lp.stride(0), lp.stride(1), acc.stride(0), acc.stride(1),
        pos.stride(0), pos.stride(1), free.stride(0), free.stride(1), Hkv, cap, ns,
        G=0 if shared else G, NR=nr, R_PAD=r_pad, NS_PAD=max(2, next_pow2(ns)), BLOCK=block,
        POOL=POOLS.index(pool), ACCUM=accumulate, PROTECT=window is not None, num_warps=4 if q.is_cuda else 1)
    return out
