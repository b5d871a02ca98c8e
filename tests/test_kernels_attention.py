"""Parity of the decode attention kernels with their torch references, on the CPU through Triton's
interpreter (small shapes). Real shapes on the GPU: tests/test_kernels_gpu.py (`-m gpu`)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import _common, attention as A

pytestmark = needs_triton

TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    """Force the Triton path and poison every buffer the kernels allocate (NaN must not survive)."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")

    def nan_empty(*shape, device, dtype):
        return torch.full(shape, float("nan"), device=device, dtype=dtype)

    monkeypatch.setattr(A, "_empty", nan_empty)


def rel(a, b):
    assert torch.isfinite(a).all(), "unwritten (NaN) or non-finite output"
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def make(B, Hq, Hkv, S, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, D, generator=g)
    k = torch.randn(B, Hkv, S, D, generator=g)
    v = torch.randn(B, Hkv, S, D, generator=g)
    return [t.to(DEV, dtype) for t in (q, k, v)]


CASES = [  # (G, Hkv, D, dtype, lengths) — lengths odd, not multiples of the 32-slot block, S_cap > len
    (1, 2, 64, torch.float32, [45, 97]),
    (3, 1, 64, torch.float32, [1, 64, 33]),
    (4, 2, 128, torch.float32, [70]),
    (8, 1, 64, torch.bfloat16, [95, 31]),
]


@pytest.mark.parametrize("G,Hkv,D,dtype,lens", CASES)
@pytest.mark.parametrize("num_splits", [None, 3])
def test_decode_attention(G, Hkv, D, dtype, lens, num_splits):
    B = len(lens)
    q, k, v = make(B, G * Hkv, Hkv, 100, D, dtype)
    lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
    out = kernels.decode_attention(q, k, v, lengths, D ** -0.5, num_splits=num_splits)
    ref = A.decode_attention_ref(q, k, v, lengths, D ** -0.5)
    assert out.dtype == dtype and out.shape == q.shape
    assert rel(out, ref) < TOL[dtype]


@pytest.mark.parametrize("G,Hkv,D,dtype,lens", CASES[1:3] + CASES[3:])
def test_selection_attention(G, Hkv, D, dtype, lens):
    B = len(lens)
    q, k, v = make(B, G * Hkv, Hkv, 100, D, dtype, seed=1)
    lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
    out, scores, idx, cnt = kernels.selection_attention(q, k, v, lengths, 0.1, topk=16)
    rout, rscores = A.selection_attention_ref(q, k, v, lengths, 0.1)
    assert rel(out, ref := rout) < TOL[dtype] and ref.shape == out.shape
    assert scores.shape == (B, G * Hkv, max(lens)) and scores.dtype == torch.float32
    pad = torch.arange(max(lens), device=DEV) >= lengths.view(B, 1, 1)
    assert torch.isinf(scores[pad.expand_as(scores)]).all() and torch.isfinite(scores[~pad.expand_as(scores)]).all()
    torch.testing.assert_close(scores.masked_fill(pad, 0), rscores.masked_fill(pad, 0),
                               rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-4)
    assert cnt.tolist() == [[min(16, n)] * (G * Hkv) for n in lens]
    if dtype == torch.float32:  # bf16 rounding may flip near-ties
        ridx, _ = A.topk_positions(rscores, lengths, 16)
        assert torch.equal(idx, ridx)


def test_topk_positions_properties():
    B, H, S = 2, 3, 50
    scores = torch.randn(B, H, S)
    lengths = torch.tensor([50, 5], dtype=torch.int32)
    scores[1, :, 5:] = float("-inf")
    idx, cnt = A.topk_positions(scores, lengths, 8)
    assert idx.dtype == torch.int32 and cnt.tolist() == [[8] * 3, [5] * 3]
    for b in range(B):
        for h in range(H):
            sel = idx[b, h, : cnt[b, h]]
            assert torch.equal(sel, sel.sort().values)
            want = scores[b, h].topk(int(cnt[b, h])).indices.sort().values
            assert torch.equal(sel.long(), want)
    assert (idx[1, :, 5:] == 0).all()


def _token_sets(B, H, S, lens, kmax, g):
    index = torch.full((B, H, kmax), -1, dtype=torch.int32)  # padding is never read
    counts = torch.randint(0, kmax + 1, (B, H), generator=g, dtype=torch.int32)
    counts[0, 0] = kmax
    counts[-1, -1] = 0
    for b in range(B):
        counts[b] = counts[b].clamp(max=lens[b])
        for h in range(H):
            c = int(counts[b, h])
            index[b, h, :c] = torch.randperm(lens[b], generator=g)[:c].to(torch.int32)
    return index, counts


@pytest.mark.parametrize("G,Hkv,D,dtype,lens", CASES)
@pytest.mark.parametrize("per_query_head", [True, False])
def test_sparse_decode_tokens(G, Hkv, D, dtype, lens, per_query_head):
    B, Hq = len(lens), G * Hkv
    q, k, v = make(B, Hq, Hkv, 100, D, dtype, seed=2)
    g = torch.Generator().manual_seed(3)
    H = Hq if per_query_head else Hkv
    index, counts = _token_sets(B, H, 100, lens, 40, g)
    index, counts = index.to(DEV), counts.to(DEV)
    out = kernels.sparse_decode_tokens(q, k, v, index, counts, 0.125)
    ref = A.sparse_decode_tokens_ref(q, k, v, index, counts, 0.125)
    assert rel(out, ref) < TOL[dtype]
    assert (out[counts.repeat_interleave(Hq // H, 1) == 0] == 0).all()  # empty set -> zeros


def test_sparse_tokens_budget_covers_everything_equals_full():
    lens = [37, 80]
    q, k, v = make(2, 8, 2, 96, 64, torch.float32, seed=4)
    lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
    index = torch.zeros(2, 2, 128, dtype=torch.int32)
    for b, n in enumerate(lens):
        index[b, :, :n] = torch.arange(n, dtype=torch.int32)
    counts = lengths.view(2, 1).expand(2, 2).contiguous()
    out = kernels.sparse_decode_tokens(q, k, v, index.to(DEV), counts, 0.125, num_splits=2)
    assert rel(out, A.decode_attention_ref(q, k, v, lengths, 0.125)) < 2e-5


@pytest.mark.parametrize("G,Hkv,D,dtype,lens", CASES)
@pytest.mark.parametrize("page_size,per_query_head", [(16, False), (8, True)])
def test_sparse_decode_pages(G, Hkv, D, dtype, lens, page_size, per_query_head):
    B, Hq = len(lens), G * Hkv
    q, k, v = make(B, Hq, Hkv, 100, D, dtype, seed=5)
    g = torch.Generator().manual_seed(6)
    H = Hq if per_query_head else Hkv
    npages = [-(-n // page_size) for n in lens]
    pmax = 4
    page_index = torch.full((B, H, pmax), 10_000, dtype=torch.int32)  # padding: out of range
    counts = torch.zeros(B, H, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            c = int(torch.randint(1, min(pmax, npages[b]) + 1, (1,), generator=g))
            sel = torch.randperm(npages[b], generator=g)[:c]
            sel[0] = npages[b] - 1  # always include the (possibly partial) last page
            sel = sel.unique()
            page_index[b, h, :len(sel)] = sel.to(torch.int32)
            counts[b, h] = len(sel)
    lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
    page_index, counts = page_index.to(DEV), counts.to(DEV)
    out = kernels.sparse_decode_pages(q, k, v, page_index, counts, page_size, lengths, 0.125)
    ref = A.sparse_decode_pages_ref(q, k, v, page_index, counts, page_size, lengths, 0.125)
    assert rel(out, ref) < TOL[dtype]


def test_sparse_pages_budget_covers_everything_equals_full():
    lens, P = [37, 80], 16
    q, k, v = make(2, 6, 2, 96, 64, torch.float32, seed=7)
    lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
    page_index = torch.arange(8, dtype=torch.int32).view(1, 1, 8).repeat(2, 6, 1)
    counts = torch.tensor([[3] * 6, [5] * 6], dtype=torch.int32)
    out = kernels.sparse_decode_pages(q, k, v, page_index.to(DEV), counts.to(DEV), P, lengths, 0.125)
    assert rel(out, A.decode_attention_ref(q, k, v, lengths, 0.125)) < 2e-5


def test_combine_matches_torch_and_empty_rows_are_zero():
    B, Hq, NS, D = 2, 3, 5, 64
    op = torch.randn(B, Hq, NS, D, device=DEV)
    lp = torch.randn(B, Hq, NS, device=DEV) * 3
    lp[0, 1] = float("-inf")
    lp[1, 2, :3] = float("-inf")
    out = torch.full((B, Hq, D), float("nan"), device=DEV)
    _common.combine(op, lp, out)
    ref = _common.combine_torch(op, lp, torch.float32)
    assert (out[0, 1] == 0).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_dispatch(monkeypatch):
    q, k, v = make(1, 4, 2, 20, 64, torch.float32)
    lengths = torch.tensor([20], dtype=torch.int32, device=DEV)
    monkeypatch.setenv("HARNESS_KERNELS", "torch")
    assert kernels.backend_for(q) == "torch"
    monkeypatch.delenv("HARNESS_KERNELS")
    assert kernels.backend_for(q) == ("triton" if q.is_cuda else "torch")
    out = kernels.decode_attention(q, k, v, lengths, 0.125)
    assert rel(out, A.decode_attention_ref(q, k, v, lengths, 0.125)) < 2e-5
    monkeypatch.setenv("HARNESS_KERNELS", "cuda")
    with pytest.raises(ValueError):
        kernels.backend_for(q)
