"""Triton kernel of kernels/block_sparse_prefill.py (CUDA; the tests run it in the interpreter too).

One program per (query block, batch x query head), as the reference's
`_triton_mixed_sparse_attn_fwd_kernel`: load the block's queries once, then flash attention with an
online softmax (base 2) over the head's key blocks (contiguous loads of at most BLOCK keys each), then
over its single columns (gathered loads, BM at a time). Two stages as the FlashAttention Triton tutorial:
the block's first `block_free` pieces (kernels/block_sparse_prefill.py `_free`: BS keys, causal for every row of
the block, inside the head's window) run unmasked (no mask on the loads, no visibility test; with
`pair` two of them per 2*BS-key tile); every other tile is masked by the same rule: the key exists
(inside its piece / a live column), is causal for the row, and lies in the head's window (row - key
< LOCAL or key < INIT; LOCAL is huge for every head but A-shape). Rows of a partial query block (a
chunk starting mid-block, a prompt that is not a multiple of the block) are masked in the masked
stage; the unmasked stage computes them on zero queries and never stores them. With COUNT the
program also stores how many (row, key) pairs it attended (BS x its valid rows per unmasked piece,
the mask's sum per masked tile): the method's density statistic comes from what the kernel did, not
from a separate mask.
"""
from __future__ import annotations

import torch

from ._common import LOG2E, kernel_for, next_pow2, tl, triton

# Tiles of 64 queries x 64 keys as the reference (BLOCK_M = BLOCK_N = 64). The launch is the reference's too
# (4 warps, 2 stages, one piece per tile), chosen by timing: `python -m bench.minference --tune` on the H100
# (Triton 3.6, Llama-3.1-8B shape, 65K tokens, kernel alone) gave 0.087 s against 0.180 s for 8 warps on the
# index estimated from random q/k, and 0.022 s against 0.048 s on the nearest-diagonal index; 3 stages were level,
# 1 stage and pair (two pieces per 64 x 128-key tile) slower. It spills some registers at D = 128
# (ptxas -v) and is faster anyway. Every call takes config= to override these.
CONFIG = {"num_warps": 4, "num_stages": 2, "pair": False}


@triton.jit
def _update(acc, m_i, l_i, s, v, PREC: tl.constexpr):
    """Scores s [BM, keys] (base 2, -inf where hidden) and values v into the running softmax."""
    m_new = tl.maximum(m_i, tl.max(s, 1))        # m_i starts finite: a row with nothing visible stays 0
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return acc, m_new, l_i


@triton.jit
def _free_tile(acc, m_i, l_i, q, k_base, v_base, cols, s_kn, s_vn, dd, qk_scale, D: tl.constexpr,
               BD: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, OFF64: tl.constexpr):
    """Keys `cols` that exist and are visible to every row: no mask (but the head dim's padding)."""
    off = cols.to(tl.int64) if OFF64 else cols
    if BD == D:
        k = tl.load(k_base + off[:, None] * s_kn + dd[None, :])
        v = tl.load(v_base + off[:, None] * s_vn + dd[None, :])
    else:
        k = tl.load(k_base + off[:, None] * s_kn + dd[None, :], mask=dd[None, :] < D, other=0.0)
        v = tl.load(v_base + off[:, None] * s_vn + dd[None, :], mask=dd[None, :] < D, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    return _update(acc, m_i, l_i, s, v, PREC)


@triton.jit
def _tile(acc, m_i, l_i, pairs, q, k_base, v_base, cols, kmask, rows, rvalid, init, local, dense_below, s_kn, s_vn,
          dd, qk_scale, D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
          OFF64: tl.constexpr, COUNT: tl.constexpr, OUTSIDE: tl.constexpr):
    """One tile of keys `cols` [BN] (kmask: which exist) into the running softmax of the rows."""
    # int32 key offsets unless a head's keys span 2^31 elements (64-bit offset tensors cost registers:
    # the sm_90 build spilled with them)
    off = cols.to(tl.int64) if OFF64 else cols
    lmask = kmask[:, None] if BD == D else kmask[:, None] & (dd[None, :] < D)
    k = tl.load(k_base + off[:, None] * s_kn + dd[None, :], mask=lmask, other=0.0)
    v = tl.load(v_base + off[:, None] * s_vn + dd[None, :], mask=lmask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    dist = rows[:, None] - cols[None, :]
    win = (dist < local) | (cols[None, :] < init)
    if OUTSIDE:   # BigBird's columns: exactly the keys the window rule hides, for the rows not dense
        vis = rvalid[:, None] & kmask[None, :] & (dist >= 0) & ~win & (rows[:, None] >= dense_below)
    else:         # rows below dense_below see every listed key (BigBird's first `budget` rows)
        vis = rvalid[:, None] & kmask[None, :] & (dist >= 0) & (win | (rows[:, None] < dense_below))
    s = tl.where(vis, s, float("-inf"))
    acc, m_i, l_i = _update(acc, m_i, l_i, s, v, PREC)
    if COUNT:
        pairs += tl.sum(tl.sum(vis.to(tl.int32), 1), 0)
    return acc, m_i, l_i, pairs


@triton.jit
def _mixed_sparse_fwd(Q, K, V, Out, BStart, BEnd, BCount, BFree, CIdx, CCount, Init, Local, Pairs,
                      q_start, T, dense_below, qk_scale, FIRST, NQ, CB, CC,
                      s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_ot, s_oh, HQ, G,
                      BS: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                      PREC: tl.constexpr, UPCAST: tl.constexpr, OFF64: tl.constexpr, COUNT: tl.constexpr,
                      FAST: tl.constexpr, PAIR: tl.constexpr, COL_OUTSIDE: tl.constexpr):
    i = tl.program_id(0)                      # query block FIRST + i (absolute positions // BS)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    h64 = h.to(tl.int64)                      # h * (T * D) passes 2^31 at 1M tokens
    ar = tl.arange(0, BM)                     # BM = BS rounded up to a power of two >= 16
    rows = (FIRST + i) * BS + ar
    rvalid = (ar < BS) & (rows >= q_start) & (rows < q_start + T)
    t = (rows - q_start).to(tl.int64)
    dd = tl.arange(0, BD)
    dmask = dd < D
    q = tl.load(Q + b * s_qb + h64 * s_qh + t[:, None] * s_qt + dd[None, :], mask=rvalid[:, None] & dmask[None, :],
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * s_kb + (h64 // G) * s_kh
    v_base = V + b * s_vb + (h64 // G) * s_vh
    init = tl.load(Init + h)
    local = tl.load(Local + h)
    lin = bh.to(tl.int64) * NQ + i
    m_i = tl.full((BM,), -1e30, tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    nb = tl.load(BCount + lin)
    lst = BStart + lin * CB
    if FAST:                                  # BM == BS: a free piece fills a tile
        nf = tl.load(BFree + lin)
    else:
        nf = nb * 0
    if PAIR:                                  # stage 1, two free pieces per tile (an odd last one: stage 2)
        nf = nf // 2 * 2
        a2 = tl.arange(0, 2 * BM)
        for j in range(0, nf, 2):
            s0 = tl.load(lst + j)
            s1 = tl.load(lst + j + 1)
            cols = tl.where(a2 < BM, s0 + a2, s1 + a2 - BM)
            acc, m_i, l_i = _free_tile(acc, m_i, l_i, q, k_base, v_base, cols, s_kn, s_vn, dd, qk_scale,
                                       D, BD, PREC, UPCAST, OFF64)
    else:                                     # stage 1: free pieces, unmasked
        for j in range(nf):
            cols = tl.load(lst + j) + ar
            acc, m_i, l_i = _free_tile(acc, m_i, l_i, q, k_base, v_base, cols, s_kn, s_vn, dd, qk_scale,
                                       D, BD, PREC, UPCAST, OFF64)
    pairs = tl.sum(rvalid.to(tl.int32), 0) * nf * BS      # closed form of stage 1's pairs
    for j in range(nf, nb):                   # stage 2: the other pieces (contiguous, at most BS keys), masked
        start = tl.load(lst + j)
        end = tl.load(BEnd + lin * CB + j)
        cols = start + ar
        acc, m_i, l_i, pairs = _tile(acc, m_i, l_i, pairs, q, k_base, v_base, cols, cols < end, rows, rvalid,
                                     init, local, dense_below, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST, OFF64,
                                     COUNT, False)
    nc = tl.load(CCount + lin)
    for c0 in range(0, nc, BM):               # single columns, gathered BM at a time
        live = c0 + ar < nc
        cols = tl.load(CIdx + lin * CC + c0 + ar, mask=live, other=0)
        acc, m_i, l_i, pairs = _tile(acc, m_i, l_i, pairs, q, k_base, v_base, cols, live, rows, rvalid,
                                     init, local, dense_below, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST, OFF64,
                                     COUNT, COL_OUTSIDE)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + b * s_ob + t[:, None] * s_ot + h64 * s_oh + dd[None, :], out.to(Out.dtype.element_ty),
             mask=rvalid[:, None] & dmask[None, :])
    if COUNT:
        tl.store(Pairs + lin, pairs)


def mixed_sparse_attention_triton(q, k, v, idx, scale: float, count: bool = False, config: dict | None = None):
    """The kernel over a kernels.block_sparse_prefill.SparseIndex; see mixed_sparse_attention. `config` overrides
    entries of CONFIG (num_warps, num_stages: CUDA launch only; pair)."""
    cfg = {**CONFIG, **(config or {})}
    if set(cfg) != set(CONFIG):
        raise ValueError(f"config keys must be among {sorted(CONFIG)}, got {sorted(config)}")
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    assert T == idx.q_len and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    nq = idx.block_count.shape[-1]
    out = torch.empty(B, T, Hq, D, device=q.device, dtype=q.dtype)
    pairs = torch.zeros(B, Hq, nq, device=q.device, dtype=torch.int32) if count else idx.block_count
    upcast = not q.is_cuda            # the interpreter: fp32 dots (numpy has no bf16 matmul)
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    lists = [t.contiguous() for t in (idx.block_start, idx.block_end, idx.block_count, idx.block_free,
                                      idx.column_index, idx.column_count)]
    bm = max(16, next_pow2(idx.block))
    launch = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]} if q.is_cuda else {}
    kernel_for(_mixed_sparse_fwd, q)[(nq, B * Hq)](
        q, k, v, out, *lists, idx.init, idx.local, pairs,
        idx.q_start, T, idx.dense_below, scale * LOG2E, idx.first_block, nq, idx.block_start.shape[-1], idx.column_index.shape[-1],
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), Hq, Hq // Hkv,
        BS=idx.block, BM=bm, D=D, BD=max(16, next_pow2(D)), PREC=prec, UPCAST=upcast,
        OFF64=max(k.stride(2), v.stride(2)) * k.shape[2] >= 2**31, COUNT=count, FAST=bm == idx.block,
        PAIR=bool(cfg["pair"]) and bm == idx.block, COL_OUTSIDE=idx.columns_outside, **launch)
    out = out.view(B, T, Hq * D)
    return (out, pairs) if count else out
