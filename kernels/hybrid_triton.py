"""Triton kernels of kernels/hybrid.py (CUDA; the tests run them in the interpreter too).

Hybrid-head decode (LycheeDecode Appendix C / the reference's TileLang
tilelang_sparse_gqa_decode_varlen_indice_hybrid_head.py, rewritten for Triton): ONE grid of
(work item, batch) programs, where the work items of a sequence are every (KV head, split) pair:
retrieval heads are cut into NS_FULL splits of CHUNK slots over the whole cache, sparse heads into
NS_SPARSE splits of CHUNK index entries (tokens, or blocks of PAGE slots). Every program reads about
CHUNK K/V rows whatever its head kind, so the work is balanced across heads (the reference's
num_split_full ~ num_split_sparse x total_blocks / selected_blocks). A program serves the whole GQA
group of its KV head (K/V rows loaded once). One combine merges each head's own number of splits.

Retrieval scores: q̄·K (q̄ = the group-mean query, unscaled) for the KV heads listed in `heads`,
per slot or max-pooled per block of POOL slots (the reference's attn_with_pool_verlen).
"""
from __future__ import annotations

import torch

from ._common import LOG2E, kernel_for, next_pow2, num_sms, tl, triton


def _empty(*shape, device, dtype):
    """Every buffer the kernels must fill comes from here (tests swap in a NaN-filled version)."""
    return torch.empty(*shape, device=device, dtype=dtype)


# programs_per_sm 2 (was 4): the H100 sweep of notes/kernels.md over the lychee_block 128K layer mix
# (13 layers of 0, 12 of 1, 6 of 2, 1 of 8 retrieval heads): 1.12 ms a step at 2, 1.28 at 4, 1.33 at 8
CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": 2.0}
CPU_BLOCK_N = 32


@triton.jit
def _head_of(w, RET_MASK, NS_FULL, NS_SPARSE, HKV: tl.constexpr):
    """Work item w -> (KV head, split, is_retrieval, rank among the retrieval heads) for the layout:
    heads in order, each taking NS_FULL (retrieval, bit h of RET_MASK) or NS_SPARSE consecutive
    work items."""
    start = 0
    head = -1
    split = 0
    is_ret = 0
    rank = 0
    n_before = 0
    for h in tl.static_range(HKV):
        r = (RET_MASK >> h) & 1
        n = tl.where(r == 1, NS_FULL, NS_SPARSE)
        inside = (w >= start) & (w < start + n)
        head = tl.where(inside, h, head)
        split = tl.where(inside, w - start, split)
        is_ret = tl.where(inside, r, is_ret)
        rank = tl.where(inside, n_before, rank)
        n_before += r
        start += n
    return head, split, is_ret, rank


@triton.jit
def _store_scores(row, start, s, NB_OUT, BLOCK_N: tl.constexpr, POOL: tl.constexpr):
    """Scores s [BLOCK_N] of slots start.. into a score row: per slot, or max-pooled per POOL slots."""
    if POOL == 1:
        offs = start + tl.arange(0, BLOCK_N)
        tl.store(row + offs, s, mask=offs < NB_OUT)
    else:
        blocks = start // POOL + tl.arange(0, BLOCK_N // POOL)
        tl.store(row + blocks, tl.max(tl.reshape(s, (BLOCK_N // POOL, POOL)), 1), mask=blocks < NB_OUT)


@triton.jit
def _hybrid_kernel(Q, K, V, Lens, Idx, Cnt, Op, Lp, Sc, qk_scale, RET_MASK, NS_FULL, NS_SPARSE, CHUNK, NSMAX,
                   NB_OUT, SINK, RECENT, s_qb, s_qh, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ib, s_ih, s_cb, s_sb, s_sh,
                   HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                   BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                   POOL: tl.constexpr, FORCE: tl.constexpr = 0):
    # POOL > 0: retrieval programs also write their slots' selection scores (q̄·K unscaled = the mean
    # of the group's q·K rows, max-pooled per POOL slots) to row `rank` of Sc, -inf past the length:
    # the retrieval heads' keys are read once for attention and selection (BLOCK_N % POOL == 0).
    # FORCE (POOL == 1): the first SINK and last RECENT slots below the length score +inf (LycheeDecode's
    # forced tokens, which the top-k then takes first); 2: every other slot -inf (only the forced ones)
    w = tl.program_id(0)
    b = tl.program_id(1)
    kvh, sid, is_ret, rank = _head_of(w, RET_MASK, NS_FULL, NS_SPARSE, HKV)
    b64 = b.to(tl.int64)
    rows = tl.arange(0, G_PAD)
    rmask = rows < G
    dd = tl.arange(0, D)
    qh0 = kvh * G
    q = tl.load(Q + b64 * s_qb + (qh0 + rows)[:, None] * s_qh + dd[None, :], mask=rmask[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kbase = K + b64 * s_kb + kvh * s_kh
    vbase = V + b64 * s_vb + kvh * s_vh
    length = tl.load(Lens + b)
    ibase = Idx + b64 * s_ib + kvh * s_ih
    if is_ret == 1:
        n_slots = length
    else:
        n_slots = tl.load(Cnt + b64 * s_cb + kvh) * PAGE
    lo = sid * CHUNK
    hi = tl.minimum(lo + CHUNK, n_slots)
    m_i = tl.full((G_PAD,), -1e30, tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        smask = offs < hi
        if is_ret == 1:
            pos = offs
        else:
            pg = tl.load(ibase + offs // PAGE, mask=smask, other=0)
            pos = pg * PAGE + offs % PAGE
        valid = smask & (pos < length)
        k = tl.load(kbase + pos[:, None] * s_kn + dd[None, :], mask=valid[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC)
        # nested: the constexpr test must drop the body at compile time (POOL 0 would divide by it)
        if POOL > 0:  # noqa: SIM102
            if is_ret == 1:
                sc = tl.where(valid, tl.sum(tl.where(rmask[:, None], qk, 0.0), 0) / G, float("-inf"))
                if FORCE > 0:
                    forced = valid & ((pos < SINK) | (pos >= length - RECENT))
                    if FORCE == 2:
                        sc = tl.where(forced, float("inf"), float("-inf"))
                    else:
                        sc = tl.where(forced, float("inf"), sc)
                _store_scores(Sc + b64 * s_sb + rank * s_sh, start, sc, NB_OUT, BLOCK_N, POOL)
        s = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vv = tl.load(vbase + pos[:, None] * s_vn + dd[None, :], mask=valid[:, None], other=0.0)
        pv = p.to(vv.dtype)
        if UPCAST:
            pv = pv.to(tl.float32)
            vv = vv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, vv, input_precision=PREC)
        m_i = m_new
    if POOL > 0:  # noqa: SIM102 (as above)
        if is_ret == 1:  # this split's tiles past the length (the loop stopped at it): -inf
            done = lo + tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N) * BLOCK_N
            for start in range(done, tl.minimum(lo + CHUNK, NB_OUT * POOL), BLOCK_N):
                _store_scores(Sc + b64 * s_sb + rank * s_sh, start, tl.full((BLOCK_N,), float("-inf"), tl.float32),
                              NB_OUT, BLOCK_N, POOL)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    prow = (b64 * (HKV * G) + qh0 + rows) * NSMAX + sid
    tl.store(Op + prow[:, None] * D + dd[None, :], o, mask=rmask[:, None])
    tl.store(Lp + prow, lse, mask=rmask)


@triton.jit
def _hybrid_combine_kernel(Op, Lp, Out, RET_MASK, NS_FULL, NS_SPARSE, NSMAX, s_ob, s_oh,
                           HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    # one program per (batch, query head): merge that head's own number of splits (the others were
    # never written) in ONE pass with a running max: a retrieval head of a mostly sparse layer has
    # hundreds of splits, and two dependent passes over them made this kernel latency-bound (22 us
    # a layer at 128K on the H100, against 7 us for the dense decode's combine)
    pid = tl.program_id(0)
    b = pid // HQ
    h = pid % HQ
    r = (RET_MASK >> (h // G)) & 1
    ns = tl.where(r == 1, NS_FULL, NS_SPARSE)
    ss = tl.arange(0, BLOCK_S)
    dd = tl.arange(0, D)
    lp = Lp + pid.to(tl.int64) * NSMAX
    op = Op + pid.to(tl.int64) * NSMAX * D
    m = tl.full((), float("-inf"), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    den = tl.zeros((), tl.float32)
    for s0 in range(0, ns, BLOCK_S):
        smask = s0 + ss < ns
        lse = tl.load(lp + s0 + ss, mask=smask, other=float("-inf"))
        o = tl.load(op + (s0 + ss)[:, None] * D + dd[None, :], mask=smask[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 0))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # every split so far empty: weights 0, no NaN
        alpha = tl.exp2(m - base)
        wgt = tl.exp2(lse - base)
        acc = acc * alpha + tl.sum(wgt[:, None] * o, 0)
        den = den * alpha + tl.sum(wgt, 0)
        m = m_new
    out = acc / tl.where(den > 0, den, 1.0)
    tl.store(Out + b.to(tl.int64) * s_ob + h * s_oh + dd, out.to(Out.dtype.element_ty))


def plan(n_ret: int, n_sparse: int, slots_full: int, slots_sparse: int, batch: int, block: int, sms: int,
         programs_per_sm: float, chunk: int | None = None) -> tuple[int, int, int]:
    """(CHUNK, NS_FULL, NS_SPARSE): one chunk size for both head kinds (balanced work per program),
    small enough that the grid covers the machine `programs_per_sm` times."""
    if chunk is None:
        work = n_ret * slots_full + n_sparse * slots_sparse
        target = max(1, int(sms * programs_per_sm) // max(1, batch))
        chunk = max(block, -(-work // target))
    chunk = -(-chunk // block) * block
    return chunk, max(1, -(-slots_full // chunk)), max(1, -(-slots_sparse // chunk))


def hybrid_decode_triton(q, k, v, lengths, retrieval, index, counts, scale, *, max_length=None, page=1,
                         roles=None, config=None, chunk=None, score_block=None, score_force=None):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert D >= 16 and D == next_pow2(D), "head dim must be a power of two >= 16"
    assert Hkv <= 31, "the retrieval mask is a 32-bit int"
    if roles is None:  # host roles (graph capture needs them from the caller): one sync otherwise
        roles = tuple(bool(x) for x in retrieval.tolist())
    ret_mask = sum(1 << h for h, r in enumerate(roles) if r)
    n_ret = sum(roles)
    cfg = dict(CONFIG, **(config or {}))
    block = cfg["block_n"] if q.is_cuda else CPU_BLOCK_N
    pool = int(score_block or 0)
    if pool:
        assert pool == next_pow2(pool), "the pooling block must be a power of two"
        block = max(block, pool)  # a pooled block never straddles two tiles
    sink, recent, only = score_force or (0, 0, False)
    assert score_force is None or pool == 1, "forced slots are token scores (score_block 1)"
    S = int(max_length) if max_length is not None else int(lengths.max())
    if index is None:   # every program is a retrieval one and reads no index: `lengths` stands in (no launch)
        assert n_ret == Hkv, "index may be None only when every head is a retrieval head"
        index = counts = lengths
        s_ib = s_ih = s_cb = slots_sparse = 0
    else:
        s_ib, s_ih, s_cb = index.stride(0), index.stride(1), counts.stride(0)
        slots_sparse = index.shape[-1] * page
    ch, ns_full, ns_sparse = plan(n_ret, Hkv - n_ret, S, slots_sparse, B, block, num_sms(q), cfg["programs_per_sm"],
                                  chunk)
    nsmax = max(ns_full if n_ret else 1, ns_sparse if n_ret < Hkv else 1)
    n_work = n_ret * ns_full + (Hkv - n_ret) * ns_sparse
    op = _empty(B, Hq, nsmax, D, device=q.device, dtype=torch.float32)
    lp = _empty(B, Hq, nsmax, device=q.device, dtype=torch.float32)
    nb_out = -(-S // pool) if pool else 1
    scores = _empty(B, n_ret if pool else 1, nb_out, device=q.device, dtype=torch.float32)
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    kernel_for(_hybrid_kernel, q)[(n_work, B)](
        q, k, v, lengths, index, counts, op, lp, scores, scale * LOG2E, ret_mask, ns_full, ns_sparse, ch, nsmax,
        nb_out, int(sink), int(recent), q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), s_ib, s_ih, s_cb, scores.stride(0),
        scores.stride(1), HKV=Hkv, G=G, G_PAD=max(16, next_pow2(G)), D=D, BLOCK_N=block, PAGE=page, PREC=prec,
        UPCAST=upcast, POOL=pool, FORCE=0 if score_force is None else 2 if only else 1,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    out = _empty(B, Hq, D, device=q.device, dtype=q.dtype)
    kernel_for(_hybrid_combine_kernel, op)[(B * Hq,)](
        op, lp, out, ret_mask, ns_full, ns_sparse, nsmax, out.stride(0), out.stride(1),
        HQ=Hq, G=G, D=D, BLOCK_S=64, num_warps=4)
    return (out, scores) if pool else out


@triton.jit
def _scores_kernel(Q, K, Lens, Heads, Sc, NB_OUT, s_qb, s_qh, s_kb, s_kh, s_kn, s_sb, s_sh,
                   N: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                   BLOCK_N: tl.constexpr, POOL: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // N
    i = pid % N
    b64 = b.to(tl.int64)
    kvh = tl.load(Heads + i)
    rows = tl.arange(0, G_PAD)
    dd = tl.arange(0, D)
    q = tl.load(Q + b64 * s_qb + (kvh * G + rows)[:, None] * s_qh + dd[None, :], mask=(rows < G)[:, None],
                other=0.0).to(tl.float32)
    qbar = tl.sum(q, 0) / G
    length = tl.load(Lens + b)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = offs < length
    k = tl.load(K + b64 * s_kb + kvh * s_kh + offs[:, None] * s_kn + dd[None, :], mask=valid[:, None],
                other=0.0).to(tl.float32)
    s = tl.where(valid, tl.sum(k * qbar[None, :], 1), float("-inf"))
    out = Sc + b64 * s_sb + i * s_sh
    if POOL == 1:
        tl.store(out + offs, s, mask=offs < NB_OUT)
    else:
        blocks = tl.program_id(1) * (BLOCK_N // POOL) + tl.arange(0, BLOCK_N // POOL)
        pooled = tl.max(tl.reshape(s, (BLOCK_N // POOL, POOL)), 1)
        tl.store(out + blocks, pooled, mask=blocks < NB_OUT)


def retrieval_scores_triton(q, k, lengths, heads, max_length, block):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    S = int(max_length) if max_length is not None else int(lengths.max())
    n = heads.numel()
    pool = max(1, int(block))
    assert pool == next_pow2(pool), "the pooling block must be a power of two"
    bn = max(pool, 64 if q.is_cuda else 32)
    nb_out = -(-S // pool)
    out = _empty(B, n, nb_out, device=q.device, dtype=torch.float32)
    if n == 0:
        return out
    kernel_for(_scores_kernel, q)[(B * n, triton.cdiv(S, bn))](
        q, k, lengths, heads, out, nb_out, q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        out.stride(0), out.stride(1), N=n, G=G, G_PAD=max(2, next_pow2(G)), D=D, BLOCK_N=bn, POOL=pool,
        num_warps=4)
    return out
