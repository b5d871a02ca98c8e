"""Triton kernels of kernels/block_sparse_chunk.py (CUDA; the tests run them in the interpreter too).

`_chunk_fwd`, one program per (chunk query block, batch x query head), is kernels/block_sparse_prefill_triton.py's
`_mixed_sparse_fwd` with two changes: before the chunk's pieces and columns the online softmax runs over
every cached key (full tiles unmasked, the last partial one masked by the key count only: cached keys
precede every query), and it stores each row's base-2 log-sum-exp (+inf for a row that saw nothing, so
the mass passes give it 0). It reuses that file's tile helpers (`_free_tile`, `_tile`) rather than
changing its kernel: kernels/block_sparse_prefill_triton.py is the code bench/minference.py measures, and an edit
would stale that committed benchmark.

Mass, under the merged lse of pass 1 (exact: no running-normaliser approximation):
  cache keys  kernels/cascade_attention's `_mass_kernel` itself, launched over the first n keys only
              (its rule "key <= L - T + query" makes them visible to every query);
  chunk keys  `_chunk_mass`, one program per (query block, batch x head) over the same pieces and
              columns as pass 1, w[m] * exp2(s - lse[m]) on the visible pairs, column sums added with
              atomics (a key is listed by many query blocks). fp32 atomics make the low bits of a chunk
              key's mass depend on the order the blocks land in (run to run, on the GPU): ulps, not a
              different quantity; the interpreter's order is fixed.
"""
from __future__ import annotations

import torch

from ._common import LOG2E, kernel_for, next_pow2, tl, triton
from .block_sparse_prefill import WIDE
from .block_sparse_prefill_triton import CONFIG, _free_tile, _tile
from .cascade_attention import _mass_kernel

CACHE_BLOCK = 64          # _mass_kernel's tiles on CUDA (as strided_attention launches it)
NO_WINDOW = tl.constexpr(WIDE)   # a jit function reads a global only as a constexpr


@triton.jit
def _chunk_fwd(Q, Kc, Vc, Kx, Vx, Out, Lse, BStart, BEnd, BCount, BFree, CIdx, CCount, Init, Local, Pairs,
               NC, T, qk_scale, NQ, CB, CC,
               s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_ot, s_oh, HQ, G,
               BS: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
               UPCAST: tl.constexpr, OFF64: tl.constexpr, FAST: tl.constexpr):
    i = tl.program_id(0)                      # chunk query block (chunk-local rows i*BS ..)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    h64 = h.to(tl.int64)
    ar = tl.arange(0, BM)
    rows = i * BS + ar
    rvalid = (ar < BS) & (rows < T)
    t = rows.to(tl.int64)
    dd = tl.arange(0, BD)
    dmask = dd < D
    q = tl.load(Q + b * s_qb + h64 * s_qh + t[:, None] * s_qt + dd[None, :], mask=rvalid[:, None] & dmask[None, :],
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kvh = h64 // G
    m_i = tl.full((BM,), -1e30, tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    # the cache, dense: full tiles need no mask; the last one only the key count (rows + NC: every
    # cached key is "before" every row, so _tile's causal test passes; no window)
    kc = Kc + b * s_kb + kvh * s_kh
    vc = Vc + b * s_vb + kvh * s_vh
    n_full = NC // BM * BM
    for c0 in range(0, n_full, BM):
        acc, m_i, l_i = _free_tile(acc, m_i, l_i, q, kc, vc, c0 + ar, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST,
                                   OFF64)
    pairs = tl.sum(rvalid.to(tl.int32), 0) * 0
    if n_full < NC:
        cols = n_full + ar
        acc, m_i, l_i, pairs = _tile(acc, m_i, l_i, pairs, q, kc, vc, cols, cols < NC, rows + NC, rvalid, 0, NO_WINDOW,
                                     0, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST, OFF64, False, False)
    # the chunk's own keys under the index: _mixed_sparse_fwd's two stages and its columns
    kx = Kx + b * s_kb + kvh * s_kh
    vx = Vx + b * s_vb + kvh * s_vh
    init = tl.load(Init + h)
    local = tl.load(Local + h)
    lin = bh.to(tl.int64) * NQ + i
    nb = tl.load(BCount + lin)
    lst = BStart + lin * CB
    if FAST:
        nf = tl.load(BFree + lin)
    else:
        nf = nb * 0
    for j in range(nf):
        cols = tl.load(lst + j) + ar
        acc, m_i, l_i = _free_tile(acc, m_i, l_i, q, kx, vx, cols, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST,
                                   OFF64)
    pairs = tl.sum(rvalid.to(tl.int32), 0) * nf * BS
    for j in range(nf, nb):
        start = tl.load(lst + j)
        end = tl.load(BEnd + lin * CB + j)
        cols = start + ar
        acc, m_i, l_i, pairs = _tile(acc, m_i, l_i, pairs, q, kx, vx, cols, cols < end, rows, rvalid, init, local,
                                     0, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST, OFF64, True, False)
    nc = tl.load(CCount + lin)
    for c0 in range(0, nc, BM):
        live = c0 + ar < nc
        cols = tl.load(CIdx + lin * CC + c0 + ar, mask=live, other=0)
        acc, m_i, l_i, pairs = _tile(acc, m_i, l_i, pairs, q, kx, vx, cols, live, rows, rvalid, init, local,
                                     0, s_kn, s_vn, dd, qk_scale, D, BD, PREC, UPCAST, OFF64, True, False)
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(Out + b * s_ob + t[:, None] * s_ot + h64 * s_oh + dd[None, :], (acc / l_safe[:, None]).to(
        Out.dtype.element_ty), mask=rvalid[:, None] & dmask[None, :])
    tl.store(Lse + bh.to(tl.int64) * T + t, tl.where(seen, m_i + tl.log2(l_safe), float("inf")), mask=rvalid)
    tl.store(Pairs + lin, pairs)


@triton.jit
def _mass_tile(q, k_base, out_base, cols, kmask, rows, rvalid, lse, w, init, local, s_kn, dd, qk_scale,
               D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, OFF64: tl.constexpr):
    """Keys `cols` (kmask: which exist): sum over the rows of w * p on the pairs _tile attends, added to
    out_base[cols]."""
    off = cols.to(tl.int64) if OFF64 else cols
    lmask = kmask[:, None] if BD == D else kmask[:, None] & (dd[None, :] < D)
    k = tl.load(k_base + off[:, None] * s_kn + dd[None, :], mask=lmask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    dist = rows[:, None] - cols[None, :]
    vis = rvalid[:, None] & kmask[None, :] & (dist >= 0) & ((dist < local) | (cols[None, :] < init))
    p = tl.where(vis, tl.exp2(s - lse[:, None]), 0.0) * w[:, None]
    tl.atomic_add(out_base + off, tl.sum(p, 0), mask=kmask)


@triton.jit
def _chunk_mass(Q, Kx, Lse, W, Mass, BStart, BEnd, BCount, CIdx, CCount, Init, Local,
                NC, T, L, qk_scale, NQ, CB, CC, s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, HQ, G,
                BS: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
                UPCAST: tl.constexpr, OFF64: tl.constexpr):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    h64 = h.to(tl.int64)
    ar = tl.arange(0, BM)
    rows = i * BS + ar
    rvalid = (ar < BS) & (rows < T)
    t = rows.to(tl.int64)
    dd = tl.arange(0, BD)
    q = tl.load(Q + b * s_qb + h64 * s_qh + t[:, None] * s_qt + dd[None, :],
                mask=rvalid[:, None] & (dd[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    lse = tl.load(Lse + bh.to(tl.int64) * T + t, mask=rvalid, other=float("inf"))
    w = tl.load(W + t, mask=rvalid, other=0.0)
    kx = Kx + b * s_kb + (h64 // G) * s_kh
    out = Mass + bh.to(tl.int64) * L + NC             # the chunk's columns of [B, Hq, L]
    init = tl.load(Init + h)
    local = tl.load(Local + h)
    lin = bh.to(tl.int64) * NQ + i
    nb = tl.load(BCount + lin)
    for j in range(nb):                               # every piece masked: this pass is not the hot one
        start = tl.load(BStart + lin * CB + j)
        end = tl.load(BEnd + lin * CB + j)
        cols = start + ar
        _mass_tile(q, kx, out, cols, cols < end, rows, rvalid, lse, w, init, local, s_kn, dd, qk_scale,
                   D, BD, PREC, UPCAST, OFF64)
    nc = tl.load(CCount + lin)
    for c0 in range(0, nc, BM):
        live = c0 + ar < nc
        cols = tl.load(CIdx + lin * CC + c0 + ar, mask=live, other=0)
        _mass_tile(q, kx, out, cols, live, rows, rvalid, lse, w, init, local, s_kn, dd, qk_scale,
                   D, BD, PREC, UPCAST, OFF64)


def chunk_attention_triton(q, keys, values, n: int, idx, scale: float, weights):
    """The three passes (module docstring); arguments and result as minference_cascade.chunk_attention."""
    B, Hq, T, D = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    assert L == n + T and idx.q_start == 0 and idx.q_len == T and idx.first_block == 0
    assert D == next_pow2(D) and D >= 16, "head_dim must be a power of two >= 16 (kernels/cascade_attention)"
    assert q.stride(-1) == 1 and keys.stride(-1) == 1 and values.stride(-1) == 1
    dev, nq = q.device, idx.block_count.shape[-1]
    out = torch.empty(B, T, Hq, D, device=dev, dtype=q.dtype)
    lse = torch.empty(B, Hq, T, device=dev, dtype=torch.float32)
    pairs = torch.zeros(B, Hq, nq, device=dev, dtype=torch.int32)
    upcast = not q.is_cuda            # the interpreter: fp32 dots (numpy has no bf16 matmul)
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    bstart, bend, bcount, bfree, cidx, ccount = (t.contiguous() for t in (
        idx.block_start, idx.block_end, idx.block_count, idx.block_free, idx.column_index, idx.column_count))
    bm = max(16, next_pow2(idx.block))
    off64 = max(keys.stride(2), values.stride(2)) * L >= 2**31
    kx, vx = keys[:, :, n:], values[:, :, n:]
    launch = {"num_warps": CONFIG["num_warps"], "num_stages": CONFIG["num_stages"]} if q.is_cuda else {}
    kstr = (keys.stride(0), keys.stride(1), keys.stride(2))
    vstr = (values.stride(0), values.stride(1), values.stride(2))   # a first chunk's v is the projection's view
    common = {"BS": idx.block, "BM": bm, "D": D, "BD": D, "PREC": prec, "UPCAST": upcast, "OFF64": off64}
    kernel_for(_chunk_fwd, q)[(nq, B * Hq)](
        q, keys, values, kx, vx, out, lse, bstart, bend, bcount, bfree, cidx, ccount, idx.init, idx.local, pairs,
        n, T, scale * LOG2E, nq, bstart.shape[-1], cidx.shape[-1], q.stride(0), q.stride(1), q.stride(2), *kstr,
        *vstr, out.stride(0), out.stride(1), out.stride(2), Hq, Hq // Hkv, FAST=bm == idx.block, **common, **launch)
    mass = torch.empty(B, Hq, L, device=dev, dtype=torch.float32)
    w = weights.to(device=dev, dtype=torch.float32).contiguous()
    if n:
        bn = CACHE_BLOCK if q.is_cuda else 16
        kernel_for(_mass_kernel, q)[(B * Hq, triton.cdiv(n, bn))](
            q, keys, lse, w, mass, T, L, scale * LOG2E, q.stride(0), q.stride(1), q.stride(2), *kstr, Hq, Hq // Hkv,
            D=D, BM=bn, BN=bn, PREC=prec, UPCAST=upcast, num_warps=4)
    mass[:, :, n:].zero_()            # after _mass_kernel: its last key block may run past n
    kernel_for(_chunk_mass, q)[(nq, B * Hq)](
        q, kx, lse, w, mass, bstart, bend, bcount, cidx, ccount, idx.init, idx.local, n, T, L, scale * LOG2E, nq,
        bstart.shape[-1], cidx.shape[-1], q.stride(0), q.stride(1), q.stride(2), *kstr, Hq, Hq // Hkv, **common,
        **launch)
    return out.view(B, T, Hq * D), mass, pairs.sum(dtype=torch.int64)
