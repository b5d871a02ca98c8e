"""Ltri-LLM's span work on the maps' own device: methods/parts/ltri_batch.py's pipeline (the host path and the bit
reference) as a fixed sequence of batched torch operations plus two Triton kernels (kernels/prefix_scan.py,
kernels/span_nms.py), static shapes whatever the number of maps, so a GPU prefill cuts a chunk's query maps and its
leaving blocks' maps without moving them to the host. On a GPU the sequence is captured once per shape and options
as a CUDA graph and replayed (`use_graphs`). The host gets only what the Python bookkeeping needs, in one
device-to-host copy per call (query spans as slot lists; the blocks' pick sizes and span counts); the picks stay
on the device.

The bits: each step is ltri_batch's, operation for operation, in fp64 (votes in their own dtype):
  prefix sums   kernels/prefix_scan.py: the two cumsums sequential along the same axes in the same order (torch's
                CUDA cumsum is a parallel scan: other bits); on the CPU torch's cumsum, sequential too
  theta         exact order statistics (a sort of the lower triangle, the upper one +inf; ranks as torch.quantile
                takes them), then torch's lerp (`_lerp`: the host's 1-element lerp is a fused multiply-add)
  grids         tie_round's step exp2(ceil(log2 top) - 12) with torch.log2/exp2 (on the GPU libdevice's log2)
  Eq. 7         torch.exp (on the GPU libdevice's exp)
Everything else is exact (integer index work, comparisons, argmax/stable sorts that keep the first of equals,
IEEE adds and divides of the same operands). libdevice's log2 and exp may differ from the host's libm by an ulp,
which can move a grid step (a top within an ulp of a power of two) or a count (L exp(.) within an ulp of an
integer + 1e-9): bench/ltri_device_parity.py measures how often the device's spans and picks differ from
ltri_batch's (notes/perf_bench.md). On the CPU this module equals ltri_batch bit for bit
(tests/test_ltri_device.py). Maps or votes with a non-finite entry send the whole call to ltri_batch (the
reference's rules), after the one copy that finds them.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

from kernels import span_nms
from kernels.prefix_scan import prefix_sum_
from methods.parts import ltri_batch as LB
from methods.parts.selection import tie_round


@functools.lru_cache(maxsize=32)
def _tables(n: int, device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)).to(device) for k, v in LB._tables(n).items()}


def _prefix(A: torch.Tensor, theta: torch.Tensor | None = None) -> torch.Tensor:
    """[N, n + 1, n + 1] 2-D prefix sums of tril(A - theta) (or of tril(A)), row and column 0 zero."""
    N, n = A.shape[0], A.shape[-1]
    P = A.new_zeros(N, n + 1, n + 1)
    M = P[:, 1:, 1:]
    M.copy_(A if theta is None else A - theta.view(N, 1, 1))
    M.masked_fill_(_tables(n, A.device)["upper"], 0.0)
    prefix_sum_(M, 1)
    prefix_sum_(M, 2)
    return P


def _lerp(a: torch.Tensor, b: torch.Tensor, w: float) -> torch.Tensor:
    """torch.lerp(a[i], b[i], w) as ltri_batch takes it, one element at a time on the CPU. That scalar lerp rounds
    a + w (b - a) (w < 0.5; else b - (b - a)(1 - w)) once, a fused multiply-add (measured: separate ops differ in
    ~1% of cases); torch's CUDA lerp is the same formula (ATen Lerp.cu), which nvcc contracts into the same fused
    multiply-add: one elementwise call on the device (bench/ltri_device_parity.py: every theta equal on an H100;
    the block maps' weight is 0.5 there, exact either way, the 256 query maps' ~0.3 is where fusing shows)."""
    if a.is_cuda:
        return torch.lerp(a, b, torch.full_like(a, w))
    wt = torch.tensor([w], dtype=a.dtype)
    return torch.cat([a[i:i + 1].lerp(b[i:i + 1], wt) for i in range(a.shape[0])])


def quantiles(A: torch.Tensor, q: float) -> torch.Tensor:
    """[N] fp64: ltri_batch.quantiles (torch.quantile of each map's lower triangle), on A's device."""
    N, n = A.shape[0], A.shape[-1]
    m = n * (n + 1) // 2
    if m <= 1:
        return A.reshape(N, -1)[:, 0].clone()
    rank = torch.tensor([q], dtype=torch.float64) * (m - 1)
    below, above = int(rank.long()), int(rank.ceil().long())
    flat = torch.sort(A.masked_fill(_tables(n, A.device)["upper"], float("inf")).reshape(N, -1), 1).values
    vb = flat[:, below].clone()
    if above == below:
        return vb
    return _lerp(vb, flat[:, above], float(rank - below))


def _grid_round(G: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """G rounded on tie_round's grid of `top` (one value per leading index, broadcast over G's last axes)."""
    step = torch.exp2(torch.ceil(torch.log2(top.clamp(min=torch.finfo(top.dtype).tiny))) - 12)
    step = step.view(*step.shape, *([1] * (G.dim() - step.dim())))
    return torch.round(G / step) * step


def candidates(A: torch.Tensor, q: float):
    """(x, y, score) [N, 2n - 1]: ltri_batch.candidates."""
    N, n = A.shape[0], A.shape[-1]
    t = _tables(n, A.device)
    P = _prefix(A, quantiles(A, q))
    d = torch.diagonal(P, dim1=1, dim2=2)
    S = d[:, None, 1:] - P[:, :n, 1:]
    S -= P[:, 1:, :n].transpose(1, 2)
    S += d[:, :n, None]
    if n > 1:
        S[:, n - 1, 0] = 0.0
    G = S.reshape(N, -1)[:, t["cell"]]
    G = _grid_round(G, G.abs().reshape(N, -1).amax(1)).masked_fill_(t["pad"], float("-inf"))
    k = G.argmax(2)
    best = G.gather(2, k[:, :, None])[:, :, 0]
    xs = t["lo"] + k
    return xs, t["s"] - xs, best


def nms(xs, ys, sc, iou: float, n_spans: int):
    """(x, y, kept) [N, K]: ltri_batch.nms (K greedy steps; on a GPU one Triton program per map: kernels/span_nms)."""
    steps = min(n_spans, xs.shape[1])
    if steps <= 0:
        z = xs[:, :0]
        return z, z, z.bool()
    return span_nms.nms(xs, ys, sc, iou, steps)


def arrange(x, y, ok, n: int, fill_gaps: bool):
    """Slots (x, y, valid) [N, K or 2K + 1]: ltri_batch.arrange."""
    order = torch.where(ok, x * (n + 1) + y, (n + 1) ** 2).argsort(dim=1, stable=True)
    x, y, ok = (v.gather(1, order) for v in (x, y, ok))
    if not fill_gaps:
        return x, y, ok
    N = x.shape[0]
    if x.shape[1] == 0:       # no kept span (n_spans 0): no slots, as ltri_batch
        return x, y, ok
    end = torch.cummax(torch.where(ok, y + 1, 0), 1).values
    nxt = torch.cat([torch.zeros_like(end[:, :1]), end[:, :-1]], 1)
    xc = torch.maximum(x, nxt)
    live = ok & (xc <= y)
    gap = live & (xc > nxt)
    last = end[:, -1:]
    gx, gy, gv = (torch.stack(p, 2).reshape(N, -1) for p in ((nxt, xc), (xc - 1, y), (gap, live)))
    return (torch.cat([gx, last], 1), torch.cat([gy, torch.full_like(last, n - 1)], 1), torch.cat([gv, last < n], 1))


def spans(A: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool = True):
    """Slots (x, y, valid) [N, slots] of every map of A [N, n, n] (fp64, finite): ltri_batch.spans."""
    return arrange(*nms(*candidates(A, q), iou, n_spans), A.shape[-1], fill_gaps)


def _finite(A: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(A).reshape(A.shape[0], -1).all(1)


def _slots(A: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool) -> torch.Tensor:
    """[N, 3 slots + 1] int64: x, y, valid of every map's slots and its finite flag; static shapes, no host sync."""
    N = A.shape[0]
    A = A.double()
    good = _finite(A)
    x, y, v = spans(torch.where(good.view(N, 1, 1), A, 0.0), q, iou, n_spans, fill_gaps)
    return torch.cat([x, y, v.long(), good.long().view(N, 1)], 1)


def detect_spans(A: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool = True,
                 carry: torch.Tensor | None = None):
    """ltri_batch.detect_spans on A's device: one copy of the slots (and the finite flags) to the host. carry: a
    device int64 tensor that rides in the same copy; then (spans, its host values as a nested list)."""
    N, n = A.shape[0], A.shape[-1]
    if n == 0:
        out = [[] for _ in range(N)]
        return out if carry is None else (out, carry.cpu().tolist())
    A = A.detach()
    out = _run(_slots, A, args=(q, iou, n_spans, fill_gaps))
    if carry is None:
        out = out.cpu()
    else:
        both = torch.cat([out.flatten(), carry.flatten()]).cpu()
        out, carry = both[:out.numel()].view(out.shape), both[out.numel():].view(carry.shape).tolist()
    K = (out.shape[1] - 1) // 3
    if not bool(out[:, -1].all()):
        spans = LB.detect_spans(A, q, iou, n_spans, fill_gaps)
    else:
        x, y, v = (t.tolist() for t in out[:, :-1].split(K, 1))
        spans = [[(a, b) for a, b, keep in zip(x[i], y[i], v[i]) if keep] for i in range(N)]
    return spans if carry is None else (spans, carry)


def ratios(A: torch.Tensor, x, y, valid, mode: str, density: bool) -> torch.Tensor:
    """[N, slots] fp64: ltri_batch.ratios."""
    n = A.shape[-1]
    P = _prefix(A).reshape(A.shape[0], -1)
    x, y = torch.where(valid, x, 0), torch.where(valid, y, 0)
    L = y - x + 1

    def rect(r0, r1, c0, c1):
        w = n + 1
        v = P.gather(1, r1 * w + c1) - P.gather(1, r0 * w + c1) - P.gather(1, r1 * w + c0) + P.gather(1, r0 * w + c0)
        empty = (r1 <= r0) | (c1 <= c0)
        return torch.where(empty, 0.0, v), torch.where(empty, 0, (r1 - r0) * (c1 - c0))

    tri, _ = rect(x, y + 1, x, y + 1)
    row, row_cells = rect(x, y + 1, torch.zeros_like(x), x)
    col, col_cells = rect(y + 1, torch.full_like(x, n), x, y + 1)
    if density:
        tri = tri / (L * (L + 1) // 2)
        row = torch.where(row_cells > 0, row / row_cells.clamp(min=1), 0.0)
        col = torch.where(col_cells > 0, col / col_cells.clamp(min=1), 0.0)
    nbr = {"row": row, "col": col, "rowcol": row + col}[mode]
    tot = tri + nbr
    return torch.where(tot <= 0, 1.0, tri / tot)


def _cap(counts: torch.Tensor, floor: torch.Tensor, budget: int, n: int) -> torch.Tensor:
    """ltri_batch._cap with the levels bounded by n (every count <= its span's length <= n: no host max)."""
    levels = torch.arange(n + 1, device=counts.device).view(1, -1, 1)
    g = torch.maximum(floor[:, None], torch.minimum(counts[:, None], levels)).sum(2)                # [N, n + 1]
    t = torch.where(g <= budget, levels.view(1, -1), -1).amax(1, keepdim=True)
    at = torch.maximum(floor, torch.minimum(counts, t.clamp(min=0)))
    up = (counts >= t + 1) & (floor <= t)
    stay = up & (torch.cumsum(up.long(), 1) <= budget - at.sum(1, keepdim=True))
    out = torch.where(t >= 0, at + stay.long(), floor)
    return torch.where(g[:, -1:] <= budget, counts, out)


def counts(x, y, valid, r_a, lam: float, vmin: int, budget: int, n: int, static: bool = False) -> torch.Tensor:
    """[N, slots] int64: ltri_batch.counts (Eq. 7's exp: torch.exp)."""
    L = torch.where(valid, y - x + 1, 0)
    if static:
        each = budget // valid.long().sum(1, keepdim=True).clamp(min=1)
        c = torch.minimum(each.clamp(min=vmin), L)
    else:
        e = torch.exp((1.0 - r_a) * -lam)
        c = torch.minimum(L, torch.ceil(L * e - 1e-9).long().clamp(min=vmin))
    return torch.where(valid, _cap(c, L.clamp(max=vmin), budget, n), 0)


def _index(A: torch.Tensor, votes: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool, mode: str,
           density: bool, lam: float, vmin: int, budget: int, static: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [2, cap + 1]: picks and owners at their flat positions, meta [3, N]: sizes, span counts, finite flags);
    static shapes (cap bounds every map's picks: the budget, or the floors when they exceed it), no host sync."""
    N, n = A.shape[0], A.shape[-1]
    A = A.double()
    good = _finite(A) & torch.isfinite(votes).all(1)
    Af = torch.where(good.view(N, 1, 1), A, 0.0)
    x, y, valid = spans(Af, q, iou, n_spans, fill_gaps)
    c = counts(x, y, valid, ratios(Af, x, y, valid, mode, density), lam, vmin, budget, n, static)
    # each slot's votes on the slot's own grid (tie_round of the slot), stably sorted, the first `count` kept
    j = torch.arange(n, device=A.device).view(1, 1, -1)
    inside = valid[:, :, None] & (j >= x[:, :, None]) & (j <= y[:, :, None])
    R = tie_round(torch.where(inside, votes[:, None, :], torch.zeros((), dtype=votes.dtype, device=A.device)))
    order = torch.sort(torch.where(inside, R, float("-inf")), stable=True, dim=-1, descending=True).indices
    # slot s of map i starts at the exclusive cumsum of the counts; the rest goes to a dummy cell at `cap`
    cap = N * max(budget, x.shape[1] * vmin)
    start = (torch.cumsum(c.reshape(-1), 0) - c.reshape(-1)).view(c.shape)
    take = j < c[:, :, None]
    at = torch.where(take, start[:, :, None] + j, cap).reshape(-1)
    own = (torch.cumsum(valid.long(), 1) - 1)[:, :, None].expand(take.shape).reshape(-1)
    out = torch.zeros(2, cap + 1, dtype=torch.long, device=A.device)
    out[0].scatter_(0, at, order.reshape(-1))
    out[1].scatter_(0, at, own)
    return out, torch.stack([c.sum(1), valid.long().sum(1), good.long()])


def index_maps(A: torch.Tensor, votes: torch.Tensor, q: float, iou: float, n_spans: int, fill_gaps: bool,
               mode: str, density: bool, lam: float, vmin: int, budget: int, static: bool = False):
    """ltri_batch.index_maps on A's device: (picked, owner) flat on the device, the per-map sizes and span counts
    as host lists (the one device-to-host copy)."""
    args = (q, iou, n_spans, fill_gaps, mode, density, lam, vmin, budget, static)
    out, meta = _run(_index, A.detach(), votes.detach(), args=args)
    sizes, n_sp, ok = meta.cpu().tolist()
    if not all(ok):
        picked, owner, sizes, n_sp = LB.index_maps(A, votes, *args)
        return picked.to(A.device), owner.to(A.device), sizes, n_sp
    total = sum(sizes)
    out = out[:, :total].clone()     # a replayed graph's output is rewritten by its next replay
    return out[0], out[1], sizes, n_sp


def _flat(out: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """[4, width] from _index's (out, meta): picks, each pick's span numbered over all maps of the call, each
    pick's map, and (the first sum(span counts) entries) each span's map: what IndexVectors.add_rows takes,
    static shapes (entries past the totals are padding)."""
    N = meta.shape[1]
    ends = torch.cumsum(meta[:2], 1)                                  # inclusive ends of sizes, span counts
    pos = torch.arange(out.shape[1], device=out.device)
    pick_map = torch.searchsorted(ends[0].contiguous(), pos, right=True).clamp_(max=max(N - 1, 0))
    span_map = torch.searchsorted(ends[1].contiguous(), pos, right=True).clamp_(max=max(N - 1, 0))
    span = out[1] + (ends[1] - meta[1])[pick_map]
    return torch.stack([out[0], span, pick_map, span_map])


def _index_flat(A, votes, *args):
    out, meta = _index(A, votes, *args)
    return _flat(out, meta), meta


def _host_flat(picked, owner, sizes: list[int], n_sp: list[int]) -> torch.Tensor:
    """_flat's rows from a host path's (picked, owner) and per-map lists."""
    N = len(sizes)
    m = torch.arange(N)
    pick_map, span_map = m.repeat_interleave(torch.tensor(sizes, dtype=torch.long)), \
        m.repeat_interleave(torch.tensor(n_sp, dtype=torch.long))
    first = torch.cumsum(torch.tensor(n_sp, dtype=torch.long), 0) - torch.tensor(n_sp, dtype=torch.long)
    w = max(picked.numel(), span_map.numel())
    rows = torch.zeros(4, w, dtype=torch.long)
    rows[0, :picked.numel()], rows[1, :picked.numel()] = picked.cpu(), owner.cpu() + first[pick_map]
    rows[2, :picked.numel()], rows[3, :span_map.numel()] = pick_map, span_map
    return rows


def index_rows(A: torch.Tensor, votes: torch.Tensor, *args):
    """index_maps for IndexVectors.add_rows: (rows [4, width] on A's device, see _flat; sizes, span counts as host
    lists, the one device-to-host copy)."""
    rows, meta = _run(_index_flat, A.detach(), votes.detach(), args=args)
    sizes, n_sp, ok = meta.cpu().tolist()
    if not all(ok):
        picked, owner, sizes, n_sp = LB.index_maps(A, votes, *args)
        return _host_flat(picked, owner, sizes, n_sp).to(A.device), sizes, n_sp
    return rows[:, :max(sum(sizes), sum(n_sp))].clone(), sizes, n_sp   # a replay rewrites its outputs


# --- CUDA graphs: the span work is a fixed sequence of a few hundred small kernels per call (static shapes, no
# sync), so on a GPU it is captured once per (function, shapes, options) and replayed: the same kernels on the
# same inputs (the same bits), one launch instead of hundreds of Python-issued ones.
use_graphs = True            # False: eager launches (the bench's comparison)
_GRAPHS: dict = {}


def _run(fn, *tensors: torch.Tensor, args: tuple):
    if not (use_graphs and tensors[0].is_cuda):
        return fn(*tensors, *args)
    key = (fn.__name__, args, torch.is_inference_mode_enabled(),
           *((t.shape, t.dtype, t.device) for t in tensors))
    entry = _GRAPHS.get(key)
    if entry is None:
        if len(_GRAPHS) >= 64:     # per-layer options could make many: start over rather than grow
            _GRAPHS.clear()
        entry = _GRAPHS[key] = _capture(fn, tensors, args)
    if entry is False:             # capture failed once for this key: eager launches, the same operations
        return fn(*tensors, *args)
    graph, ins, out = entry
    for s, t in zip(ins, tensors):
        s.copy_(t)
    graph.replay()
    return out


def _capture(fn, tensors, args):
    dev = tensors[0].device
    with torch.cuda.device(dev):   # the capture stream is the current device's
        ins = [t.clone() for t in tensors]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*ins, *args)        # warm-up: Triton compiles, index tables are cached, the allocator settles
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn(*ins, *args)
        except RuntimeError as e:  # an operation this torch cannot capture: say so once, run eagerly
            warnings.warn(f"ltri_device: CUDA graph capture of {fn.__name__} failed ({e}); eager launches instead")
            return False
    return graph, ins, out


def cut_blocks(maps: torch.Tensor, votes: torch.Tensor, args: tuple, where: str):
    """Ltri's block indexing (maps [N, n, n], votes [N, n], args those of index_maps after them) where `where`
    says: device (this module, the picks stay there), host (one transfer of maps and votes, ltri_batch's batched
    numpy, the picks moved back) or reference (ltri_spans map by map). (rows [4, width] on the maps' device, as
    index_rows; sizes, span counts)."""
    if where == "device":
        return index_rows(maps, votes, *args)
    if votes.dtype == maps.dtype:    # one device-to-host copy of both (fp32)
        both = torch.cat([maps, votes.unsqueeze(1)], 1).detach().cpu()
        A, V = both[:, :-1], both[:, -1]
    else:
        A, V = maps, votes.detach().cpu()
    cut = LB.index_maps_reference if where == "reference" else LB.index_maps
    picked, owner, sizes, n_spans = cut(A, V, *args)
    return _host_flat(picked, owner, sizes, n_spans).to(maps.device), sizes, n_spans
