"""Strided-prefill attention of MInference + Cascade (methods/minference_cascade.py): a chunk of T queries
over L = n + T keys, [the n keys already cached (sinks + cascades) | the chunk's own T keys], where
every query attends every cached key (dense: they all precede the chunk) and the chunk's own keys under
a MInference block/column index built over the chunk alone (kernels/block_sparse_prefill.SparseIndex with
q_start 0 and N = T: chunk-local rows and keys, causal, an A-shape head's window in chunk coordinates).
One softmax over the union (the two parts merged by log-sum-exp: the kernel's online softmax runs over
the cache tiles, then over the chunk's pieces and columns). Returns

    out   [B, T, Hq*D]  (q's dtype)
    mass  [B, Hq, L]    fp32: sum over queries m of w[m] * softmax_m(key), under that merged normaliser;
                        a chunk key gets mass only from the (query, key) pairs the index attended
    pairs int64 scalar: (query, chunk key) pairs attended over the batch and heads (the density statistic)

With w[m] = (1 - beta) * beta**(T-1-m) the mass is Cascading's EMA score increment, exactly as
kernels/cascade_attention.strided_attention gives it for a dense chunk; with an index covering every
causal pair the two ops are the same function (the torch references are then the same arithmetic, bit
for bit: tests/test_methods_minference_cascade.py).

Torch reference (every device but CUDA; HARNESS_KERNELS forces): one fp32 pass over query blocks sized
by kernels.prefill.REF_BLOCK_BYTES, the chunk mask rebuilt per block from a per-query-block cover (never
a [T, T] mask), the same ops as strided_attention_ref. Triton (kernels/block_sparse_chunk_triton.py):
pass 1 the forward (cache dense, then the index) writing each query's base-2 log-sum-exp; pass 2 the
cache keys' mass with kernels/cascade_attention's own `_mass_kernel` under that lse; pass 3 the chunk
keys' mass over the same index (column sums per tile, atomically added: a key is hit by many query
blocks).
"""
from __future__ import annotations

import torch

from ._common import backend_for
from .block_sparse_prefill import SparseIndex
from .prefill import REF_BLOCK_BYTES


def chunk_cover(idx: SparseIndex, N: int) -> torch.Tensor:
    """[B, H, Q, N] bool: the keys each query block lists (pieces and columns), before the per-row causal
    and window rules. A difference array over the pieces: memory B*H*Q*N, not kernels.block_sparse_prefill.index_mask's
    [B, H, Q, pieces, N] (pieces reach thousands for the reference's 6096 slashes)."""
    B, H, Q, cb = idx.block_start.shape
    live = (torch.arange(cb, device=idx.block_start.device) < idx.block_count[..., None]).to(torch.int32)
    diff = torch.zeros(B, H, Q, N + 1, dtype=torch.int32, device=live.device)
    # entries past a count are padding, any value (block_sparse keeps its unselected blocks there): index 0
    diff.scatter_add_(-1, torch.where(live > 0, idx.block_start.long(), 0), live)
    diff.scatter_add_(-1, torch.where(live > 0, idx.block_end.long(), 0), -live)
    cover = diff.cumsum(-1)[..., :N] > 0
    clive = (torch.arange(idx.column_index.shape[-1], device=live.device) < idx.column_count[..., None])
    hit = torch.zeros(B, H, Q, N, dtype=torch.int32, device=live.device)
    hit.scatter_add_(-1, torch.where(clive, idx.column_index.long(), 0), clive.to(torch.int32))
    return cover | (hit > 0)


def chunk_rows(cover: torch.Tensor, idx: SparseIndex, rows: torch.Tensor) -> torch.Tensor:
    """[B, H, len(rows), N] bool: what the chunk's query rows (chunk-local) attend among its own keys."""
    N = cover.shape[-1]
    keys = torch.arange(N, device=rows.device)
    m = cover[:, :, rows // idx.block - idx.first_block]
    dist = rows[:, None] - keys[None, :]
    window = (dist[None] < idx.local[:, None, None]) | (keys[None, None, :] < idx.init[:, None, None])
    return m & (dist >= 0) & window[None]


def chunk_attention_ref(q, keys, values, n: int, idx: SparseIndex, scale: float, weights,
                        block_bytes: int = REF_BLOCK_BYTES):
    """Reference of `chunk_attention` (fp32): strided_attention_ref's loop with the chunk's columns masked
    by the index. A row that sees nothing (no cache, an index without its own key) gets 0, not NaN."""
    B, Hq, T, D = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    assert L == n + T and idx.q_start == 0 and idx.q_len == T, (L, n, T, idx.q_start, idx.q_len)
    g = Hq // Hkv
    kf, vf = keys.float(), values.float()
    out = torch.empty(B, Hq, T, D, device=q.device, dtype=torch.float32)
    mass = torch.zeros(B, Hq, L, device=q.device, dtype=torch.float32)
    w = weights.to(device=q.device, dtype=torch.float32)
    cover = chunk_cover(idx, T)
    pairs = torch.zeros((), dtype=torch.int64, device=q.device)
    block = max(1, block_bytes // max(1, B * Hq * L * 4))      # strided_attention_ref's blocks: same sums
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        qb = q[:, :, t0:t1].float().view(B, Hkv, g, t1 - t0, D)
        s = torch.einsum("bhgtd,bhld->bhgtl", qb, kf) * scale
        own = chunk_rows(cover, idx, torch.arange(t0, t1, device=q.device))          # [B, Hq, R, T]
        pairs += own.sum(dtype=torch.int64)
        visible = torch.cat([own.new_ones(B, Hq, t1 - t0, n), own], -1).view(B, Hkv, g, t1 - t0, L)
        p = torch.softmax(torch.where(visible, s, float("-inf")), -1)
        p = torch.where(visible, p, 0.0)                       # identity where a row sees anything
        out[:, :, t0:t1] = torch.einsum("bhgtl,bhld->bhgtd", p, vf).reshape(B, Hq, t1 - t0, D)
        mass += torch.einsum("bhgtl,t->bhgl", p, w[t0:t1]).reshape(B, Hq, L)
    return out.to(q.dtype).transpose(1, 2).reshape(B, T, Hq * D), mass, pairs


def chunk_attention(q, keys, values, n: int, idx: SparseIndex, scale: float, weights):
    """q [B, Hq, T, D] (rotated) over keys, values [B, Hkv, n + T, D] (rotated; the first n cached, the
    last T the chunk's own), `idx` the chunk's index (q_start 0, N = T), weights [T] per query ->
    (out [B, T, Hq*D], mass [B, Hq, n + T] fp32, pairs int64 scalar). Triton on CUDA, the torch
    reference elsewhere (HARNESS_KERNELS forces one)."""
    if backend_for(q) == "torch":
        return chunk_attention_ref(q, keys, values, n, idx, scale, weights)
    from .block_sparse_chunk_triton import chunk_attention_triton

    return chunk_attention_triton(q, keys, values, n, idx, scale, weights)
