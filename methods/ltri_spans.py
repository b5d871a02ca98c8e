"""Ltri-LLM's semantic spans (paper sections 3.2-3.3, appendix E), as functions of one attention map.

A is an n x n attention map of consecutive tokens (rows: queries i, columns: keys j, lower triangle;
heads already summed), e.g. a 128-token block leaving the local window, or the current chunk.

triangle_scores   S[x, y] = sum over x <= j <= i <= y of (A[i, j] - theta): Eq. 5 (the mask P subtracts
                  theta on the lower triangle only), every span in O(n^2) from 2-D prefix sums.
antidiagonal_best appendix E's filter: on each anti-diagonal x + y = s keep the best span (ties: the
                  smallest x), so NMS sees at most 2n - 1 candidates.
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
"""
from __future__ import annotations

import math

import numpy as np
import torch

from methods.selection import tie_round


def triangle_scores(A: torch.Tensor, theta: float) -> torch.Tensor:
    """[n, n] fp64: S[x, y] for x <= y, -inf elsewhere."""
    n = A.shape[0]
    M = torch.tril(A.double() - theta)
    P = torch.zeros(n + 1, n + 1, dtype=torch.float64, device=A.device)
    P[1:, 1:] = M.cumsum(0).cumsum(1)
    idx = torch.arange(n, device=A.device)
    x, y = idx.view(-1, 1), idx.view(1, -1)
    S = P[y + 1, y + 1] - P[x, y + 1] - P[y + 1, x] + P[x, x]
    return torch.where(x <= y, S, float("-inf"))


def antidiagonal_best(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, score) of the best span on every anti-diagonal x + y = s (ties: the smallest x)."""
    n = S.shape[0]
    idx = torch.arange(n, device=S.device)
    x = idx.view(-1, 1).expand(n, n).reshape(-1)
    y = idx.view(1, -1).expand(n, n).reshape(-1)
    s = (x + y)
    flat = S.reshape(-1)
    valid = x <= y
    x, y, s, flat = x[valid], y[valid], s[valid], flat[valid]
    best = torch.full((2 * n - 1,), float("-inf"), dtype=S.dtype, device=S.device).scatter_reduce(0, s, flat, "amax")
    hit = flat == best[s]
    first = torch.full((2 * n - 1,), n, dtype=torch.long, device=S.device).scatter_reduce(
        0, s[hit], x[hit], "amin")
    xs = first
    ys = torch.arange(2 * n - 1, device=S.device) - xs
    keep = xs < n
    return xs[keep], ys[keep], best[keep]


def nms_1d(x: np.ndarray, y: np.ndarray, score: np.ndarray, iou: float) -> list[int]:
    """Indices kept by greedy NMS over inclusive intervals [x, y], best score first (stable)."""
    order = np.argsort(-score, kind="stable")
    length = (y - x + 1).astype(np.float64)
    alive = np.ones(len(x), dtype=bool)
    kept = []
    for i in order:
        if not alive[i]:
            continue
        kept.append(int(i))
        inter = np.clip(np.minimum(y, y[i]) - np.maximum(x, x[i]) + 1, 0, None)
        ratio = inter / (length + length[i] - inter)
        alive &= ~(ratio > iou)
        alive[i] = False
    return kept


def detect_spans(A: torch.Tensor, theta_quantile: float, iou: float, n_spans: int,
                 fill_gaps: bool = True) -> list[tuple[int, int]]:
    """Spans [(x, y)] inclusive, sorted by x, of the map A [n, n]."""
    n = A.shape[0]
    if n == 0:
        return []
    low = A[torch.tril(torch.ones(n, n, dtype=torch.bool, device=A.device))].double()
    theta = float(torch.quantile(low, theta_quantile)) if low.numel() > 1 else float(low.sum())
    # rounded: spans whose scores differ by rounding noise tie, and the smallest x / the stable order wins
    xs, ys, sc = antidiagonal_best(tie_round(triangle_scores(A, theta).reshape(1, -1)).view(n, n))
    xs, ys, sc = xs.cpu().numpy(), ys.cpu().numpy(), sc.double().cpu().numpy()
    kept = nms_1d(xs, ys, sc, iou)[:n_spans]
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
    Af = torch.tril(A.double())
    P = torch.zeros(n + 1, n + 1, dtype=torch.float64, device=A.device)
    P[1:, 1:] = Af.cumsum(0).cumsum(1)
    P = P.cpu().numpy()

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
