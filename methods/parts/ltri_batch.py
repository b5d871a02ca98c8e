"""Ltri-LLM's span work over a stack of maps at once: the per-map rules of methods/parts/ltri_spans.py (the
reference, a transcription of the paper) as a fixed sequence of vectorised numpy operations on the host, whatever
the number of maps (a prefill chunk's leaving blocks x batch rows, or a chunk's query maps):

  quantile      theta per map: the two order statistics torch.quantile takes (one np.partition per stack; a
                map over 32,768 lower entries: the reference's bracketed selection), torch's lerp on one element
  scores        2-D prefix sums of tril(A - theta) (two sequential cumsums), every span's triangle score
  anti-diagonal the candidate grid as one take [N, 2n - 1, (n + 1) // 2], tie_round on the map's grid, argmax
  NMS           `n_spans` greedy steps over [N, 2n - 1] (argmax of the live scores, IoU against all)
  fill          cummax of the kept spans' ends: gaps and cut overlaps, as [N, 2K + 1] slots
  ratios        prefix sums of tril(A), three rectangle sums per span slot
  counts        Eq. 7 (np.exp: math.exp's bits), then the budget cap in closed form (a level per map: _cap)
  picks         each slot's votes tie_rounded and stably sorted as a row of the map's votes, the first `count`
                kept: one sort over [N, slots, n]
The same bits as the reference (tests/test_ltri_batch.py: many seeds, settings and ties): the same IEEE
operations in the same order (cumsums sequential along the reference's axes), torch's log2 grid and scalar lerp.
numpy, not torch: on these sizes torch's intra-op threads cost more than they save, and on a GPU the scans
would add in another order. Maps with a non-finite entry go through the reference one by one.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from methods.parts import ltri_spans as LS
from methods.parts.selection import tie_round


@functools.lru_cache(maxsize=16)
def _tables(n: int) -> dict[str, np.ndarray]:
    t = dict(LS._antidiagonals(n))
    t["upper"] = ~LS._tril_mask(n)
    t["tril_inf"] = np.where(LS._tril_mask(n), 0.0, np.inf)
    return t


def _prefix(A: np.ndarray, theta: np.ndarray | None = None) -> np.ndarray:
    """[N, n + 1, n + 1] 2-D prefix sums of tril(A - theta) (or of tril(A)), row and column 0 zero: the
    reference's sums (rows, then columns, each sequential), vectorised across the other axes."""
    N, n = A.shape[0], A.shape[-1]
    P = np.zeros((N, n + 1, n + 1))
    M = P[:, 1:, 1:]
    if theta is None:
        M[...] = A
    else:
        np.subtract(A, theta.reshape(N, 1, 1), out=M)
    np.copyto(M, 0.0, where=_tables(n)["upper"])
    np.cumsum(M, axis=1, out=M)
    np.cumsum(M, axis=2, out=M)
    return P


def _host64(A: torch.Tensor) -> np.ndarray:
    """A on the host as fp64 numpy (ltri_spans.host's values; numpy converts fp32 without torch's threads)."""
    A = A.detach().cpu()
    return A.numpy().astype(np.float64) if A.dtype == torch.float32 else LS.host(A).numpy()


def quantiles(A: np.ndarray, q: float) -> np.ndarray:
    """[N] fp64: ltri_spans.quantile_low of every map: torch's ranks, the two order statistics (one
    np.partition over each map, the upper triangle as +inf), torch's lerp on one element per map (its scalar
    path: a vectorised lerp fuses the multiply-add, other bits)."""
    N, n = A.shape[0], A.shape[-1]
    m = n * (n + 1) // 2
    if m <= 1:
        return A.reshape(N, -1)[:, 0].copy()
    rank = torch.tensor([q], dtype=torch.float64) * (m - 1)
    below, above = int(rank.long()), int(rank.ceil().long())
    if m > 32768:     # a chunk's query map (few): the reference's own bracketed selection, map by map
        low = A[:, LS._tril_mask(n)]
        vb, va = (torch.tensor(v) for v in zip(*(LS._order_stats(row, below, above) for row in low)))
    else:             # a stack of block maps: one partition over each, the upper triangle as +inf
        part = np.partition((A + _tables(n)["tril_inf"]).reshape(N, -1), sorted({below, above}), axis=1)
        vb, va = torch.from_numpy(part[:, below].copy()), torch.from_numpy(part[:, above].copy())
    if above == below:
        return vb.numpy()
    w = rank - below
    return np.array([float(vb[i:i + 1].lerp(va[i:i + 1], w)) for i in range(N)])


def candidates(A: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, score) [N, 2n - 1]: each map's best span per anti-diagonal (ltri_spans.detect_spans up to NMS)."""
    N, n = A.shape[0], A.shape[-1]
    t = _tables(n)
    P = _prefix(A, quantiles(A, q))
    d = np.diagonal(P, axis1=1, axis2=2)
    S = d[:, None, 1:] - P[:, :n, 1:]                  # the reference's order of the four terms
    S -= P[:, 1:, :n].transpose(0, 2, 1)
    S += d[:, :n, None]
    if n > 1:
        S[:, n - 1, 0] = 0.0                           # the padding cell: 0 for the grid, as the reference
    G = np.take(S.reshape(N, -1), t["cell"], axis=1)   # [N, 2n - 1, (n + 1) // 2]
    top = torch.from_numpy(np.abs(G).reshape(N, -1).max(1)).clamp(min=torch.finfo(torch.float64).tiny)
    step = torch.exp2(torch.ceil(torch.log2(top)) - 12).numpy().reshape(N, 1, 1)
    np.divide(G, step, out=G)
    np.rint(G, out=G)
    np.multiply(G, step, out=G)
    np.copyto(G, -np.inf, where=t["pad"])
    k = G.argmax(2)                                    # the first maximum: the smallest x
    best = np.take_along_axis(G, k[:, :, None], 2)[:, :, 0]
    xs = t["lo"] + k
    return xs, t["s"] - xs, best


def nms(xs, ys, sc, iou: float, n_spans: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, kept) [N, K]: greedy NMS by score (ties: the lower candidate), `n_spans` steps."""
    length = (ys - xs + 1).astype(np.float64)
    alive = np.ones(xs.shape, dtype=bool)
    out = []
    for _ in range(min(n_spans, xs.shape[1])):
        ok = alive.any(1)
        i = np.where(alive, sc, -np.inf).argmax(1)[:, None]
        xi, yi = np.take_along_axis(xs, i, 1), np.take_along_axis(ys, i, 1)
        inter = np.maximum(np.minimum(ys, yi) - np.maximum(xs, xi) + 1, 0)
        ratio = inter / (length + np.take_along_axis(length, i, 1) - inter)
        alive &= ~(ratio > iou)
        np.put_along_axis(alive, i, False, 1)
        out.append((xi[:, 0], yi[:, 0], ok))
    if not out:
        z = xs[:, :0]
        return z, z, z.astype(bool)
    return tuple(np.stack(v, 1) for v in zip(*out))


def arrange(x, y, ok, n: int, fill_gaps: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kept spans sorted by (x, y), then (fill_gaps) cut and interleaved with the gaps: slots [N, K or 2K + 1]
    in span order, `valid` marking the spans that exist (ltri_spans.fill)."""
    order = np.where(ok, x * (n + 1) + y, (n + 1) ** 2).argsort(1)
    x, y, ok = (np.take_along_axis(v, order, 1) for v in (x, y, ok))
    if not fill_gaps:
        return x, y, ok
    end = np.maximum.accumulate(np.where(ok, y + 1, 0), axis=1)
    nxt = np.concatenate([np.zeros_like(end[:, :1]), end[:, :-1]], 1)
    xc = np.maximum(x, nxt)
    live = ok & (xc <= y)
    gap = live & (xc > nxt)
    last = end[:, -1:] if end.shape[1] else np.zeros_like(x[:, :1])
    gx, gy, gv = (np.stack(p, 2).reshape(x.shape[0], -1) for p in ((nxt, xc), (xc - 1, y), (gap, live)))
    return (np.concatenate([gx, last], 1), np.concatenate([gy, np.full_like(last, n - 1)], 1),
            np.concatenate([gv, last < n], 1))


def spans(A: np.ndarray, q: float, iou: float, n_spans: int, fill_gaps: bool = True):
    """Slots (x, y, valid) [N, slots] of ltri_spans.detect_spans for every map of A [N, n, n] (fp64, finite)."""
    return arrange(*nms(*candidates(A, q), iou, n_spans), A.shape[-1], fill_gaps)


def detect_spans(A: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool = True) -> list:
    """[ltri_spans.detect_spans(A[i], ...) for i], the maps moved to the host at once."""
    if A.shape[-1] == 0:
        return [[] for _ in range(A.shape[0])]
    A = _host64(A)
    bad = ~np.isfinite(A).reshape(A.shape[0], -1).all(1)
    x, y, v = (t.tolist() for t in spans(np.where(bad[:, None, None], 0.0, A), q, iou, n_spans, fill_gaps))
    return [LS.detect_spans(torch.from_numpy(A[i]), q, iou, n_spans, fill_gaps) if bad[i] else
            [(a, b) for a, b, keep in zip(x[i], y[i], v[i]) if keep] for i in range(A.shape[0])]


def ratios(A: np.ndarray, x, y, valid, mode: str, density: bool) -> np.ndarray:
    """[N, slots] fp64: ltri_spans.neighbor_ratio of every slot (invalid slots: a dummy span)."""
    n = A.shape[-1]
    P = _prefix(A).reshape(A.shape[0], -1)
    x, y = np.where(valid, x, 0), np.where(valid, y, 0)
    L = y - x + 1

    def rect(r0, r1, c0, c1):
        w = n + 1
        at = lambda r, c: np.take_along_axis(P, r * w + c, 1)
        v = at(r1, c1) - at(r0, c1) - at(r1, c0) + at(r0, c0)
        empty = (r1 <= r0) | (c1 <= c0)
        return np.where(empty, 0.0, v), np.where(empty, 0, (r1 - r0) * (c1 - c0))

    tri, _ = rect(x, y + 1, x, y + 1)
    row, row_cells = rect(x, y + 1, np.zeros_like(x), x)
    col, col_cells = rect(y + 1, np.full_like(x, n), x, y + 1)
    if density:
        tri = tri / (L * (L + 1) // 2)
        row = np.where(row_cells > 0, row / np.maximum(row_cells, 1), 0.0)
        col = np.where(col_cells > 0, col / np.maximum(col_cells, 1), 0.0)
    nbr = {"row": row, "col": col, "rowcol": row + col}[mode]
    tot = tri + nbr
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(tot <= 0, 1.0, tri / tot)


def _cap(counts: np.ndarray, floor: np.ndarray, budget: int) -> np.ndarray:
    """ltri_spans.vector_counts' loop (one off the largest count, ties: the later span, never below floor,
    until the sum fits) in closed form: with g(t) = sum max(floor, min(counts, t)), the loop ends at the largest
    level t with g(t) <= budget, the first budget - g(t) spans able to stand at t + 1 still there (the later
    ones were cut first); if even the floors exceed the budget, at the floors."""
    hi = int(counts.max()) if counts.size else 0
    levels = np.arange(hi + 1).reshape(1, -1, 1)
    g = np.maximum(floor[:, None], np.minimum(counts[:, None], levels)).sum(2)     # [N, hi + 1]
    t = np.where(g <= budget, levels.reshape(1, -1), -1).max(1, keepdims=True)     # [N, 1]
    at = np.maximum(floor, np.minimum(counts, np.maximum(t, 0)))
    up = (counts >= t + 1) & (floor <= t)                # spans the loop lowered from t + 1 to t
    stay = up & (np.cumsum(up, 1) <= budget - at.sum(1, keepdims=True))   # the earliest keep t + 1
    out = np.where(t >= 0, at + stay, floor)
    return np.where(g[:, -1:] <= budget, counts, out)


def counts(x, y, valid, r_a, lam: float, vmin: int, budget: int, static: bool = False) -> np.ndarray:
    """[N, slots] int64: ltri_spans.vector_counts per map (0 on invalid slots); np.exp has math.exp's bits."""
    L = np.where(valid, y - x + 1, 0)
    if static:
        c = np.minimum(np.maximum(budget // np.maximum(valid.sum(1, keepdims=True), 1), vmin), L)
    else:
        c = np.minimum(L, np.maximum(np.ceil(L * np.exp(-lam * (1.0 - r_a)) - 1e-9).astype(np.int64), vmin))
    return np.where(valid, _cap(c, np.minimum(L, vmin), budget), 0)


def _picks(votes, x, y, valid, c, bad) -> tuple[torch.Tensor, torch.Tensor]:
    """(picked, owner) flat: each slot's votes rounded on the slot's own grid (selection.tie_round of the slot;
    zeros elsewhere change no largest |v|) and stably sorted as a row of the map's votes, out-of-slot tokens
    last; the first `count` of each slot, in slot order. numpy for fp32/fp64 votes (the same IEEE operations;
    torch's threads cost more than they save on these sizes), torch otherwise."""
    j = np.arange(votes.shape[-1]).reshape(1, 1, -1)
    inside = valid[:, :, None] & (j >= x[:, :, None]) & (j <= y[:, :, None])
    take = j < c[:, :, None]
    own = torch.from_numpy(np.broadcast_to((np.cumsum(valid, 1) - 1)[:, :, None], inside.shape)[take])
    if isinstance(votes, np.ndarray):
        V = np.where(inside, np.where(bad[:, None], 0, votes)[:, None, :], votes.dtype.type(0))
        top = torch.from_numpy(np.maximum(np.abs(V).max(2), np.finfo(V.dtype).tiny))
        step = torch.exp2(torch.ceil(torch.log2(top)) - 12).numpy()[:, :, None]
        R = np.rint(V / step) * step
        order = np.argsort(np.where(inside, -R, np.inf), axis=2, kind="stable")
        return torch.from_numpy(order[take]), own
    inside = torch.from_numpy(inside)
    V = votes.masked_fill(torch.from_numpy(bad).view(-1, 1), 0).unsqueeze(1).expand(-1, inside.shape[1], -1)
    R = torch.where(inside, tie_round(torch.where(inside, V, torch.zeros((), dtype=V.dtype))), float("-inf"))
    return torch.sort(R, stable=True, dim=-1, descending=True).indices[torch.from_numpy(take)], own


def index_maps(A: torch.Tensor, votes: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool,
               mode: str, density: bool, lam: float, vmin: int, budget: int, static: bool = False):
    """Every map's index vectors, as ltri_spans.index_map gives them one map at a time: (picked, owner) flat
    over the maps in order, the per-map sizes and span counts (host lists: the one sync). A [N, n, n] and
    votes [N, n] on the host."""
    An, votes = _host64(A), votes.detach().cpu()
    A = torch.from_numpy(An)
    Vn = votes.numpy() if votes.dtype in (torch.float32, torch.float64) else None
    bad = ~np.isfinite(An).reshape(An.shape[0], -1).all(1) | ~torch.isfinite(votes).all(1).numpy()
    Af = np.where(bad[:, None, None], 0.0, An)
    x, y, valid = spans(Af, q, iou, n_spans, fill_gaps)
    c = counts(x, y, valid, ratios(Af, x, y, valid, mode, density), lam, vmin, budget, static)
    sizes, n_sp = c.sum(1).tolist(), valid.sum(1).tolist()
    picked, owner = _picks(Vn if Vn is not None else votes, x, y, valid, c, bad)
    if not bad.any():
        return picked, owner, sizes, n_sp
    ps, os_ = list(picked.split(sizes)), list(owner.split(sizes))
    for i in np.flatnonzero(bad).tolist():
        ps[i], os_[i], n_sp[i] = LS.index_map(A[i], votes[i], q, iou, n_spans, fill_gaps, mode, density, lam,
                                              vmin, budget, static)
        sizes[i] = ps[i].numel()
    return torch.cat(ps), torch.cat(os_), sizes, n_sp


def index_maps_reference(A, votes, *args, **kw):
    """index_maps one map at a time through ltri_spans.index_map (the per-map reference path)."""
    A, votes = LS.host(A), votes.detach().cpu()
    out = [LS.index_map(A[i], votes[i], *args, **kw) for i in range(A.shape[0])]
    if not out:
        z = torch.zeros(0, dtype=torch.long)
        return z, z, [], []
    return (torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out]), [o[0].numel() for o in out],
            [o[2] for o in out])


def detect_spans_reference(A, *args) -> list:
    """detect_spans one map at a time (the per-map reference path)."""
    A = LS.host(A)
    return [LS.detect_spans(A[i], *args) for i in range(A.shape[0])]
