"""MInference's sparse prefill as one block/column attention kernel (microsoft/MInference
minference/ops/pit_sparse_flash_attention_v2.py `_triton_mixed_sparse_attn_fwd_kernel` and its index
builder csrc/vertical_slash_index.cu `convert_vertical_slash_indexes`; MIT; our own code).

Per (batch, query head, query block of `block` positions) the kernel reads a list of key *blocks*
(block_start, block_end: ranges of at most `block` keys) and a list of single key *columns*, and runs
flash attention with an online softmax over both, masked causally and by the head's window. The three
patterns of methods/parts/minference_patterns.py are all such lists, so one launch serves a mixed layer:

  vertical_slash  blocks = the key ranges the chosen diagonals cover in the query block, columns = the
                  chosen columns no range covers (the CUDA builder's rule);
  a_shape         blocks = the sinks [0, INIT) and the window [first row - LOCAL + 1, last row]; the
                  per-row window (key > row - LOCAL or key < INIT) is masked in the kernel;
  block_sparse    blocks = the selected key blocks;  dense  blocks = every causal key block.

Exactness: the lists reproduce `minference_patterns.rows_mask` with `slash_cover: block` key for key
(tests/test_kernels_block_sparse_prefill.py expands them back into that mask). The reference builder differs
in one place: where two diagonal ranges nearly touch it extends the range by a whole block
(`range_end += BLOCK_SIZE_M`, up to block - 1 extra keys), which rows_mask does not model; we keep
ranges exact instead and cut each merged range into pieces of at most `block` keys (the last piece of
a range carries its own end, so pieces never overlap). `slash_cover: token` (exact diagonals) has no
kernel: the method keeps its masked torch prefill for it and says so in its stats.

Positions: queries at q_start .. q_start + T - 1 (a prefill step's contiguous positions, the engine's
Step contract) over keys 0 .. N - 1; query blocks are absolute (position // block), so the first
block of a chunk that starts mid-block is partial. q [B, Hq, T, D], k/v [B, Hkv, N, D] (GQA: query
head h reads KV head h // (Hq // Hkv)); output [B, T, Hq * D].

Order: each query block's pieces that need no mask (`_free`: bs keys, causal for every row of the block,
inside the head's window) come first and `block_free` counts them, so the kernel runs an unmasked loop
then a masked one (the diagonal block, partial pieces, windowed a_shape pieces), as the FlashAttention
Triton tutorial's two stages; the order does not change which keys are attended.

The index is built with torch on the device: elementwise scans over [B, query blocks, sizes] per
head, no host syncs (every shape comes from host sizes).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._common import backend_for

NEG32 = -(1 << 30)    # "no range yet" in the int32 scans (keys stay below 2^30)
LIST_ENTRIES = 1 << 24   # [heads, query blocks, slashes] entries of one batched vertical-slash list build
WIDE = 1 << 30        # the window of a head without one (fits the kernel's int32)


@dataclass
class SparseIndex:
    """Block/column lists of a layer; entries at or past a count are padding (never read)."""
    block_start: torch.Tensor   # int32 [B, H, Q, CB] first key of each block
    block_end: torch.Tensor     # int32 [B, H, Q, CB] one past its last key (<= start + block)
    block_count: torch.Tensor   # int32 [B, H, Q]
    block_free: torch.Tensor    # int32 [B, H, Q]: the first block_free pieces need no mask (see _free)
    column_index: torch.Tensor  # int32 [B, H, Q, CC] (CC >= 1)
    column_count: torch.Tensor  # int32 [B, H, Q]
    init: torch.Tensor          # int32 [H]: keys < init are visible whatever the window (a_shape sinks)
    local: torch.Tensor         # int32 [H]: keys with row - key < local are visible (a_shape window)
    q_start: int                # position of the first query
    q_len: int                  # T
    block: int                  # query/key block size
    first_block: int            # absolute query block of list row 0 (q_start // block)
    dense_below: int = 0        # rows (positions) below this see every listed key, no window, no column
    columns_outside: bool = False   # columns are seen only outside the window rule (BigBird's random picks)


@dataclass(frozen=True)
class _Rows:
    """The query blocks of a prefill step: absolute ids and each one's [lo, hi) rows, on the device."""
    qb: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    bs: int
    N: int
    blocks: int      # absolute query blocks up to the last one (last id + 1): a bound on causal key blocks

    @property
    def end(self) -> torch.Tensor:   # end of each query block (past the step's rows for a partial last block)
        return (self.qb + 1) * self.bs


def _compact(keep: torch.Tensor, values: list[torch.Tensor], cap: int, first: torch.Tensor | None = None):
    """Kept entries of each value tensor moved to the front of the last dim (order kept), cut to cap;
    and their counts. Dropped entries are scattered into one extra slot that is cut off. With `first`,
    the kept entries that are `first` go before the other kept ones, and their count is returned too."""
    if first is None:
        pos = torch.where(keep, keep.cumsum(-1) - 1, cap)
    else:
        a, b = keep & first, keep & ~first
        n_a = a.sum(-1, keepdim=True)
        pos = torch.where(a, a.cumsum(-1) - 1, torch.where(b, n_a + b.cumsum(-1) - 1, cap))
    pos = pos.clamp(max=cap)                                            # cap is a proven bound; clamp: no OOB
    shape = keep.shape[:-1] + (cap + 1,)
    out = [torch.zeros(shape, dtype=torch.int32, device=keep.device).scatter_(-1, pos, v.to(torch.int32))[..., :cap]
           for v in values]
    count = keep.sum(-1).to(torch.int32)
    return (out, count) if first is None else (out, count, n_a.squeeze(-1).to(torch.int32))


def _free(start: torch.Tensor, end: torch.Tensor, r: _Rows, n_init: int = 0, n_local: int = WIDE) -> torch.Tensor:
    """Pieces [start, end) (last dim; query blocks on the one before) that the kernel may attend unmasked:
    bs keys, all at or before the block's first row (causal for every row of the step in it) and, for a
    windowed head, either all sinks or all inside the window of the block's last row."""
    lo, hi = r.lo[:, None], r.hi[:, None]
    ok = (end - start == r.bs) & (end - 1 <= lo)
    if n_local < WIDE:
        ok &= (hi - 1 - start < n_local) | (end <= n_init)
    return ok


def vertical_slash_lists(cols: torch.Tensor, offs: torch.Tensor, r: _Rows):
    """(start, end, count, columns, column count) of one head from its chosen columns [B, v] and diagonal
    offsets [B, s]. Diagonal d (d < the query block's end e_m) covers the keys [e - bs, e), e = max(e_m - d,
    bs) (minference_patterns.slash_blocks). Ranges sorted by key are merged into groups (a gap starts a
    new group) and each group is cut into pieces of bs keys from its start: range i adds at most one piece,
    so s is a capacity. A column is kept unless the first range ending past it also starts at or before it."""
    bs, s = r.bs, offs.shape[-1]
    # int32 values (keys < 2^30): these [B, Q, s] scans are the index build's bytes (int64 only for indices)
    d = offs.to(torch.int32).sort(-1, descending=True).values[:, None, :]   # ranges in ascending key order
    end = r.end.to(torch.int32)[None, :, None]
    live = d < end                                                       # [B, Q, s]; dead ones come first
    e = torch.where(live, (end - d).clamp(min=bs), -1)
    prev = F.pad(e, (1, 0), value=-1)[..., :-1]
    new = live & (e - bs > prev)                                         # a gap before it: a new group
    start = torch.where(new, e - bs, NEG32).cummax(-1).values            # its group's first key
    chunks = torch.div(e - start + bs - 1, bs, rounding_mode="floor")    # pieces of the group up to e
    piece = start + (chunks - 1) * bs
    gid = new.cumsum(-1)
    last = torch.full(e.shape[:-1] + (s + 1,), NEG32, dtype=e.dtype, device=e.device).scatter_reduce(
        -1, gid, torch.where(live, e, NEG32), "amax").gather(-1, gid)    # the group's last key + 1
    keep = live & (new | (chunks > F.pad(chunks, (1, 0))[..., :-1])) & (piece < r.N)
    piece_end = torch.minimum(torch.minimum(piece + bs, last), torch.full_like(last, r.N))
    # disjoint pieces below e_m: full ones plus one partial per group (a group holds >= bs keys)
    cap = min(s, 2 * r.blocks)
    (bstart, bend), bcount, bfree = _compact(keep, [piece, piece_end], cap, _free(piece, piece_end, r))
    # columns: first range with e > column (e ascending, dead = -1 first); covered if it starts <= column
    cv = cols.to(torch.int32).sort(-1).values[:, None, :].expand(-1, e.shape[1], -1).contiguous()
    i = torch.searchsorted(e.contiguous(), cv, right=True)
    covered = (i < s) & (e.gather(-1, i.clamp(max=s - 1)) - bs <= cv)
    ckeep = ~covered & (cv < r.hi[None, :, None]) & (cv < r.N)
    (cidx,), ccount = _compact(ckeep, [cv], cols.shape[-1])
    return bstart, bend, bcount, bfree, cidx, ccount


def a_shape_lists(n_init: int, n_local: int, r: _Rows):
    """The sinks [0, min(INIT, w)) and the window [w, last row], w = max(first row - LOCAL + 1, 0), cut into
    pieces of bs keys (the kernel masks each row's own window)."""
    bs, dev, Q = r.bs, r.qb.device, len(r.qb)
    w = (r.lo - n_local + 1).clamp(min=0)[:, None]                      # [Q, 1]
    sinks, hi = w.clamp(max=n_init), r.hi[:, None]
    c1, c2 = -(-min(n_init, r.N) // bs), -(-min(n_local + bs - 1, r.N) // bs)   # hi - w <= bs + LOCAL - 1
    k1 = (torch.arange(c1, device=dev) * bs)[None, :].expand(Q, -1)
    k2 = w + torch.arange(c2, device=dev)[None, :] * bs
    start = torch.cat([k1, k2], 1)
    end = torch.cat([torch.minimum(k1 + bs, sinks), torch.minimum(k2 + bs, hi)], 1)
    keep = start < torch.cat([sinks.expand(-1, c1), hi.expand(-1, c2)], 1)
    (bstart, bend), bcount, bfree = _compact(keep, [start, end], c1 + c2, _free(start, end, r, n_init, n_local))
    return bstart, bend, bcount, bfree


def block_sparse_lists(sel: torch.Tensor, top_k: int, r: _Rows):
    """The selected key blocks of sel [B, absolute query blocks, key blocks] (block_sparse_index: at most
    max(1, min(top_k, N // bs)) per query block)."""
    n_kb = sel.shape[-1]
    sel = sel[:, r.qb]
    kb = torch.arange(n_kb, device=sel.device)
    cap = min(n_kb, max(1, min(top_k, r.N // r.bs)))
    first = torch.where(sel, kb, n_kb).sort(-1).values[..., :cap]       # selected blocks first, ascending
    start = first * r.bs
    end = torch.clamp(start + r.bs, max=r.N)
    n = sel.sum(-1).to(torch.int32)
    free = _free(start, end, r) & (torch.arange(cap, device=sel.device) < n[..., None])
    lead = free.to(torch.int32).cumprod(-1).sum(-1, dtype=torch.int32)   # ascending: only the diagonal is last
    return start.to(torch.int32), end.to(torch.int32), n, lead


def dense_lists(r: _Rows):
    """Every key block up to each query block's last row."""
    start = torch.arange(r.blocks, device=r.qb.device)[None, :] * r.bs
    hi = r.hi[:, None]
    start, end = start.expand(len(r.qb), -1), torch.minimum(start + r.bs, hi)
    (bstart, bend), bcount, bfree = _compact(start < hi, [start, end], r.blocks, _free(start, end, r))
    return bstart, bend, bcount, bfree


def build_index(heads, index, q_start: int, T: int, N: int, B: int, bs: int, dev) -> SparseIndex:
    """Block/column lists of every query head of a layer (queries q_start .. q_start + T - 1, keys 0 .. N - 1,
    blocks of bs). `heads` [Hq] have .kind, .a, .b (minference_patterns.Pattern); `index` [Hq] is what
    minference_patterns.head_index estimated for each: (columns [B, v], offsets [B, s]) of vertical_slash,
    the selection [B, n_qb, n_kb] of block_sparse, None otherwise."""
    assert T >= 1 and q_start + T <= N, (q_start, T, N)
    first, last = q_start // bs, (q_start + T - 1) // bs
    qb = torch.arange(first, last + 1, device=dev)
    r = _Rows(qb, (qb * bs).clamp(min=q_start), ((qb + 1) * bs).clamp(max=q_start + T), bs, N, last + 1)
    H, Q = len(heads), len(qb)
    groups: dict = {}                      # heads of one pattern: their lists in one batched call (launches, not bytes)
    for h, p in enumerate(heads):
        groups.setdefault((p.kind, p.a, p.b), []).append(h)
    stack = lambda hs, i=None: torch.stack([index[h] if i is None else index[h][i] for h in hs], 1).flatten(0, 1)
    lists = []
    for (kind, a, b), hs in groups.items():
        cols = None
        if kind == "vertical_slash":        # [B * n, ...] -> [B, n, ...], n heads per call: LIST_ENTRIES bounds memory
            per = max(1, LIST_ENTRIES // max(1, B * Q * index[hs[0]][1].shape[-1]))
            for i in range(0, len(hs), per):
                part = hs[i:i + per]
                out = vertical_slash_lists(stack(part, 0), stack(part, 1), r)
                *blocks, cols, ccount = [t.unflatten(0, (B, len(part))) for t in out]
                lists.append((part, blocks, (cols, ccount)))
            continue
        elif kind == "a_shape":             # [Q, ...]: every sequence and head of the group alike
            blocks = a_shape_lists(a, b, r)
        elif kind == "block_sparse":
            blocks = [t.unflatten(0, (B, len(hs))) for t in block_sparse_lists(stack(hs), a, r)]
        elif kind == "dense":
            blocks = dense_lists(r)
        else:
            raise ValueError(f"no block/column lists for pattern kind {kind!r}")
        lists.append((hs, blocks, None if cols is None else (cols, ccount)))
    init = [min(p.a, WIDE) if p.kind == "a_shape" else 0 for p in heads]
    local = [min(p.b, WIDE) if p.kind == "a_shape" else WIDE for p in heads]
    cb = max(b[0].shape[-1] for _, b, _ in lists)
    cc = max([1] + [c[0].shape[-1] for _, _, c in lists if c is not None])
    z = lambda *s: torch.zeros(*s, dtype=torch.int32, device=dev)
    idx = SparseIndex(z(B, H, Q, cb), z(B, H, Q, cb), z(B, H, Q), z(B, H, Q), z(B, H, Q, cc), z(B, H, Q),
                      torch.tensor(init, dtype=torch.int32, device=dev), torch.tensor(local, dtype=torch.int32,
                                                                                        device=dev),
                      q_start, T, bs, first)
    for hs, blocks, cols in lists:   # an a_shape / dense group's [Q, ...] lists broadcast over batch and heads
        h, n = torch.tensor(hs, device=dev), len(hs)
        fit = lambda t, d, n=n: t if t.dim() == d else t.expand(B, n, *t.shape)
        bstart, bend, bcount, bfree = blocks
        idx.block_start[:, h, :, :bstart.shape[-1]] = fit(bstart, 4)
        idx.block_end[:, h, :, :bend.shape[-1]] = fit(bend, 4)
        idx.block_count[:, h] = fit(bcount, 3)
        idx.block_free[:, h] = fit(bfree, 3)
        if cols is not None:
            idx.column_index[:, h, :, :cols[0].shape[-1]] = cols[0]
            idx.column_count[:, h] = cols[1]
    return idx


def banded_index(q_start: int, T: int, N: int, B: int, bs: int, sink: int, window: int, dense_below: int,
                 columns: torch.Tensor, column_count: torch.Tensor, dev) -> SparseIndex:
    """BigBird's lists (methods/bigbird.py, picks drawn per query block): every query head reads the sinks
    [0, sink) and its row's window of `window` keys (a_shape pieces, masked per row in the kernel), rows below
    `dense_below` every causal key (the pieces of a block holding such a row cover [0, its last row]), and
    the block's own random keys `columns` [Hq, Q, C] (the first column_count [Q] of each row live), seen
    by the rows at or past dense_below only where the window rule hides them (they lie before the window)."""
    assert T >= 1 and q_start + T <= N, (q_start, T, N)
    first, last = q_start // bs, (q_start + T - 1) // bs
    qb = torch.arange(first, last + 1, device=dev)
    r = _Rows(qb, (qb * bs).clamp(min=q_start), ((qb + 1) * bs).clamp(max=q_start + T), bs, N, last + 1)
    a = a_shape_lists(sink, window, r)
    dense = r.lo < dense_below                                           # [Q] a block holding a dense row
    if bool(dense.any()):
        n_dense = int(-(-min(dense_below + bs, N) // bs))                # key blocks a dense block may reach
        d = dense_lists(_Rows(r.qb, r.lo, r.hi, bs, N, min(r.blocks, n_dense)))
        cap = max(a[0].shape[-1], d[0].shape[-1])
        pad = lambda t: torch.nn.functional.pad(t, (0, cap - t.shape[-1]))
        all_dense = (r.hi - 1 < dense_below)                             # every row dense: the free pieces stay free
        a = (torch.where(dense[:, None], pad(d[0]), pad(a[0])), torch.where(dense[:, None], pad(d[1]), pad(a[1])),
             torch.where(dense, d[2], a[2]), torch.where(dense, torch.where(all_dense, d[3], 0), a[3]))
    H, Q = columns.shape[0], len(qb)
    exp = lambda t: t.expand(B, H, *t.shape).contiguous()
    return SparseIndex(exp(a[0]), exp(a[1]), exp(a[2]), exp(a[3]), columns.to(torch.int32).expand(B, -1, -1, -1)
                       .contiguous(), column_count.to(torch.int32).expand(B, H, Q).contiguous(),
                       torch.full((H,), min(sink, WIDE), dtype=torch.int32, device=dev),
                       torch.full((H,), min(window, WIDE), dtype=torch.int32, device=dev),
                       q_start, T, bs, first, dense_below, True)


# ----------------------------------------------------------------------------- torch reference

def index_mask(idx: SparseIndex, N: int) -> torch.Tensor:
    """What the kernel attends: [B, H, T, N] bool, the lists expanded per query row, causal, windowed (pieces:
    inside the window rule or a row below dense_below; columns: the same, or with columns_outside exactly
    outside it and for the other rows)."""
    cb, dev = idx.block_start.shape[-1], idx.block_start.device
    keys = torch.arange(N, device=dev)
    slot = torch.arange(cb, device=dev)
    live = slot < idx.block_count[..., None]                                        # [B, H, Q, cb]
    inside = (keys >= idx.block_start[..., None]) & (keys < idx.block_end[..., None]) & live[..., None]
    cover = inside.any(-2)                                                          # [B, H, Q, N]
    cc = idx.column_index.shape[-1]
    clive = torch.arange(cc, device=dev) < idx.column_count[..., None]
    hit = torch.zeros(cover.shape, dtype=torch.int32, device=dev).scatter_add_(-1, idx.column_index.long(),
                                                                               clive.to(torch.int32)) > 0
    rows = torch.arange(idx.q_start, idx.q_start + idx.q_len, device=dev)
    qrow = rows // idx.block - idx.first_block
    dist = rows[:, None] - keys[None, :]
    window = ((dist[None] < idx.local[:, None, None]) | (keys[None, None, :] < idx.init[:, None, None]))[None]
    dense = (rows < idx.dense_below)[None, None, :, None]
    seen = window | dense
    if idx.columns_outside:
        m = (cover[:, :, qrow] & seen) | (hit[:, :, qrow] & ~seen)
    else:
        m = (cover | hit)[:, :, qrow] & seen
    return m & (dist >= 0)


def mixed_sparse_attention_ref(q, k, v, idx: SparseIndex, scale: float, count: bool = False):
    """Torch reference of the kernel: SDPA under `index_mask` -> [B, T, Hq*D] (and the pairs attended
    per (batch, head, query block) when `count`, int32 [B, Hq, Q], for the density statistic)."""
    B, Hq, T, D = q.shape
    mask = index_mask(idx, k.shape[2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != Hq)
    out = out.transpose(1, 2).reshape(B, T, Hq * D)
    if not count:
        return out
    rows = torch.arange(idx.q_start, idx.q_start + T, device=q.device) // idx.block - idx.first_block
    pairs = torch.zeros(B, Hq, idx.block_count.shape[-1], dtype=torch.int32, device=q.device)
    return out, pairs.index_add_(2, rows, mask.sum(-1).to(torch.int32))


def mixed_sparse_attention(q, k, v, idx: SparseIndex, scale: float, count: bool = False, config: dict | None = None):
    """Causal attention of q [B, Hq, T, D] over k, v [B, Hkv, N, D] restricted to the lists of `idx`:
    the Triton kernel on CUDA (kernels/block_sparse_prefill_triton.py), the torch reference elsewhere
    (HARNESS_KERNELS forces one). -> [B, T, Hq * D] (, pairs int32 [B, Hq, Q] with `count`).
    `config` overrides the kernel's launch settings (minference_triton.CONFIG); the reference ignores it."""
    if backend_for(q) == "torch":
        return mixed_sparse_attention_ref(q, k, v, idx, scale, count)
    from .block_sparse_prefill_triton import mixed_sparse_attention_triton

    return mixed_sparse_attention_triton(q, k, v, idx, scale, count, config)
