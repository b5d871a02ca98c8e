"""Top-k positions per row of a score matrix, as one Triton kernel (radix select), for the
selection steps of TidalDecode and LycheeDecode.

Same contract as `kernels.topk_positions` (torch.topk + sort): scores fp32 [B, H, S], -inf at or past
each length (never selected); returns (index int32 [B, H, k], counts int32 [B, H]) with k = min(topk,
S), counts = min(k, finite entries); the valid prefix sorted by position, padding 0. +inf entries
(forced tokens) are ordinary largest values. Ties at the k-th value go to the lowest positions
(torch.topk breaks them arbitrarily): only tied scores can make the two differ.

Kernel: one program per row. The fp32 bits are mapped to order-preserving uint32 keys; four passes
of an 8-bit histogram over the candidates sharing the digits found so far give the k-th largest key
T and how many of its ties to take; a last pass writes the positions with key > T, then the first
ties, in position order (a running prefix sum), so the output is already sorted. The passes stop
early once the chosen bucket holds exactly the entries still to take (all of them are in, whatever
their lower digits): on spread scores after 2 of the 4. At most five reads of the row, no sort, no [B, H, S] temporaries (torch.topk + sort allocate and sort k-sized rows and the
unsorted top-k reads the row more than once at large k).

Two stages (`chunks`, on by default where it pays: CHUNKS_AUTO): the rows cut into chunks of CHUNK_LEN
scores, each chunk's top-k (with its scores) by one program, then the row's top-k of the C x k candidates:
the same set and ties (topk_positions' docstring); at batch 1 this runs C x the programs. Quest at 128K
(8211 pages, k = 256): 48.7 -> 32.4 us a layer on the H100 (notes/kernels.md, issue 33).

Dispatch by row length: one program per row is latency-bound on short rows and bandwidth-starved on
long ones. Measured on the H100 (results/bench/lychee_kernels_h100.json, k = 4096): at 16K tokens the
kernel takes 0.084 ms against 0.12-0.15 ms for torch.topk + sort; at 128K it takes 0.71 ms against
0.11-0.17 ms (torch spreads a row over many blocks). Rows longer than RADIX_MAX_CONTEXT therefore go
to `kernels.attention.topk_positions` (torch.topk + sort: same contract, ties at the k-th value broken
by torch). The cut is interpolated between the two measured lengths (the kernel's time grows about
linearly past 16K: ~0.17 ms at 32K, torch's break-even), not measured at 32K itself. It predates the
two-stage mode; a caller whose rows are long and whose k is large (LycheeDecode's token sets, k = 4096)
passes its own cut (`radix_max`), as the two stages change the break-even (methods/parts/lychee_sets.py).
"""
from __future__ import annotations

import torch

from ._common import backend_for, kernel_for, next_pow2, tl, triton
from .attention import topk_positions as torch_topk_positions

RADIX_MAX_CONTEXT = 32768  # longer rows: torch.topk (module docstring)


def topk_positions_ref(scores, lengths, topk, row_k=None):
    """The contract above with the ties rule made deterministic (lowest positions first); `row_k`
    (int [B], each <= topk) lowers k per sequence."""
    B, _, S = scores.shape
    kk = min(int(topk), S)
    finite = scores > float("-inf")
    # rank by (score desc, position asc): a stable descending sort
    order = scores.sort(dim=-1, descending=True, stable=True).indices[..., :kk]
    keep = finite.gather(-1, order)
    if row_k is not None:
        keep &= torch.arange(kk, device=scores.device) < row_k.to(scores.device).long().view(B, 1, 1)
    counts = keep.sum(-1)
    idx = torch.where(keep, order, S).sort(-1).values
    idx = torch.where(idx == S, 0, idx)
    return idx.to(torch.int32), counts.to(torch.int32).contiguous()


@triton.jit
def _key(x):
    """Order-preserving uint32 key of fp32 x (larger float -> larger key)."""
    b = x.to(tl.uint32, bitcast=True)
    neg = (b >> 31) == 1
    return tl.where(neg, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _topk_kernel(Sc, Idx, Cnt, Rows, Kb, Vals, Map, S_ROW, K, N, C, SP, s_sb, s_sh, s_ib, s_ih, s_cb, s_ch,
                 BLOCK: tl.constexpr, KPAD: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_KB: tl.constexpr,
                 HAS_VALS: tl.constexpr = False, HAS_MAP: tl.constexpr = False):
    # Program (b, i), i < N: output row i. Its scores are chunk i % C (SP entries from i % C * SP) of score
    # row i // C: C = 1 is the plain top-k; C > 1 is the chunked first stage (`_chunked`), which also writes
    # the kept scores (Vals, -inf padding); HAS_MAP (the second stage) stores Map[position] instead of it.
    pid = tl.program_id(0)
    b = (pid // N).to(tl.int64)
    i = pid % N
    srow = (i // C).to(tl.int64)
    c0 = (i % C) * SP
    S = tl.minimum(SP, S_ROW - c0)
    base = Sc + b * s_sb + srow * s_sh + c0
    orow = tl.load(Rows + i).to(tl.int64) if HAS_ROWS else i.to(tl.int64)
    bins = tl.arange(0, 256)
    prefix = tl.zeros((), tl.uint32)
    k_rem = tl.zeros((), tl.int32)
    shift_end = tl.zeros((), tl.uint32)   # the digits found cover the key bits at and above it
    done = tl.zeros((), tl.int1)
    for p in tl.static_range(4):
        shift = 24 - 8 * p   # a constexpr (p is): Triton 3.6 refuses re-annotating one in an unrolled loop
        if not done:
            hist = tl.zeros((256,), tl.int32)
            for s0 in range(0, SP, BLOCK):   # SP >= S: a host int (the interpreter ranges over ints)
                offs = s0 + tl.arange(0, BLOCK)
                x = tl.load(base + offs, mask=offs < S, other=float("-inf"))
                cand = (offs < S) & (x > float("-inf"))
                key = _key(x)
                if p > 0:
                    cand = cand & ((key >> (shift + 8)) == prefix)
                digit = ((key >> shift) & 0xFF).to(tl.int32)
                hist += tl.histogram(digit, 256, mask=cand)
            if p == 0:  # k_eff = min(k, finite entries)
                k_rem = tl.minimum(K, tl.sum(hist, 0))
                if HAS_KB:  # a per-sequence k (Quest's budget clamped to a short context)
                    k_rem = tl.minimum(k_rem, tl.load(Kb + b).to(tl.int32))
            # suffix sums: above[d] = candidates with digit > d
            total = tl.sum(hist, 0)
            upto = tl.cumsum(hist, 0)            # digits <= d
            above = total - upto
            at_least = above + hist              # digits >= d
            ok = (at_least >= k_rem) & (k_rem > 0)
            d_star = tl.max(tl.where(ok, bins, -1), 0)
            d_sel = tl.maximum(d_star, 0)
            gt = tl.sum(tl.where(bins > d_sel, hist, 0), 0)
            k_rem = tl.where(d_star >= 0, k_rem - gt, k_rem)
            prefix = (prefix << 8) | d_sel.to(tl.uint32)
            shift_end = tl.full((), shift, tl.uint32)
            # every candidate left in the chosen bucket is taken: the lower digits cannot change the set
            # (on spread scores this ends after 2 of the 4 passes; each pass is a dependent read + histogram)
            done = tl.sum(tl.where(bins == d_sel, hist, 0), 0) == k_rem
    written = tl.zeros((), tl.int32)
    ties = tl.zeros((), tl.int32)
    out = Idx + b * s_ib + orow * s_ih
    for s0 in range(0, SP, BLOCK):   # SP >= S: a host int (the interpreter ranges over ints)
        offs = s0 + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < S, other=float("-inf"))
        fin = (offs < S) & (x > float("-inf"))
        key = _key(x) >> shift_end
        tie = fin & (key == prefix)
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), 0) - 1
        sel = fin & ((key > prefix) | (tie & (tie_rank < k_rem)))
        pos = written + tl.cumsum(sel.to(tl.int32), 0) - 1
        if HAS_MAP:   # second stage: the candidate's position in the score row (candidates are in its order)
            val = tl.load(Map + b * s_sb + srow * s_sh + offs, mask=sel, other=0)
        else:
            val = offs + c0
        tl.store(out + pos, val.to(tl.int32), mask=sel & (pos < KPAD))
        if HAS_VALS:
            tl.store(Vals + b * s_ib + orow * s_ih + pos, x, mask=sel & (pos < KPAD))
        written += tl.sum(sel.to(tl.int32), 0)
        ties += tl.sum(tie.to(tl.int32), 0)
    n_keep = tl.minimum(written, KPAD)
    for j0 in range(0, KPAD, BLOCK):
        jj = j0 + tl.arange(0, BLOCK)
        tl.store(out + jj, tl.zeros((BLOCK,), tl.int32), mask=(jj >= n_keep) & (jj < KPAD))
        if HAS_VALS:
            tl.store(Vals + b * s_ib + orow * s_ih + jj, tl.full((BLOCK,), float("-inf"), tl.float32),
                     mask=(jj >= n_keep) & (jj < KPAD))
    tl.store(Cnt + b * s_cb + orow * s_ch, n_keep)


def _write_rows(res, out, rows):
    """Put a (index [B, H, kk], counts [B, H]) result into out = (index [B, Ho, W], counts [B, Ho]) at
    rows `rows` (int64 [H]; None: rows 0..H-1), index columns past kk zeroed."""
    idx, cnt = res
    oi, oc = out
    W = oi.shape[-1]
    idx = torch.nn.functional.pad(idx, (0, W - idx.shape[-1])) if idx.shape[-1] < W else idx
    if rows is None:
        oi[:, :idx.shape[1]].copy_(idx)
        oc[:, :cnt.shape[1]].copy_(cnt)
    else:
        oi.index_copy_(1, rows, idx)
        oc.index_copy_(1, rows, cnt)
    return out


def chunk_plan(S: int, kk: int, chunks) -> tuple[int, int]:
    """(C, SP): chunks per row and their length for the two-stage top-k; (1, S): one stage. `chunks`: an
    int, or "auto": off unless CHUNKS_AUTO, else chunks of CHUNK_LEN scores (a power of two >= 4 k: one
    tile of the kernel each), used when the C k candidates are at most half the row."""
    if chunks == "auto":
        if not CHUNKS_AUTO:
            return 1, S
        SP = max(CHUNK_LEN, next_pow2(4 * kk))
        C = -(-S // SP)
    else:
        C = max(1, int(chunks))
        per = -(-S // C)
        SP = -(-per // 64) * 64          # a multiple of 64 (whole vector loads)
        C = -(-S // SP)
    return (C, SP) if C > 1 and 2 * C * kk <= S else (1, S)


# The two-stage top-k (notes/kernels.md, issue 33): CHUNKS_AUTO off = one program per row, the kernel as
# it was; on = rows cut into CHUNK_LEN-score chunks. WARPS: per program.
CHUNKS_AUTO = True
CHUNK_LEN = 1024
WARPS = 8


def topk_positions(scores, lengths, topk, *, block: int | None = None, impl: str = "auto", out=None, rows=None,
                   row_k=None, chunks="auto", warps: int | None = None, radix_max: int | None = None):
    """Top-`topk` positions per row (module docstring). Triton on CUDA, the reference elsewhere.
    impl: auto (radix kernel up to `radix_max` scores a row, default RADIX_MAX_CONTEXT; torch.topk beyond)
    | radix | torch.
    row_k (int32 [B] on the device, each <= topk): k per sequence, without a host sync (radix kernel
    and reference only: the torch.topk path refuses it).

    chunks (radix kernel): C > 1 splits each row into C chunks, one program each (C x the programs of a
    row: at batch 1 one program per row leaves most SMs idle), keeps each chunk's top-k with its scores,
    then selects the row's top-k among those C x k candidates. The same set, ties included: an entry of the
    row's top-k (rank by score, then lower position) has fewer than k entries of its chunk ahead of it, so
    it is among its chunk's top-k; the candidates stay in position order, so the second stage's ties (lower
    candidate first) are the row's (lower position first). "auto": chunk_plan. warps: per program (8).

    out = (index int32 [B, Ho, W], counts int32 [B, Ho]), W >= min(topk, S): the result is written in
    place, row h of the scores into row rows[h] (rows: int64 [H] on the device; None: row h), index
    columns past min(topk, S) zeroed, and `out` is returned. The radix kernel writes there directly:
    LycheeDecode's per-layer sets go into the step's per-KV-head set without an index_copy per layer."""
    if impl not in ("auto", "radix", "torch"):
        raise ValueError(f"impl={impl!r}: auto | radix | torch")
    B, H, S = scores.shape
    kk = min(int(topk), S)
    if out is not None:
        assert out[0].shape[-1] >= kk and out[0].shape[0] == B, "out must hold B rows of min(topk, S) columns"
    if backend_for(scores) == "torch" and row_k is not None:
        res = topk_positions_ref(scores, lengths, topk, row_k)
        return res if out is None else _write_rows(res, out, rows)
    too_long = S > (RADIX_MAX_CONTEXT if radix_max is None else radix_max)
    if backend_for(scores) == "torch" or impl == "torch" or (impl == "auto" and too_long):
        if row_k is not None:
            raise ValueError("row_k needs the radix kernel (impl='radix') or the torch backend")
        ref = topk_positions_ref if backend_for(scores) == "torch" else torch_topk_positions
        res = ref(scores, lengths, topk)
        return res if out is None else _write_rows(res, out, rows)
    sc = scores if scores.stride(-1) == 1 else scores.contiguous()
    if out is None:
        idx = torch.empty(B, H, kk, device=scores.device, dtype=torch.int32)
        cnt = torch.empty(B, H, device=scores.device, dtype=torch.int32)
    else:
        idx, cnt = out
        assert idx.stride(-1) == 1 and idx.dtype == cnt.dtype == torch.int32
    if kk == 0:
        if out is not None:
            return _write_rows((idx.new_zeros(B, H, 0), cnt.new_zeros(B, H)), out, rows)
        return idx, cnt.zero_()
    nw = (warps or WARPS) if scores.is_cuda else 1
    has_rows = rows is not None
    kb = row_k if row_k is not None else cnt
    C, SP = chunk_plan(S, kk, chunks)
    if C > 1:   # first stage: each chunk's top-k and its scores, in position order
        i1 = torch.empty(B, H * C, kk, device=scores.device, dtype=torch.int32)
        v1 = torch.empty(B, H * C, kk, device=scores.device, dtype=torch.float32)
        c1 = torch.empty(B, H * C, device=scores.device, dtype=torch.int32)
        blk1 = block or (min(1024, next_pow2(SP)) if scores.is_cuda else 64)
        kernel_for(_topk_kernel, scores)[(B * H * C,)](
            sc, i1, c1, c1, c1, v1, i1, S, kk, H * C, C, SP, sc.stride(0), sc.stride(1), i1.stride(0),
            i1.stride(1), c1.stride(0), c1.stride(1), BLOCK=blk1, KPAD=kk, HAS_ROWS=False, HAS_KB=False,
            HAS_VALS=True, num_warps=nw)
        sc, S = v1.view(B, H, C * kk), C * kk
    blk = block or ((min(1024, next_pow2(S)) if C > 1 else 1024) if scores.is_cuda else 64)
    kernel_for(_topk_kernel, scores)[(B * H,)](
        sc, idx, cnt, rows if has_rows else cnt, kb, cnt, i1 if C > 1 else cnt, S, kk, H, 1, S,
        sc.stride(0), sc.stride(1), idx.stride(0),
        idx.stride(1), cnt.stride(0), cnt.stride(1), BLOCK=blk, KPAD=idx.shape[-1], HAS_ROWS=has_rows,
        HAS_KB=row_k is not None, HAS_MAP=C > 1, num_warps=nw)
    return (idx, cnt) if out is None else out
