"""Tactic's per-step token selection from cluster scores, as one Triton kernel (no sort).

Contract (`select_cluster_tokens`). Per row (batch b, row h: a query head, or a KV head shared by its
group; row h reads KV head h // (H / Hkv)): clusters are ranked by descending score, ties by lower
cluster id (a stable descending sort); unpacking them in that order (inside a cluster, tokens in
`order` order) gives the row's sorted token list. The row attends list ranks 0..K-1 (K = k_row,
clamped to the list's length and to `kmax`) and then the exact set's valid slots. Output: index
int32 [B, H, kmax + Emax], counts int32 [B, H] = K + valid slots; entries past counts are some
in-range position (callers read only the first counts).

The reference (`select_cluster_tokens_ref`) is Tactic's original path: a full stable sort (`rank`),
then the list unpacked by searchsorted + gathers (`list_positions`). It writes the list in rank
order. The kernel writes the same SET in another order (clusters by id; attention is
order-invariant): exactness argument below.

Kernel, one program per row and SELECT_SPAN list slots (the H100 profile at 128K: the sort, ~6 gathers, a cumsum scan and a
searchsorted cost ~150 us per layer against ~210 us for full attention; this reads the row's C
scores ~34 times from L1 and writes K + |E| indices):
  1. keys: each fp32 score mapped to a signed int32 that orders like the float (-0.0 folded onto
     +0.0: torch's sort ranks them equal); cnt(t) = sum of csize over clusters with key >= t.
  2. bisection over the 2^32 keys (32 steps): T = the largest t with cnt(t) >= K, and
     n_gt = cnt(T + 1) (the count of the last failed step; 0 if none failed).
  3. take(X) = csize(X) if key(X) > T; if key(X) == T: clamp(need - tied_before(X), 0, csize(X)) with
     need = K - n_gt and tied_before = sizes of the tied clusters of lower id (a running cumsum);
     else 0. Exactness: in the stable sort, X's list start is before(X) = sizes of the clusters of
     larger key, plus those of equal key and lower id, and X contributes clamp(K - before(X), 0,
     csize) tokens. key > T: before + csize <= cnt(T+1) < K (all of X); key < T: before >= cnt(T)
     >= K (nothing); key == T: before = n_gt + tied_before, the formula above.
  4. output offsets: exclusive cumsum of take in id order; each taking cluster writes its id at its
     offset (segment starts; the rest of [0, K) is -1), then a running max-scan over [0, K) of
     (offset << 32 | id) tells each slot its cluster and its rank inside it: index = order[cstart +
     slot - offset]. The segment marks live in the output itself (barriers between the phases).
  5. the exact set's valid slots (compacted by a cumsum), then position 0 up to the width.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import (
    HAVE_TRITON,
    backend_for,
    kernel_for,
    next_pow2,
    num_sms,
    tl,
    triton,
)

# --- the reference: Tactic's sort-based path -------------------------------------------------------

def rows_gather(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """src [B, Hkv, X] (per KV head), idx int64 [B, H, M] with H a multiple of Hkv (the rows of one
    KV head adjacent) -> src[b, kv_head(h), idx[b, h, m]] as [B, H, M]."""
    B, Hkv = src.shape[:2]
    H, M = idx.shape[1:]
    return src.gather(2, idx.reshape(B, Hkv, (H // Hkv) * M)).view(B, H, M)


class Ranking(NamedTuple):
    ranked: torch.Tensor    # int64 [B, H, C]: cluster ids, most critical first
    sizes: torch.Tensor     # int64 [B, H, C]: their sizes
    cum: torch.Tensor       # int64 [B, H, C]: list tokens through each ranked cluster (inclusive)


def rank(scores: torch.Tensor, csize: torch.Tensor) -> Ranking:
    """Clusters by descending score [B, H, C] (-inf: empty, ranked last with size 0); csize [B, Hkv, C]."""
    ranked = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    sizes = rows_gather(csize, ranked).long()
    return Ranking(ranked, sizes, sizes.cumsum(-1))


def list_positions(j: torch.Tensor, r: Ranking, cstart: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Token positions (int64 [B, H, M]) at list ranks j (int64 [B, H, M] or [M]); ranks at or past
    the list's length give some in-range position (callers mask them)."""
    B, H, C = r.cum.shape
    if j.dim() == 1:
        j = j.view(1, 1, -1).expand(B, H, -1)
    j = j.contiguous()
    c = torch.searchsorted(r.cum, j, right=True).clamp(max=C - 1)    # the ranked cluster holding rank j
    offset = j - (r.cum.gather(-1, c) - r.sizes.gather(-1, c))
    cid = r.ranked.gather(-1, c)
    slot = (rows_gather(cstart, cid).long() + offset).clamp(0, order.shape[-1] - 1)
    return rows_gather(order, slot).long()


def select_cluster_tokens_ref(scores, csize, cstart, order, k_row, e_pos, e_valid, kmax, ranking=None):
    """The contract above, list in rank order then E (valid slots must form a prefix of E, as
    Tactic's do). scores fp32 [B, H, C]; csize, cstart int32 [B, Hkv, >= C]; order int32 [B, Hkv,
    cap]; k_row int64 [B, H] (<= kmax and the list's length); e_pos int64 [Emax]; e_valid bool
    [B, Emax]; ranking: `rank(scores, csize)` when the caller has it already."""
    r = ranking if ranking is not None else rank(scores, csize)
    B = k_row.shape[0]
    emax = e_pos.numel()
    j = torch.arange(kmax + emax, device=k_row.device)
    pos_list = list_positions(j, r, cstart, order)
    je = (j.view(1, 1, -1) - k_row.unsqueeze(-1)).clamp(0, emax - 1)
    index = torch.where(j.view(1, 1, -1) < k_row.unsqueeze(-1), pos_list, e_pos[je])
    return index.int(), (k_row + e_valid.sum(-1).view(B, 1)).int()


# --- the kernel ---------------------------------------------------------------------------------------

SEARCH_NT = 4        # thresholds per search step (issue 33: 16 steps instead of the bisection's 32)
SELECT_WARPS = 8
# list slots per program: a row's list is written by up to cdiv(kmax, SELECT_SPAN) programs side by side,
# each repeating the search (C scores in registers) and writing its own slots, and no more programs than
# the SMs share out among the rows (each repeats the search: 58 programs a row made fit mode slower).
# H200, 128K, fit (~118K-slot lists, 32 rows), ms a step: one program a row 32.6, 4 a row 28.4, 8 a row
# 28.7, 58 a row 36.0 (notes/perf_bench.md, issue 33).
SELECT_SPAN = 2048

if HAVE_TRITON:

    @triton.jit
    def _okey(x):
        """Signed int32 (as int64) ordered like fp32 x; -0.0 and +0.0 the same key (the sort's ties)."""
        x = tl.where(x == 0.0, 0.0, x)
        i = x.to(tl.int32, bitcast=True)
        return tl.where(i >= 0, i, i ^ 0x7FFFFFFF).to(tl.int64)

    @triton.jit
    def _max(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _select_kernel(Sc, Sz, St, Od, Kr, Ep, Ev, Idx, Cnt,
                       C, H, G, EMAX, W, KMAX, SPAN,
                       s_sb, s_sh, s_zb, s_zh, s_tb, s_th, s_ob, s_oh, s_kb, s_kh, s_eb,
                       BLOCK_C: tl.constexpr, BLOCK_J: tl.constexpr, ONE: tl.constexpr,
                       NT: tl.constexpr = 4, STEPS: tl.constexpr = 16):
        pid = tl.program_id(0)
        part = tl.program_id(1)   # this program writes list slots [part * SPAN, (part + 1) * SPAN) of the row
        b = (pid // H).to(tl.int64)
        h = pid % H
        kv = h // G
        sc = Sc + b * s_sb + h * s_sh
        sz = Sz + b * s_zb + kv * s_zh
        st = St + b * s_tb + kv * s_th
        od = Od + b * s_ob + kv * s_oh
        out = Idx + pid.to(tl.int64) * W
        cc = tl.arange(0, BLOCK_C)
        jj = tl.arange(0, BLOCK_J)

        total = tl.zeros((), tl.int64)
        for c0 in range(0, C, BLOCK_C):
            total += tl.sum(tl.load(sz + c0 + cc, mask=c0 + cc < C, other=0).to(tl.int64), 0)
        K = tl.load(Kr + b * s_kb + h * s_kh).to(tl.int64)
        K = tl.maximum(tl.minimum(tl.minimum(K, total), KMAX), 0)

        # 2. an NT-way search (STEPS steps of one reduction over NT thresholds; NT = 2 is the plain
        # 32-step bisection, whose dependent reductions were most of the kernel at 4096 clusters):
        # invariant cnt(lo) >= K (cnt(-2^31) = total >= K); hi + 1 is the smallest failed threshold
        # (its count in n_gt) or past the keys. Sizes summed in int32 (a row holds < 2^31 tokens).
        if ONE:   # the whole row in registers (C <= BLOCK_C): read once, not once per step
            key1 = _okey(tl.load(sc + cc, mask=cc < C, other=0.0)).to(tl.int32)
            size1 = tl.load(sz + cc, mask=cc < C, other=0)
        lo = tl.full((), -2147483648, tl.int64)
        hi = tl.full((), 2147483647, tl.int64)
        n_gt = tl.zeros((), tl.int64)
        jv = tl.arange(0, NT).to(tl.int64) + 1      # thresholds lo + j * step, j = 1..NT (the last never inside)
        for _ in range(STEPS):
            step = (hi - lo + NT) // NT              # ceil(width / NT) >= 1
            tj = lo + jv * step
            t32 = tl.minimum(tj, 2147483647).to(tl.int32)   # past hi anyway where clipped (masked by ok)
            if ONE:
                cnt = tl.sum(tl.where(key1[None, :] >= t32[:, None], size1[None, :], 0), 1).to(tl.int64)
            else:
                cnt = tl.zeros((NT,), tl.int64)
                for c0 in range(0, C, BLOCK_C):
                    m = c0 + cc < C
                    key = _okey(tl.load(sc + c0 + cc, mask=m, other=0.0)).to(tl.int32)
                    size = tl.load(sz + c0 + cc, mask=m, other=0)
                    cnt += tl.sum(tl.where(key[None, :] >= t32[:, None], size[None, :], 0), 1).to(tl.int64)
            ok = (tj <= hi) & (cnt >= K)               # non-increasing in j: a prefix of the thresholds
            js = tl.max(tl.where(ok, jv, 0), 0)
            tf = lo + (js + 1) * step                  # the first failing threshold, if inside [lo, hi]
            cf = tl.sum(tl.where(jv == js + 1, cnt, 0), 0)
            inside = tf <= hi
            n_gt = tl.where(inside, cf, n_gt)
            hi = tl.where(inside, tf - 1, hi)
            lo = lo + js * step
        T = lo
        need = K - n_gt

        # 4. segment marks over this program's slots [j_lo, j_hi) of [0, K): -1, then each taking cluster's id
        # at its output offset where that falls inside; the segment already open at j_lo (the taking cluster
        # of largest offset below it) comes in as the scan's carry
        j_lo = part.to(tl.int64) * SPAN
        j_hi = tl.minimum(j_lo + SPAN, K)
        for j0 in range(j_lo, j_hi, BLOCK_J):
            tl.store(out + j0 + jj, tl.full((BLOCK_J,), -1, tl.int32), mask=j0 + jj < j_hi)
        tl.debug_barrier()   # the -1s land before the marks (other threads write both)
        tied = tl.zeros((), tl.int64)
        wr = tl.zeros((), tl.int64)
        carry = tl.full((), -1, tl.int64)
        for c0 in range(0, C, BLOCK_C):
            m = c0 + cc < C
            key = _okey(tl.load(sc + c0 + cc, mask=m, other=0.0))
            size = tl.load(sz + c0 + cc, mask=m, other=0).to(tl.int64)
            tie = m & (key == T)
            tsz = tl.where(tie, size, 0)
            before = tied + tl.cumsum(tsz, 0) - tsz
            take = tl.where(m & (key > T), size, tl.where(tie, tl.minimum(tl.maximum(need - before, 0), size), 0))
            off = wr + tl.cumsum(take, 0) - take
            tl.store(out + off, (c0 + cc).to(tl.int32), mask=(take > 0) & (off >= j_lo) & (off < j_hi))
            before_lo = (take > 0) & (off < j_lo)
            carry = tl.maximum(carry, tl.max(tl.where(before_lo, (off << 32) | (c0 + cc).to(tl.int64), -1), 0))
            tied += tl.sum(tsz, 0)
            wr += tl.sum(take, 0)
        tl.debug_barrier()
        # each slot: the latest mark at or before it = (segment start, cluster id)
        for j0 in range(j_lo, j_hi, BLOCK_J):
            j = j0 + jj
            jm = j < j_hi
            mk = tl.load(out + j, mask=jm, other=-1)
            packed = tl.where(mk >= 0, (j.to(tl.int64) << 32) | mk.to(tl.int64), -1)
            run = tl.maximum(tl.associative_scan(packed, 0, _max), carry)
            carry = tl.max(run, 0)
            seg = run >> 32
            cid = (run - (seg << 32)).to(tl.int32)
            start = tl.load(st + cid, mask=jm, other=0).to(tl.int64)
            pos = tl.load(od + start + (j - seg), mask=jm, other=0)
            tl.debug_barrier()   # every mark of this tile read before any slot is overwritten
            tl.store(out + j, pos, mask=jm)

        # 5. the exact set's valid slots after the list, then position 0 up to the width: the row's first program
        if part == 0:
            ne = tl.zeros((), tl.int64)
            for e0 in range(0, EMAX, BLOCK_J):
                e = e0 + jj
                v = (tl.load(Ev + b * s_eb + e, mask=e < EMAX, other=0) != 0).to(tl.int64)
                p = tl.load(Ep + e, mask=e < EMAX, other=0)
                tl.store(out + K + ne + tl.cumsum(v, 0) - v, p.to(tl.int32), mask=v > 0)
                ne += tl.sum(v, 0)
            n = K + ne
            for j0 in range((n // BLOCK_J) * BLOCK_J, W, BLOCK_J):
                j = j0 + jj
                tl.store(out + j, tl.zeros((BLOCK_J,), tl.int32), mask=(j >= n) & (j < W))
            tl.store(Cnt + pid, n.to(tl.int32))


def search_steps(nt: int) -> int:
    """Steps of the NT-way search to narrow the 2^32 keys to one: w -> ceil(w / NT)."""
    w, n = 1 << 32, 0
    while w > 1:
        w, n = -(-w // nt), n + 1
    return n


def select_cluster_tokens(scores, csize, cstart, order, k_row, e_pos, e_valid, kmax, *, ranking=None,
                          block_c: int | None = None, block_j: int | None = None, nt: int | None = None,
                          warps: int | None = None, span: int | None = None):
    """(index int32 [B, H, kmax + Emax], counts int32 [B, H]): the module's contract. Triton on CUDA,
    the reference elsewhere (`ranking` is used by the reference only). csize, cstart and order may
    have any strides but a unit last one; block_c / block_j override the tile sizes (tests: several tiles).
    nt: thresholds per step of the search for the K-th cluster key (SEARCH_NT; 2 = the bisection it
    replaced), warps: per program (SELECT_WARPS), span: list slots per program (SELECT_SPAN, rounded up to
    whole tiles; on CUDA at most SMs / rows programs a row): timing switches, the same set whatever they are."""
    if backend_for(scores) == "torch":
        return select_cluster_tokens_ref(scores, csize, cstart, order, k_row, e_pos, e_valid, kmax, ranking)
    B, H, C = scores.shape
    G = H // csize.shape[1]
    emax = e_pos.numel()
    W = kmax + emax
    # csize/cstart/order keep their own strides (a ClusterIndex slice, or a copy .cuda() made dense)
    assert csize.stride(-1) == cstart.stride(-1) == order.stride(-1) == 1
    assert csize.dtype == cstart.dtype == order.dtype == torch.int32
    # no conversion call where there is nothing to convert (each is a dispatched op, if not a launch)
    sc = scores if scores.dtype == torch.float32 and scores.is_contiguous() else scores.float().contiguous()
    # bool -> bytes without a copy (a cast would add a kernel launch per layer)
    ev = e_valid.contiguous().view(torch.uint8) if e_valid.dtype == torch.bool else e_valid.contiguous()
    ep = e_pos if e_pos.dtype == torch.long and e_pos.is_contiguous() else e_pos.long().contiguous()
    kr = k_row if k_row.dtype == torch.long else k_row.long()
    idx = torch.empty(B, H, W, device=scores.device, dtype=torch.int32)
    cnt = torch.empty(B, H, device=scores.device, dtype=torch.int32)
    cuda = scores.is_cuda
    bc = block_c or min(next_pow2(C), 4096 if cuda else 64)
    bj = block_j or (1024 if cuda else 32)
    # programs a row: the SMs' share per row on CUDA (the interpreter: as many as the span asks, for the tests)
    cap = max(1, num_sms(scores) // (B * H)) if cuda else max(1, kmax)
    span = max(span or SELECT_SPAN, -(-kmax // cap), 1)
    span = -(-span // bj) * bj                       # whole tiles per program
    parts = max(1, -(-kmax // span))
    kernel_for(_select_kernel, scores)[(B * H, parts)](
        sc, csize, cstart, order, kr, ep, ev, idx, cnt,
        C, H, G, emax, W, kmax, span,
        sc.stride(0), sc.stride(1), csize.stride(0), csize.stride(1), cstart.stride(0), cstart.stride(1),
        order.stride(0), order.stride(1),
        kr.stride(0), kr.stride(1), ev.stride(0),
        BLOCK_C=bc, BLOCK_J=bj, ONE=C <= bc, NT=nt or SEARCH_NT, STEPS=search_steps(nt or SEARCH_NT),
        num_warps=(warps or SELECT_WARPS) if cuda else 1)
    return idx, cnt
