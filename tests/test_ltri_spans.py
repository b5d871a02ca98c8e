"""Ltri-LLM span detection (methods/parts/ltri_spans.py) against brute-force references written from the
paper's equations: every span's triangle score summed cell by cell (Eq. 5, O(n^4) here), the best
span per anti-diagonal (appendix E), greedy NMS by IoU in plain Python, neighbour ratios summed cell
by cell (figure 5), index-vector counts from Eq. 7."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from methods.parts import ltri_spans as LS


def _map(n, seed, blocks=(), normalise=True):
    g = torch.Generator().manual_seed(seed)
    A = torch.rand(n, n, generator=g, dtype=torch.float64) * 0.2
    for x, y in blocks:  # planted triangles: strong mutual attention inside a span
        A[x:y + 1, x:y + 1] += 1.0
    A = torch.tril(A)
    return A / A.sum(1, keepdim=True) if normalise else A


def grid(vals, bits=12):
    """selection.tie_round written out: each value to the nearest multiple of 2^(ceil(log2(max |v|)) - bits)
    (decisions on scores that tie up to rounding noise must not depend on the device)."""
    finite = [abs(v) for v in vals if math.isfinite(v)]
    step = 2.0 ** (math.ceil(math.log2(max(max(finite, default=0.0), 2.0 ** -126))) - bits)
    return [round(v / step) * step if math.isfinite(v) else v for v in vals]


def brute_spans(A, q, iou, n_spans, fill):
    n = A.shape[0]
    a = A.tolist()
    vals = [a[i][j] for i in range(n) for j in range(i + 1)]
    theta = float(np.quantile(np.array(vals), q))
    S = {}
    for x in range(n):
        for y in range(x, n):
            S[x, y] = sum(a[i][j] - theta for i in range(x, y + 1) for j in range(x, i + 1))
    S = dict(zip(S, grid(list(S.values()))))
    cands = []
    for s in range(2 * n - 1):
        pts = [(x, s - x) for x in range(n) if x <= s - x < n]
        best = max(S[p] for p in pts)
        cands.append(next(p for p in pts if S[p] == best) + (best,))
    order = sorted(range(len(cands)), key=lambda i: -cands[i][2])
    kept, dead = [], set()
    for i in order:
        if i in dead:
            continue
        kept.append(i)
        xi, yi, _ = cands[i]
        for j, (xj, yj, _) in enumerate(cands):
            inter = max(0, min(yi, yj) - max(xi, xj) + 1)
            if j != i and inter / ((yi - xi + 1) + (yj - xj + 1) - inter) > iou:
                dead.add(j)
        dead.add(i)
    spans = sorted(cands[i][:2] for i in kept[:n_spans])
    if not fill:
        return spans
    out, nxt = [], 0
    for x, y in spans:
        x = max(x, nxt)
        if x > y:
            continue
        if x > nxt:
            out.append((nxt, x - 1))
        out.append((x, y))
        nxt = y + 1
    return out + ([(nxt, n - 1)] if nxt < n else [])


@pytest.mark.parametrize("n,seed,q,iou,k,fill", [(16, 0, 0.9, 0.1, 4, False), (16, 1, 0.5, 0.3, 3, True),
                                                 (21, 2, 0.93, 0.01, 4, True), (9, 3, 0.7, 0.5, 10, False)])
def test_spans_equal_brute_force(n, seed, q, iou, k, fill):
    A = _map(n, seed, blocks=[(2, 6), (9, 12)] if n > 12 else [(1, 4)])
    assert LS.detect_spans(A.float(), q, iou, k, fill) == brute_spans(A.float().double(), q, iou, k, fill)


def test_triangle_scores_equal_cell_sums():
    A = _map(12, 4)
    S = LS.triangle_scores(A, 0.05)
    for x in range(12):
        for y in range(12):
            want = sum(float(A[i, j]) - 0.05 for i in range(x, y + 1) for j in range(x, i + 1)) if x <= y else None
            if want is None:
                assert S[x, y] == float("-inf")
            else:
                assert abs(float(S[x, y]) - want) < 1e-9


def test_planted_triangles_are_found():
    """theta between the noise and the planted cells (a quantile halfway between the two ranks): each
    planted triangle scores positive, anything reaching across noise negative."""
    A = _map(40, 5, blocks=[(3, 11), (20, 33)], normalise=False)
    cells, planted = 40 * 41 // 2, 9 * 10 // 2 + 14 * 15 // 2
    spans = LS.detect_spans(A, (cells - planted - 0.5) / (cells - 1), 0.1, 2, fill_gaps=False)
    assert spans == [(3, 11), (20, 33)]


@pytest.mark.parametrize("mode", ["row", "col", "rowcol"])
@pytest.mark.parametrize("density", [False, True])
def test_neighbor_ratio_equals_cell_sums(mode, density):
    n = 14
    A = _map(n, 6)
    spans = [(0, 3), (4, 8), (9, 13)]
    got = LS.neighbor_ratio(A, spans, mode, density)
    for (x, y), r in zip(spans, got):
        tri = [float(A[i, j]) for i in range(x, y + 1) for j in range(x, i + 1)]
        row = [float(A[i, j]) for i in range(x, y + 1) for j in range(0, x)]
        col = [float(A[i, j]) for i in range(y + 1, n) for j in range(x, y + 1)]
        f = (lambda v: sum(v) / len(v) if v else 0.0) if density else sum
        nbr = {"row": f(row), "col": f(col), "rowcol": f(row) + f(col)}[mode]
        assert abs(r - f(tri) / (f(tri) + nbr)) < 1e-9


def test_vector_counts_follow_eq7_and_the_budget():
    lengths, r_a = [10, 30, 5, 40], [1.0, 0.5, 0.2, 0.9]
    free = LS.vector_counts(lengths, r_a, 3.0, 1, 10 ** 6)
    assert free == [min(L, max(1, math.ceil(L * math.exp(-3 * (1 - r)) - 1e-9))) for L, r in zip(lengths, r_a)]
    capped = LS.vector_counts(lengths, r_a, 3.0, 1, 12)
    assert sum(capped) == 12 and all(c >= 1 for c in capped)
    # lambda 20: 10, 1, 1, 6 before the cap; the cap takes from the largest (ties: the later span)
    assert LS.vector_counts(lengths, r_a, 20.0, 1, 12) == [5, 1, 1, 5]
    assert LS.vector_counts(lengths, r_a, 3.0, 1, 12, static=True) == [3, 3, 3, 3]


# --- the fast paths against the plain formulation they replaced: the same bits -----------------------------

def _plain_triangle_scores(A, theta):
    n = A.shape[0]
    P = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    P[1:, 1:] = torch.tril(A.double() - theta).cumsum(0).cumsum(1)
    x, y = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    return torch.where(x <= y, P[y + 1, y + 1] - P[x, y + 1] - P[y + 1, x] + P[x, x], float("-inf"))


@pytest.mark.parametrize("n", [1, 2, 3, 8, 129, 300])
def test_triangle_scores_bit_equal_the_plain_formula(n):
    for seed in range(3):
        A = _map(n, 100 + seed).float()
        assert torch.equal(LS.triangle_scores(A, 0.003 * seed), _plain_triangle_scores(A, 0.003 * seed))


def brute_antidiagonal(S):
    n = len(S)
    out = []
    for s in range(2 * n - 1):
        pts = [(x, s - x) for x in range(n) if x <= s - x < n]
        best = max(S[x][y] for x, y in pts)
        out.append(next((x, y, best) for x, y in pts if S[x][y] == best))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 16, 33])
def test_antidiagonal_best_equals_a_loop_with_ties(n):
    """Few distinct scores (ties on most anti-diagonals: the smallest x wins), some diagonals all -inf (kept,
    with their smallest x), the cells below the diagonal never read."""
    g = torch.Generator().manual_seed(n)
    for trial in range(6):
        S = torch.randint(-2, 3, (n, n), generator=g).double()
        if trial % 2:
            S[torch.rand(n, n, generator=g) < 0.5] = float("-inf")
        xs, ys, sc = LS.antidiagonal_best(S)
        assert list(zip(xs.tolist(), ys.tolist(), sc.tolist())) == brute_antidiagonal(S.tolist())


@pytest.mark.parametrize("n", [2, 5, 128, 300, 513])
def test_quantile_equals_torch_quantile(n):
    """Bit for bit, also past the size where the partial sort first cuts to a sampled bracket; ties."""
    g = torch.Generator().manual_seed(n)
    for A in (_map(n, n).float(), torch.tril((torch.rand(n, n, generator=g) < 0.1).float() * 0.5)):
        low = A[torch.ones(n, n, dtype=torch.bool).tril()].double()
        for q in (0.0, 0.5, 0.9, 0.93, 0.999, 1.0):
            assert LS.quantile_low(A, q) == float(torch.quantile(low, q))


def test_in_place_rounding_is_selection_tie_round():
    from methods.parts.selection import tie_round
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30) for _ in range(20)]
    rows += [np.zeros(7), np.array([0.5, -0.25, 2.0 ** -1030]), np.array([1.0, -np.inf, 3.0]), np.array([np.nan, 1.0])]
    for v in rows:
        got = LS._tie_round_(v.copy().reshape(1, -1))
        assert np.array_equal(got[0], tie_round(torch.from_numpy(v).reshape(1, -1))[0].numpy(), equal_nan=True)
