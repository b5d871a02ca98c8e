"""The k-means assignment kernel (kernels/kmeans.py) against its torch reference: the same centroid
per key for key counts and cluster counts off the tile sizes, ties to the lowest index across and
within tiles, bf16 keys scored in fp32, and the dispatcher's shape rule. The fused update (sums,
sizes, keys changed) likewise, with and without a previous assignment and a separate accumulated
tensor; the shapes leave padded keys in the last tile, which a missing mask would count. Interpreter
on the CPU; a real shape (8 KV heads x 32K keys x 128, 1024 clusters) with `-m gpu`."""
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
    au, _, sizes, _ = KM.kmeans_assign_update(x, c)
    assert torch.equal(au, a) and (sizes[:, 4] == 0).all() and (sizes[:, 20] == 0).all()


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
    without a forced backend go to the reference. The same for the fused update."""
    calls = []
    monkeypatch.setattr(KM, "kmeans_assign_ref", lambda x, c: calls.append(x.shape) or torch.zeros(1))
    monkeypatch.setattr(KM, "kmeans_assign_update_ref", lambda x, c, p, a: calls.append(("update", x.shape)))
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    KM.kmeans_assign(*keys(1, 8, 4, 24, seed=1))
    KM.kmeans_assign_update(*keys(1, 8, 4, 24, seed=1))
    assert calls == [(1, 8, 24), ("update", (1, 8, 24))]
    if DEV == "cpu":
        monkeypatch.delenv("HARNESS_KERNELS")
        KM.kmeans_assign(*keys(1, 8, 4, 16, seed=1))
        KM.kmeans_assign_update(*keys(1, 8, 4, 16, seed=1))
        assert calls[-2:] == [(1, 8, 16), ("update", (1, 8, 16))]


@pytest.mark.parametrize("G,n,k,D,dtype", [(3, 100, 37, 16, torch.float32), (2, 45, 20, 32, torch.bfloat16),
                                           (1, 17, 70, 16, torch.float32)])
def test_update_matches_reference(monkeypatch, G, n, k, D, dtype):
    """Assignment, per-cluster sums and sizes, keys changed: the kernel's equal the reference's (sums up
    to fp32 order), without and with prev, summing x or another tensor. n is off the interpreter's tile
    (16), so the last tile has padded keys; they score 0 everywhere and would land in cluster 0: the
    sizes must add up to n exactly."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    tile = (KM.GPU_BLOCK_N, KM.GPU_BLOCK_K) if DEV == "cuda" else (KM.INTERP_BLOCK, KM.INTERP_BLOCK)
    assert n % tile[0] and k % tile[1]                                   # a partial tile of each
    x, c = keys(G, n, k, D, seed=n + k, dtype=dtype)
    other = torch.randn(G, n, D, generator=torch.Generator().manual_seed(1)).to(DEV, dtype)
    first = KM.kmeans_assign_ref(x, c)
    prev = first.clone()
    prev[:, ::3] = (prev[:, ::3] + 1) % k                                # every third key moved
    for p in (None, prev):
        for acc in (None, other):
            a, sums, sizes, changed = KM.kmeans_assign_update(x, c, p, acc)
            ra, rsums, rsizes, rchanged = KM.kmeans_assign_update_ref(x, c, p, acc)
            assert a.dtype == sizes.dtype == torch.long and sums.dtype == torch.float32
            assert sums.shape == (G, k, D) and sizes.shape == (G, k)
            assert torch.equal(a, ra) and torch.equal(a, first) and torch.equal(a, KM.kmeans_assign(x, c))
            assert torch.equal(sizes, rsizes) and (sizes.sum(-1) == n).all()
            assert torch.allclose(sums, rsums, atol=1e-5, rtol=1e-5)
            if p is None:
                assert changed is None and rchanged is None
            else:
                assert changed.shape == () and changed.dtype == torch.long and changed.device == x.device
                assert int(changed) == int(rchanged) == G * len(range(0, n, 3))
    one = first.clone()
    one[-1, n // 2] = (one[-1, n // 2] + 1) % k                          # a lone moved key counts too
    assert int(KM.kmeans_assign_update(x, c, first)[3]) == 0 and int(KM.kmeans_assign_update(x, c, one)[3]) == 1
    with pytest.raises(ValueError, match="acc"):
        KM.kmeans_assign_update(x, c, acc=other[:, 1:])


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_at_a_real_shape():
    """The fused update at Tactic's 32K shape (bf16 keys, normalised for scoring, raw keys summed as the
    cosine metric does): sizes are exactly the bincount of the kernel's own assignment, sums its
    index_add_ within fp32 order, changed its count against the reference's assignment."""
    x, c = keys(8, 32768, 1024, 128, seed=1, dtype=torch.bfloat16)
    xs = torch.nn.functional.normalize(x.float(), dim=-1).to(x.dtype)
    r = KM.kmeans_assign_ref(xs, c)
    a, sums, sizes, changed = KM.kmeans_assign_update(xs, c, r, x)
    rows = (a + torch.arange(8, device=DEV)[:, None] * 1024).view(-1)
    assert (a == r).float().mean() > 0.999 and int(changed) == int((a != r).sum())
    assert torch.equal(sizes.view(-1), torch.bincount(rows, minlength=8 * 1024))
    want = torch.zeros(8 * 1024, 128, device=DEV).index_add_(0, rows, x.float().view(-1, 128))
    assert torch.allclose(sums.view(-1, 128), want, atol=1e-3, rtol=1e-4)
