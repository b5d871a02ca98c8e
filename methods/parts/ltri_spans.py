"""Ltri-LLM's semantic spans (paper sections 3.2-3.3, appendix E), as functions of one attention map.

A is an n x n attention map of consecutive tokens (rows: queries i, columns: keys j, lower triangle;
heads already summed), e.g. a 128-token block leaving the local window, or the current chunk. Everything
here runs on the host in fp64 (`host`: one transfer per map): a span costs microseconds there, while on a
GPU the same work was dozens of tiny kernels and several device-to-host syncs per block.

triangle_scores   S[x, y] = sum over x <= j <= i <= y of (A[i, j] - theta): Eq. 5 (the mask P subtracts
                  theta on the lower triangle only), every span in O(n^2) from 2-D prefix sums.
antidiagonal_best appendix E's filter: on each anti-diagonal x + y = s keep the best span (ties: the
                  smallest x), so NMS sees at most 2n - 1 candidates; the spans are laid out one anti-
                  diagonal per row (cached index tables per n), so the filter is a row argmax.
nms_1d            greedy non-maximum suppression of intervals (torchvision.ops.nms on boxes
                  [x, 0, y + 1, 1]: score order, drop every interval whose IoU with a kept one > iou).
detect_spans      the above with theta = a quantile of A's lower-triangle entries (paper: 90th
                  percentile / tables 6-7), the `n_spans` best kept spans, optionally the gaps between
                  them filled with spans of their own so the spans partition the tokens.
neighbor_ratio    r_a per span: its triangle's attention against its row neighbours (its queries'
                  attention to earlier tokens of the map), column neighbours (later queries' attention
                  to it) or both (figure 5), as mass or as density (per cell).
vector_counts     dynamic index vectors per span: ceil(len * exp(-lambda * (1 - r_a))) (Eq. 7) clipped to
                  [vmin, len], then at most `budget` per map (M): one at a time from the largest count (ties: the
                  later span), never below vmin.
The fast paths give the bits of the plain formulation they replaced (tests/test_ltri_spans.py): same
sums in the same order, torch.quantile's interpolation, selection.tie_round's grid.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from methods.parts.selection import tie_round, top_first


def host(A: torch.Tensor) -> torch.Tensor:
    """A on the CPU in fp64, in one transfer (a no-op when it is there already)."""
    return A.detach().to("cpu", torch.float64)


@functools.lru_cache(maxsize=16)
def _tril_mask(n: int, k: int = 0) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool), k)


@functools.lru_cache(maxsize=8)
def _antidiagonals(n: int) -> dict[str, np.ndarray]:
    """Spans of n tokens laid out by anti-diagonal: row s lists the spans (x, s - x) with x <= y < n, x
    ascending from lo[s], padded to (n + 1) // 2 columns (pad: True there); cell: each one's flat index
    into an n x n map, padding pointing at (n - 1, 0), a cell below the diagonal that callers overwrite."""
    s = np.arange(2 * n - 1).reshape(-1, 1)
    lo = np.maximum(0, s - n + 1)
    x = lo + np.arange((n + 1) // 2).reshape(1, -1)
    pad = x > s - x
    t = {"pad": pad, "lo": lo[:, 0], "s": s[:, 0], "cell": np.where(pad, (n - 1) * n, x * n + (s - x))}
    for v in t.values():
        v.flags.writeable = False   # shared by every call
    return t


def _scores(A: torch.Tensor, theta: float) -> np.ndarray:
    """[n, n] fp64: S[x, y] = P[y+1, y+1] - P[x, y+1] - P[y+1, x] + P[x, x] for every (x, y), P the 2-D
    prefix sums of tril(A - theta) (row and column 0 zero); below the diagonal meaningless."""
    n = A.shape[0]
    P = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    M = P[1:, 1:]
    torch.sub(A, theta, out=M)     # in place: the same sums as tril(A - theta).cumsum(0).cumsum(1)
    M.tril_().cumsum_(0).cumsum_(1)
    P = P.numpy()
    d = P.diagonal()
    S = d[1:].reshape(1, -1) - P[:n, 1:]     # slices, in the order of the formula
    S -= P[1:, :n].T
    S += d[:n].reshape(-1, 1)
    return S


def triangle_scores(A: torch.Tensor, theta: float) -> torch.Tensor:
    """[n, n] fp64 on the host: S[x, y] for x <= y, -inf elsewhere."""
    A = host(A)
    S = _scores(A, theta)
    S[_tril_mask(A.shape[0], -1)] = -np.inf
    return torch.from_numpy(S)


def _by_antidiagonal(S: np.ndarray, pad: float) -> np.ndarray:
    """[2n - 1, (n + 1) // 2]: S's spans (x <= y) by anti-diagonal, x ascending; padding = `pad`."""
    n = S.shape[0]
    if n > 1:
        S[n - 1, 0] = pad
    return S.reshape(-1).take(_antidiagonals(n)["cell"])


def _tie_round_(G: np.ndarray, bits: int = 12) -> np.ndarray:
    """selection.tie_round of G as one row, in place: the same grid step (its formula on the largest |G|)
    and the same round-half-even of G / step (exact: step is a power of two). Non-finite entries go to
    tie_round itself (it leaves them as they are and ignores them for the grid)."""
    hi, lo = G.max(initial=0.0), G.min(initial=0.0)
    if not (np.isfinite(hi) and np.isfinite(lo)):
        G[...] = tie_round(torch.from_numpy(G).reshape(1, -1), bits).view(G.shape).numpy()
        return G
    top = torch.tensor([[max(abs(hi), abs(lo))]], dtype=torch.float64).clamp(min=torch.finfo(torch.float64).tiny)
    step = float(torch.exp2(torch.ceil(torch.log2(top)) - bits))
    np.divide(G, step, out=G)
    np.rint(G, out=G)
    np.multiply(G, step, out=G)
    return G


def _best(G: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, score) of each row's first maximum (padding -inf); a row whose maximum is NaN is dropped
    (scatter_reduce's amax, which this replaced, propagated NaN and then matched no cell); a row of -inf
    keeps its first cell, the padding coming last."""
    t = _antidiagonals(n)
    k = G.argmax(1)
    best = G[np.arange(G.shape[0]), k]
    xs = t["lo"] + k
    keep = ~np.isnan(best)
    return xs[keep], (t["s"] - xs)[keep], best[keep]


def antidiagonal_best(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, score) of the best span on every anti-diagonal x + y = s (ties: the smallest x)."""
    S = host(S).numpy().copy()
    return tuple(torch.from_numpy(v) for v in _best(_by_antidiagonal(S, -np.inf), S.shape[0]))


def nms_1d(x: np.ndarray, y: np.ndarray, score: np.ndarray, iou: float, limit: int | None = None) -> list[int]:
    """Indices kept by greedy NMS over inclusive intervals [x, y], best score first (stable); the first
    `limit` of them (greedy: later ones cannot change those)."""
    order = np.argsort(-score, kind="stable")
    length = (y - x + 1).astype(np.float64)
    alive = np.ones(len(x), dtype=bool)
    kept = []
    for i in order:
        if limit is not None and len(kept) >= limit:
            break
        if not alive[i]:
            continue
        kept.append(int(i))
        inter = np.maximum(np.minimum(y, y[i]) - np.maximum(x, x[i]) + 1, 0)
        ratio = inter / (length + length[i] - inter)
        alive &= ~(ratio > iou)
        alive[i] = False
    return kept


def _order_stats(v: np.ndarray, below: int, above: int) -> tuple[float, float]:
    """The below-th and above-th smallest of v (0-based, above in {below, below + 1}); v is reordered. A
    large v is first cut to the values between two bounds read off a strided sample around the rank
    (those below the cut only counted), unless the bounds miss the ranks."""
    if v.size > 32768:
        sample = np.sort(v[::64])
        j = below * (sample.size - 1) // (v.size - 1)
        lo, hi = sample[max(0, j - 16)], sample[min(sample.size - 1, j + 17)]
        n_lo = int(np.count_nonzero(v < lo))
        mid = v[(v >= lo) & (v <= hi)]
        if n_lo <= below and n_lo + mid.size > above:
            v, below, above = mid, below - n_lo, above - n_lo
    v.partition(below)
    return v[below], (v[below] if above == below else v[below + 1:].min())


def quantile_low(A: torch.Tensor, q: float) -> float:
    """torch.quantile(A's lower-triangle entries, q) (linear; a single entry: itself), with the same bits
    from a partial sort: torch's rank arithmetic, its two order statistics, its lerp."""
    low = host(A).numpy()[_tril_mask(A.shape[0])]
    if low.size <= 1:
        return float(low.sum())
    if np.isnan(low).any():
        return float(torch.quantile(torch.from_numpy(low), q))
    rank = torch.tensor([q], dtype=torch.float64) * (low.size - 1)
    v_below, v_above = _order_stats(low, int(rank.long()), int(rank.ceil().long()))
    return float(torch.tensor([v_below]).lerp(torch.tensor([v_above]), rank - int(rank.long())))


def detect_spans(A: torch.Tensor, theta_quantile: float, iou: float, n_spans: int,
                 fill_gaps: bool = True) -> list[tuple[int, int]]:
    """Spans [(x, y)] inclusive, sorted by x, of the map A [n, n] (moved by `host` unless it is there)."""
    n = A.shape[0]
    if n == 0:
        return []
    A = host(A)
    G = _by_antidiagonal(_scores(A, quantile_low(A, theta_quantile)), 0.0)
    # rounded: spans whose scores differ by rounding noise tie, and the smallest x / the stable order wins
    # (the candidates' grid is the whole map's: a padding 0 changes no largest |S|)
    _tie_round_(G)
    np.copyto(G, -np.inf, where=_antidiagonals(n)["pad"])
    xs, ys, sc = _best(G, n)
    kept = nms_1d(xs, ys, sc, iou, n_spans)
    spans = sorted((int(xs[i]), int(ys[i])) for i in kept)
    return fill(spans, n) if fill_gaps else spans


def fill(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """Make the spans a partition of 0..n-1: overlaps are cut (the earlier span keeps its tokens),
    uncovered runs become spans of their own."""
    out, nxt = [], 0
    for x, y in spans:
        x = max(x, nxt)
        if x > y:
            continue
        if x > nxt:
            out.append((nxt, x - 1))
        out.append((x, y))
        nxt = y + 1
    if nxt < n:
        out.append((nxt, n - 1))
    return out


def neighbor_ratio(A: torch.Tensor, spans: list[tuple[int, int]], mode: str, density: bool) -> list[float]:
    """r_a in [0, 1] per span: triangle / (triangle + neighbours); 1 where all are zero."""
    n = A.shape[0]
    P = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    P[1:, 1:] = host(A)    # in place: the same sums as tril(A).cumsum(0).cumsum(1)
    P[1:, 1:].tril_().cumsum_(0).cumsum_(1)
    P = P.numpy()

    def rect(r0, r1, c0, c1):  # rows r0..r1-1, cols c0..c1-1
        if r1 <= r0 or c1 <= c0:
            return 0.0, 0
        return P[r1, c1] - P[r0, c1] - P[r1, c0] + P[r0, c0], (r1 - r0) * (c1 - c0)

    out = []
    for x, y in spans:
        L = y - x + 1
        tri, _ = rect(x, y + 1, x, y + 1)
        tri_cells = L * (L + 1) // 2
        row, row_cells = rect(x, y + 1, 0, x)
        col, col_cells = rect(y + 1, n, x, y + 1)
        if density:
            tri = tri / tri_cells
            row = row / row_cells if row_cells else 0.0
            col = col / col_cells if col_cells else 0.0
        nbr = {"row": row, "col": col, "rowcol": row + col}[mode]
        out.append(1.0 if tri + nbr <= 0 else float(tri / (tri + nbr)))
    return out


def vector_counts(lengths: list[int], r_a: list[float], lam: float, vmin: int, budget: int,
                  static: bool = False) -> list[int]:
    """Index vectors per span (Eq. 7, or static: budget // spans each), at most `budget` in all."""
    if static:
        each = max(vmin, budget // max(1, len(lengths)))
        counts = [min(each, L) for L in lengths]
    else:
        counts = [min(L, max(vmin, math.ceil(L * math.exp(-lam * (1.0 - r)) - 1e-9))) for L, r in zip(lengths, r_a)]
    floor = [min(vmin, L) for L in lengths]
    while sum(counts) > budget:
        cand = [i for i in range(len(counts)) if counts[i] > floor[i]]
        if not cand:
            break
        i = max(cand, key=lambda j: (counts[j], j))
        counts[i] -= 1
    return counts


def index_map(A: torch.Tensor, votes: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool, mode: str,
              density: bool, lam: float, vmin: int, budget: int, static: bool = False):
    """One map's index vectors (the reference: methods/parts/ltri_batch.py does a stack of maps at once):
    (picked token indices, their span's index, span count); each span keeps the tokens its votes (attention
    received, tie_rounded over the span) rank first, ties to the earlier token."""
    spans = detect_spans(A, q, iou, n_spans, fill_gaps)
    r_a = neighbor_ratio(A, spans, mode, density)
    counts = vector_counts([y - x + 1 for x, y in spans], r_a, lam, vmin, budget, static)
    picked = torch.cat([top_first(tie_round(votes[x:y + 1]), k) + x for (x, y), k in zip(spans, counts)])
    return picked, torch.repeat_interleave(torch.arange(len(spans)), torch.tensor(counts)), len(spans)
