"""The k-means assignment kernel (kernels/kmeans.py) against its torch reference: the same centroid
per key for key counts and cluster counts off the tile sizes, ties to the lowest index across and
within tiles, bf16 keys scored in fp32, and the dispatcher's shape rule. Interpreter on the CPU; a
real shape (8 KV heads x 32K keys x 128, 1024 clusters) with `-m gpu`."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import kmeans as KM

pytestmark = needs_triton


def keys(G, n, k, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(G, n, D, generator=g).to(DEV, dtype), torch.randn(G, k, D, generator=g).to(DEV))


@pytest.mark.parametrize("G,n,k,D", [(3, 100, 37, 16), (2, 33, 16, 32), (1, 17, 70, 64), (2, 5, 3, 16)])
def test_kernel_matches_reference(monkeypatch, G, n, k, D):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    x, c = keys(G, n, k, D, seed=n + k)
    a = KM.kmeans_assign(x, c)
    assert a.dtype == torch.long and a.shape == (G, n)
    assert torch.equal(a, KM.kmeans_assign_ref(x, c))
    assert torch.equal(a, torch.einsum("gnd,gkd->gnk", x.double(), c.double()).argmax(-1))   # the true best


def test_ties_go_to_the_lowest_index_within_and_across_tiles(monkeypatch):
    """Centroid j and j + 16 (another tile) and j + 1 (the same tile) equal: torch.argmax's first index."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    x, c = keys(2, 40, 48, 16, seed=7)
    c[:, 20] = c[:, 3]            # across tiles (BLOCK_K 16 on the interpreter): 3 wins
    c[:, 4] = c[:, 3]             # within a tile: 3 wins
    c[:, 40] = c[:, 33]           # both later than the first copy: 33 wins
    x[:, :10] = c[:, 3][:, None] * 5   # keys whose best centroid is the tied one
    x[:, 10:20] = c[:, 33][:, None] * 5
    a = KM.kmeans_assign(x, c)
    assert torch.equal(a, KM.kmeans_assign_ref(x, c))
    assert (a[:, :10] == 3).all() and (a[:, 10:20] == 33).all()


def test_bf16_keys_are_scored_in_fp32(monkeypatch):
    """bf16 inputs, fp32 products: the kernel equals the reference on the same rounded inputs (not a
    bf16-rounded score matrix, which ties centroids apart by less than its rounding)."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    x, c = keys(2, 64, 40, 32, seed=3, dtype=torch.bfloat16)
    a = KM.kmeans_assign(x, c)
    exact = torch.einsum("gnd,gkd->gnk", x.double(), c.to(torch.bfloat16).double()).argmax(-1)
    assert torch.equal(a, KM.kmeans_assign_ref(x, c)) and torch.equal(a, exact)


def test_dispatch_takes_the_reference_where_the_kernel_does_not_fit(monkeypatch):
    """D = 24 (not a power of two) goes to the reference even with HARNESS_KERNELS=triton; CPU tensors
    without a forced backend go to the reference."""
    calls = []
    monkeypatch.setattr(KM, "kmeans_assign_ref", lambda x, c: calls.append(x.shape) or torch.zeros(1))
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    KM.kmeans_assign(*keys(1, 8, 4, 24, seed=1))
    assert calls == [(1, 8, 24)]
    if DEV == "cpu":
        monkeypatch.delenv("HARNESS_KERNELS")
        KM.kmeans_assign(*keys(1, 8, 4, 16, seed=1))
        assert calls[-1] == (1, 8, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_at_a_real_shape():
    """8 KV heads x 32K bf16 keys, 1024 clusters (Tactic at 32K): every key's kernel pick scores within
    fp32 summation error of the reference's best (the two differ only on near-ties)."""
    x, c = keys(8, 32768, 1024, 128, seed=0, dtype=torch.bfloat16)
    a, r = KM.kmeans_assign(x, c), KM.kmeans_assign_ref(x, c)
    s = torch.bmm(x.float(), c.to(torch.bfloat16).float().transpose(1, 2))
    gap = s.gather(-1, r[..., None]) - s.gather(-1, a[..., None])
    assert (a == r).float().mean() > 0.999 and gap.abs().max() < 1e-3
