"""The batched span work (methods/parts/ltri_batch.py) against the per-map reference (methods/parts/ltri_spans.py,
itself checked against brute force in tests/test_ltri_spans.py): the same spans, counts and picked indices, bit
for bit, over many random maps and settings, with ties (maps of a few distinct values, equal votes, planted
triangles), garbage above the diagonal, and maps that are not finite (the reference handles those)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from methods.parts import ltri_batch as LB
from methods.parts import ltri_spans as LS


def _maps(N, n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    if kind == "rand":          # softmax-like rows, the shape of a real map
        A = torch.rand(N, n, n, generator=g) ** 4
    elif kind == "ties":        # a few distinct values: equal triangle scores, equal candidates, equal ratios
        A = torch.randint(0, 3, (N, n, n), generator=g).float() * 0.25
    elif kind == "planted":
        A = torch.rand(N, n, n, generator=g) * 0.2
        for i in range(N):
            x = int(torch.randint(0, n, (1,), generator=g))
            y = int(torch.randint(x, n, (1,), generator=g))
            A[i, x:y + 1, x:y + 1] += 1.0
    else:                       # flat: every entry equal (all spans tie), one map all zero
        A = torch.full((N, n, n), 0.5)
        A[0] = 0
    A = A + torch.triu(torch.rand(N, n, n, generator=g), 1) * 7     # above the diagonal: never read
    rows = torch.tril(A).sum(-1, keepdim=True).clamp(min=1e-9)
    return A / rows if kind in ("rand", "planted") else A


def _votes(N, n, seed, ties):
    g = torch.Generator().manual_seed(seed + 1)
    v = torch.rand(N, n, generator=g)
    return (v * 4).floor() / 4 if ties else v


SETTINGS = [  # q, iou, n_spans, fill, mode, density, lam, vmin, budget, static
    (0.9, 0.1, 4, True, "row", False, 3.0, 1, 12, False),
    (0.9, 0.1, 4, True, "col", True, 20.0, 1, 12, False),
    (0.5, 0.3, 2, False, "rowcol", False, 3.0, 2, 5, False),
    (0.93, 0.01, 6, True, "rowcol", True, 0.5, 1, 24, False),
    (0.7, 0.5, 10, False, "row", True, 3.0, 1, 7, True),
    (0.0, 0.0, 1, True, "col", False, 0.0, 1, 3, False),
    (1.0, 1.0, 3, True, "row", False, 3.0, 1, 1000, True),
]


def _reference(A, V, s):
    return [LS.index_map(A[i], V[i], *s) for i in range(A.shape[0])]


def _check(A, V, s):
    picked, owner, sizes, n_spans = LB.index_maps(A, V, *s)
    ref = _reference(LS.host(A), V, s)
    assert sizes == [r[0].numel() for r in ref]
    assert n_spans == [r[2] for r in ref]
    assert torch.equal(picked, torch.cat([r[0] for r in ref]))
    assert torch.equal(owner, torch.cat([r[1] for r in ref]))


@pytest.mark.parametrize("kind", ["rand", "ties", "planted", "flat"])
@pytest.mark.parametrize("si", range(len(SETTINGS)))
def test_index_maps_equal_the_reference(kind, si):
    for seed, (N, n) in itertools.product(range(3), ((5, 1), (6, 2), (12, 7), (40, 23))):
        _check(_maps(N, n, 100 * si + seed, kind), _votes(N, n, seed, kind != "rand"), SETTINGS[si])


@pytest.mark.parametrize("kind", ["rand", "ties", "planted"])
def test_index_maps_equal_the_reference_at_block_size(kind):
    """128 x 128: past the reference's sampled quantile bracket (lower triangles over 8,192 entries)."""
    _check(_maps(20, 128, 7, kind), _votes(20, 128, 7, kind == "ties"), SETTINGS[0])
    _check(_maps(17, 128, 8, kind), _votes(17, 128, 8, True), SETTINGS[3])


def test_spans_equal_the_reference_for_query_maps():
    for seed, (n, k, fill) in enumerate([(40, 10, True), (64, 16, False), (97, 7, True), (3, 1, False), (300, 16, True)]):
        for kind in ("rand", "ties", "planted"):
            A = _maps(3, n, seed, kind)
            want = [LS.detect_spans(A[i], 0.9, 0.1, k, fill) for i in range(3)]
            assert LB.detect_spans(A, 0.9, 0.1, k, fill) == want


def test_non_finite_maps_go_through_the_reference():
    A, V = _maps(3, 9, 0, "rand"), _votes(3, 9, 0, False)
    V[2, 3] = float("inf")
    _check(A, V, SETTINGS[0])
    A[1, 4, 2] = float("nan")      # a map with NaN has no spans (the reference's rule), a single gap span
    assert LB.detect_spans(A, 0.9, 0.1, 2) == [LS.detect_spans(A[i], 0.9, 0.1, 2) for i in range(3)]


def test_budget_cap_equals_the_loop():
    """_cap's closed form against vector_counts' one-at-a-time loop: random counts, floors and budgets,
    many ties (the later span is cut first), budgets below the floors' sum."""
    g = torch.Generator().manual_seed(0)
    for trial in range(400):
        k = int(torch.randint(1, 10, (1,), generator=g))
        L = torch.randint(1, 40, (k,), generator=g).tolist()
        r = (torch.randint(0, 5, (k,), generator=g) / 4).tolist()
        vmin, budget = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 60, (1,), generator=g))
        static = trial % 3 == 0
        want = LS.vector_counts(L, r, 3.0, vmin, budget, static)
        x = np.zeros((1, k + 2), dtype=np.int64)
        y = np.array([L + [1, 1]]) - 1
        valid = np.array([[True] * k + [False] * 2])
        got = LB.counts(x, y, valid, np.array([r + [0.0, 0.0]]), 3.0, vmin, budget, static)
        assert got[0, :k].tolist() == want and got[0, k:].tolist() == [0, 0]


def test_vector_log2_rounds_up_as_the_scalar_path():
    """The grids (tie_round's ceil(log2 |max|)) are computed for many maps or slots at once, torch's vector
    log2, where the reference takes one value at a time (the scalar path): the same ceiling near every power of
    two, a few ulps either side, in fp64 and fp32."""
    for dt in (torch.float64, torch.float32):
        eps = torch.finfo(dt).eps
        p = torch.exp2(torch.arange(-120, 120, dtype=dt))
        v = torch.cat([p * (1 + j * eps) for j in range(-8, 9)])
        v = v[torch.isfinite(v) & (v > 0)]
        one = torch.stack([torch.ceil(torch.log2(x.view(1, 1)))[0, 0] for x in v])
        assert torch.equal(torch.ceil(torch.log2(v)), one)


@pytest.mark.parametrize("variant", [0, 1] + [pytest.param(v, marks=pytest.mark.long) for v in (2, 3)])
def test_ltri_logits_equal_with_the_reference_spans(variant):
    """The whole method (tiny model, every test variant of its options): the batched span work gives the logits
    the per-map reference gives."""
    from test_methods_common import decode_logits, tiny_model

    from methods.ltri import Ltri, LtriConfig

    model = tiny_model()
    cfg = {"name": "ltri", **LtriConfig.variants()[variant]}
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(variant))
    out = {}
    for ref in (True, False):
        Ltri.reference_spans = ref
        try:
            out[ref] = decode_logits(model, cfg, ids, 34)
        finally:
            Ltri.reference_spans = False
    assert torch.equal(out[True], out[False])
