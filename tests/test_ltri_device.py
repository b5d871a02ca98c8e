"""The span work on the maps' device (methods/parts/ltri_device.py) against the host path it mirrors
(methods/parts/ltri_batch.py, itself bit-equal to the per-map reference): on the CPU the same spans, counts, picks
and owners, bit for bit, over test_ltri_batch.py's cases and settings (ties, planted triangles, garbage above the
diagonal, non-finite maps); the prefix sums also through the Triton scan in the interpreter. On a GPU the
mismatch rate is measured by bench/ltri_device_parity.py (libdevice's log2/exp), not asserted here."""
from __future__ import annotations

import itertools

import pytest
import torch
from test_ltri_batch import SETTINGS, _maps, _votes
from triton_env import needs_triton

from kernels import _common
from methods.parts import ltri_batch as LB
from methods.parts import ltri_device as LD


def _check(A, V, s):
    want = LB.index_maps(A, V, *s)
    got = LD.index_maps(A, V, *s)
    assert got[2] == want[2] and got[3] == want[3]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kind", ["rand", "ties", "planted", "flat"])
@pytest.mark.parametrize("si", range(len(SETTINGS)))
def test_index_maps_equal_the_host_path(kind, si):
    for seed, (N, n) in itertools.product(range(3), ((5, 1), (6, 2), (12, 7), (40, 23))):
        _check(_maps(N, n, 100 * si + seed, kind), _votes(N, n, seed, kind != "rand"), SETTINGS[si])


@pytest.mark.parametrize("kind", ["rand", "ties", "planted", "flat"])
def test_index_rows_equal_the_host_paths_rows(kind):
    """The graph's flat rows for IndexVectors.add_rows (picks, spans numbered over the call, each pick's and
    span's map) equal those the host path builds from ltri_batch's lists (the fallback and the CPU path)."""
    for si, (N, n) in itertools.product(range(len(SETTINGS)), ((6, 2), (12, 7), (9, 16))):
        A, V = _maps(N, n, 10 * si + N, kind), _votes(N, n, si, kind != "rand")
        rows, sizes, n_sp = LD.index_rows(A, V, *SETTINGS[si])
        picked, owner, want_sizes, want_sp = LB.index_maps(A, V, *SETTINGS[si])
        assert (sizes, n_sp) == (want_sizes, want_sp)
        want, t, s = LD._host_flat(picked, owner, sizes, n_sp), sum(sizes), sum(n_sp)
        assert torch.equal(rows[:3, :t], want[:3, :t]) and torch.equal(rows[3, :s], want[3, :s])


@pytest.mark.parametrize("kind", ["rand", "ties", "planted"])
def test_index_maps_equal_the_host_path_at_block_size(kind):
    _check(_maps(20, 128, 7, kind), _votes(20, 128, 7, kind == "ties"), SETTINGS[0])
    _check(_maps(17, 128, 8, kind), _votes(17, 128, 8, True), SETTINGS[3])


def test_bf16_votes_equal_the_host_path():
    _check(_maps(9, 16, 4, "rand"), _votes(9, 16, 4, False).bfloat16(), SETTINGS[1])


def test_spans_equal_the_host_path_for_query_maps():
    for seed, (n, k, fill) in enumerate([(40, 10, True), (64, 16, False), (97, 7, True), (3, 1, False),
                                         (300, 16, True), (512, 16, True)]):
        for kind in ("rand", "ties", "planted"):
            A = _maps(2, n, seed, kind)
            assert LD.detect_spans(A, 0.9, 0.1, k, fill) == LB.detect_spans(A, 0.9, 0.1, k, fill)


def test_theta_equals_torch_quantile():
    """The order statistics and the lerp: torch.quantile's value over each map's lower triangle."""
    for n, q in ((7, 0.9), (23, 0.93), (64, 0.5), (128, 0.9), (5, 0.0), (5, 1.0)):
        A = _maps(6, n, n, "rand").double()
        want = torch.stack([torch.quantile(A[i][torch.ones(n, n, dtype=torch.bool).tril()], q) for i in range(6)])
        assert torch.equal(LD.quantiles(A, q), want)


def test_non_finite_maps_go_to_the_host_path():
    A, V = _maps(3, 9, 0, "rand"), _votes(3, 9, 0, False)
    V[2, 3] = float("inf")
    _check(A, V, SETTINGS[0])
    A[1, 4, 2] = float("nan")      # the reference's rule (no spans: one gap span); its index_map raises on NaN
    assert LD.detect_spans(A, 0.9, 0.1, 2) == LB.detect_spans(A, 0.9, 0.1, 2)


@needs_triton
@pytest.mark.skipif(not _common.interpreter_active(), reason="CPU tensors through Triton need the interpreter "
                    "(on a GPU: test_gpu_equals_the_host_path_on_the_test_cases)")
def test_equal_through_the_triton_scan(monkeypatch):
    """The same bits with the prefix sums in kernels/prefix_scan.py's kernel (the GPU's path) in the interpreter."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    for kind, si in (("rand", 0), ("ties", 3), ("planted", 2)):
        _check(_maps(6, 23, si, kind), _votes(6, 23, si, kind != "rand"), SETTINGS[si])
    A = _maps(2, 40, 1, "planted")
    assert LD.detect_spans(A, 0.9, 0.1, 10) == LB.detect_spans(A, 0.9, 0.1, 10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_equals_the_host_path_on_the_test_cases():
    """On a GPU (the Triton scan, libdevice's log2/exp, CUDA's lerp): the same results on these fixed cases; the
    rate over thousands of maps is bench/ltri_device_parity.py's."""
    for kind, si in itertools.product(("rand", "ties", "planted", "flat"), range(len(SETTINGS))):
        for seed, (N, n) in itertools.product(range(2), ((6, 2), (12, 7), (40, 23), (20, 128))):
            A, V = _maps(N, n, 100 * si + seed, kind), _votes(N, n, seed, kind != "rand")
            want = LB.index_maps(A, V, *SETTINGS[si])
            got = LD.index_maps(A.cuda(), V.cuda(), *SETTINGS[si])
            assert got[2:] == want[2:] and torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    for seed, kind in itertools.product(range(3), ("rand", "ties", "planted")):
        A = _maps(2, 512, seed, kind)
        assert LD.detect_spans(A.cuda(), 0.9, 0.1, 16) == LB.detect_spans(A, 0.9, 0.1, 16)


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_ltri_logits_equal_with_the_device_path(monkeypatch, variant):
    """The whole method with its span work on the device path (forced on the CPU: ltri_device's torch operations,
    the picks kept as tensors, Ltri's wiring of both) gives the host path's logits bit for bit."""
    from test_methods_common import decode_logits, tiny_model

    from methods.ltri import Ltri, LtriConfig

    model = tiny_model()
    cfg = {"name": "ltri", **LtriConfig.variants()[variant]}
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(variant))
    host = decode_logits(model, cfg, ids, 34)
    monkeypatch.setattr(Ltri, "_span_work", lambda self, A: "device")
    assert torch.equal(decode_logits(model, cfg, ids, 34), host)


def test_add_rows_stores_what_single_adds_store():
    """IndexVectors.add_rows (one call per layer) gives the pools, counts and capacities (device_bytes) of the
    n x B block-major `add` calls it replaces, across several pool growths."""
    from methods.parts.stores_blocks import IndexVectors

    g = torch.Generator().manual_seed(0)
    B, n, dim = 3, 4, 5
    one, many = IndexVectors(), IndexVectors()
    for ix in (one, many):
        ix.allocate({0: dim}, B, "cpu", torch.float32)
    for step in range(12):
        sizes = torch.randint(1, 13, (B * n,), generator=g).tolist()
        n_sp = [min(s, 1 + (s + step) % 4) for s in sizes]
        vec = torch.randn(sum(sizes), dim, generator=g)
        span = torch.cat([torch.randint(0, k, (s,), generator=g) for s, k in zip(sizes, n_sp)])
        first = torch.cumsum(torch.tensor([0] + n_sp[:-1]), 0)
        at = torch.cumsum(torch.tensor([0] + sizes[:-1]), 0)
        for j, b in itertools.product(range(n), range(B)):
            m = b * n + j
            one.add(0, b, 10 * step + j, vec[at[m]:at[m] + sizes[m]], span[at[m]:at[m] + sizes[m]], n_sp[m])
        span_block = torch.cat([torch.full((k,), 10 * step + m % n) for m, k in enumerate(n_sp)])
        many.add_rows(0, vec, span + first.repeat_interleave(torch.tensor(sizes)), span_block, sizes, n_sp, n)
    assert one.count == many.count and one.spans == many.spans and one.device_bytes() == many.device_bytes()
    for b in range(B):
        assert all(torch.equal(x, y) for x, y in zip(one.view(0, b), many.view(0, b)))
