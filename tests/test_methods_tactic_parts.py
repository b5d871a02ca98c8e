"""Tactic's building blocks against explicit computations: the closed forms of methods/parts/tactic_rules.py
(tail sums with harmonic numbers, clipped and as Algorithm 1 writes them, the two-window fit, the
bisection) and the k-means of methods/parts/cluster_keys.py (a Lloyd fixed point, groups independent of each other,
the fused Triton step clustering like the torch reference, CUDA clustering like the CPU)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from methods.parts.tactic_rules import fit_curve, harmonic, min_count, tail_mass


@pytest.mark.parametrize("seed", range(6))
def test_literal_tail_budget_is_algorithm_1_as_written(seed):
    """tail=literal: K = the smallest k with sum_{i<=k} w_i >= T * sum_{i<=n} w_i, w_i exact for the first N
    list ranks and a/i + b after (negative past a/-b), computed here by a plain loop; the clipped tail's K
    is never smaller (its denominator drops the negative terms)."""
    g = torch.Generator().manual_seed(seed)
    n, N, T = 400, 8, 0.9
    head = torch.rand(N, generator=g) * 3
    a, b = float(torch.rand(1, generator=g)) * 4 + 1, -float(torch.rand(1, generator=g)) * 0.03
    w = [float(x) for x in head] + [a / i + b for i in range(N + 1, n + 1)]
    want = next(k for k in range(n + 1) if sum(w[:k]) >= T * sum(w) - 1e-9)
    harm = harmonic(n, torch.device("cpu"))
    head_cum = torch.cat([torch.zeros(1), head.cumsum(0)])
    ks = {}
    for tail in ("literal", "clip"):
        def mass_at(k, rising=True, tail=tail):
            return head_cum[k.clamp(max=N)] + tail_mass(torch.tensor([a]), torch.tensor([b]), N, k, harm, tail, rising)
        total = mass_at(torch.tensor([n]), rising=False)
        ks[tail] = int(min_count(mass_at, T * total, n))
    assert ks["literal"] == want and ks["clip"] >= ks["literal"]     # e.g. seed 0: 18 against 39

def test_tail_sum_fit_and_bisection_match_explicit_sums():
    g = torch.Generator().manual_seed(0)
    harm = harmonic(500, torch.device("cpu"))
    for _ in range(50):
        a, b = float(torch.rand(1, generator=g)) * 5, float(torch.randn(1, generator=g)) * 0.02
        lo, hi = int(torch.randint(0, 100, (1,), generator=g)), int(torch.randint(100, 500, (1,), generator=g))
        got = tail_mass(torch.tensor([a]), torch.tensor([b]), lo, torch.tensor([hi]), harm)
        want = sum(max(a / x + b, 0.0) for x in range(lo + 1, hi + 1))
        assert abs(float(got) - want) <= 1e-4 * max(1.0, want)
    a, b = fit_curve(0.5, torch.tensor([3.0]), 0.1, torch.tensor([1.0]))   # through (u=.5, 3) and (u=.1, 1)
    assert torch.allclose(a * 0.5 + b, torch.tensor([3.0])) and torch.allclose(a * 0.1 + b, torch.tensor([1.0]))
    a, b = fit_curve(0.5, torch.tensor([1.0]), 0.1, torch.tensor([3.0]))   # rising: flat fallback
    assert float(a) == 0 and float(b) == 2.0
    a, b = fit_curve(0.5, torch.tensor([1.0]), 0.1, torch.tensor([3.0]), rising="fit")   # rising_fit=fit: as fitted
    assert float(a) == -5.0 and torch.allclose(a * 0.1 + b, torch.tensor([3.0]))
    for _ in range(50):            # literal: a/x + b as is (negative past a/-b); `rising` cuts at a/-b
        a, b = float(torch.rand(1, generator=g)) * 5, -float(torch.rand(1, generator=g)) * 0.05
        lo, hi = int(torch.randint(0, 50, (1,), generator=g)), int(torch.randint(100, 500, (1,), generator=g))
        ta, tb, th = torch.tensor([a]), torch.tensor([b]), torch.tensor([hi])
        want = sum(a / x + b for x in range(lo + 1, hi + 1))
        assert abs(float(tail_mass(ta, tb, lo, th, harm, "literal", rising=False)) - want) <= 1e-4 * max(1.0, abs(want))
        assert torch.equal(tail_mass(ta, tb, lo, th, harm, "literal"), tail_mass(ta, tb, lo, th, harm))
    w = torch.rand(300, generator=g)
    cum = torch.cat([torch.zeros(1), w.cumsum(0)])
    for t in torch.rand(20, generator=g) * float(cum[-1]):
        k = min_count(lambda kk: cum[kk], t.view(1), 300)
        assert float(cum[k]) >= float(t) and (int(k) == 0 or float(cum[k - 1]) < float(t))


def test_kmeans_is_a_lloyd_fixed_point_with_dot_product_assignment():
    """Converged k-means: every key sits in the cluster of highest dot product with its centroid, and
    every non-empty centroid is the mean of its keys; the initial picks depend on the seed only."""
    from methods.parts.cluster_keys import init_indices, kmeans

    x = torch.randn(3, 300, 16, generator=torch.Generator().manual_seed(1))
    c, a, sizes, ran = kmeans(x, 12, iters=100, seed=5)
    assert ran < 100                                                   # converged
    assert torch.equal(a, torch.einsum("gnd,gkd->gnk", x, c).argmax(-1))
    for gi in range(3):
        for j in range(12):
            if sizes[gi, j]:
                assert torch.allclose(c[gi, j], x[gi, a[gi] == j].mean(0), atol=1e-5)
    assert int(sizes.sum()) == 900
    assert torch.equal(sizes, torch.nn.functional.one_hot(a, 12).sum(1))   # of the returned assignment
    _, a2, sizes2, ran2 = kmeans(x, 12, iters=2, seed=5)                  # stopped by the cap, not converged
    assert ran2 == 2 and torch.equal(sizes2, torch.nn.functional.one_hot(a2, 12).sum(1))
    assert torch.equal(init_indices(3, 300, 12, 5), init_indices(3, 300, 12, 5))
    assert all(len(set(r.tolist())) == 12 for r in init_indices(3, 300, 12, 5))


def test_kmeans_group_result_does_not_depend_on_the_other_groups():
    """With init_period = KV heads, the clusters of one sequence's heads are the same whether it is
    clustered alone or batched with others (same initial picks; a converged group stays put while
    the others iterate). Found by the batch conformance check: one draw per group made a sequence's
    clusters depend on its place in the batch."""
    from methods.parts.cluster_keys import kmeans

    g = torch.Generator().manual_seed(3)
    hkv = 2
    x = torch.randn(3 * hkv, 200, 8, generator=g)           # 3 sequences x 2 KV heads, head fastest
    c, a, sizes, _ = kmeans(x, 10, iters=50, seed=4, init_period=hkv)
    for b in range(3):
        cb, ab, sb, _ = kmeans(x[b * hkv:(b + 1) * hkv], 10, iters=50, seed=4, init_period=hkv)
        assert torch.equal(ab, a[b * hkv:(b + 1) * hkv]) and torch.equal(sb, sizes[b * hkv:(b + 1) * hkv])
        assert torch.allclose(cb, c[b * hkv:(b + 1) * hkv], atol=1e-6)
    with pytest.raises(ValueError, match="does not divide"):
        kmeans(x, 10, iters=5, init_period=4)


@needs_triton
@pytest.mark.parametrize("metric", ["dot", "cosine"])
def test_kmeans_through_the_fused_kernel_clusters_like_the_reference(monkeypatch, metric):
    """HARNESS_KERNELS=triton (the interpreter on the CPU) runs each iteration as one fused kernel:
    the same assignments, sizes and iteration count as the torch reference, centroids within fp32
    summation order. Cosine scores unit keys but its centroids are plain means of the raw keys."""
    from methods.parts.cluster_keys import kmeans

    x = torch.randn(2, 150, 16, generator=torch.Generator().manual_seed(2)).to(DEV)
    monkeypatch.setenv("HARNESS_KERNELS", "torch")
    c, a, sizes, ran = kmeans(x, 9, iters=50, seed=1, metric=metric)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    ck, ak, sizes_k, ran_k = kmeans(x, 9, iters=50, seed=1, metric=metric)
    assert ran == ran_k < 50 and torch.equal(a, ak) and torch.equal(sizes, sizes_k)
    assert torch.allclose(c, ck, atol=1e-5)
    means = torch.einsum("gnk,gnd->gkd", torch.nn.functional.one_hot(ak, 9).float(), x) / sizes_k[..., None]
    assert torch.allclose(ck, means, atol=1e-5)                          # no empty cluster here


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kmeans_cuda_clusters_like_the_cpu():
    """The same seed picks the same initial keys on every device (CPU generator), so a CUDA run of
    real-shape keys (8 KV heads x 32K tokens x 128, 1024 clusters) clusters as the CPU does, up to
    the assignments that float rounding moves (bmm order differs): >= 99% agree, centroids close."""
    from methods.parts.cluster_keys import kmeans

    x = torch.randn(8, 32768, 128, generator=torch.Generator().manual_seed(0))
    c_cpu, a_cpu, _, _ = kmeans(x, 1024, iters=10, seed=3)
    c_gpu, a_gpu, s_gpu, _ = kmeans(x.cuda(), 1024, iters=10, seed=3)
    assert (a_gpu.cpu() == a_cpu).float().mean() >= 0.99
    assert int(s_gpu.sum()) == 8 * 32768
    assert (c_gpu.cpu() - c_cpu).abs().max() < 0.1


def test_initial_keys_drawn_on_threads_are_the_serial_draws():
    """init_indices_many (every layer's draws at once, on threads) gives init_indices' values per spec, and
    ClusterIndex.add_layers clusters each layer as add does with that layer's seed."""
    from methods.parts.cluster_keys import init_indices, init_indices_many
    from methods.parts.stores_clusters import ClusterIndex

    specs = [(2, 300, 17, s) for s in (5, 1014, 2023)] + [(3, 40, 40, 9)]
    for got, spec in zip(init_indices_many(specs), specs):
        assert torch.equal(got, init_indices(*spec))
    keys = torch.randn(3, 1, 2, 64, 8)                       # layers, B, Hkv, m, D
    a, b = ClusterIndex(), ClusterIndex()
    for idx in (a, b):
        idx.allocate(3, 1, 2, 8, 64, 8, "cpu", torch.float32)
    made, ran = a.add_layers(range(1, 3), lambda layer: keys[layer], 0, 0, 0, 8, 4, "dot", seeds=[11, 12])
    for layer, seed in ((1, 11), (2, 12)):
        assert (made, ran[layer - 1]) == b.add(layer, keys[layer], 0, 0, 0, 8, 4, "dot", seed)
    for name in ("cent", "csize", "cstart", "order"):   # what add wrote (cent is allocated uninitialised)
        assert torch.equal(getattr(a, name)[1:, ..., :made], getattr(b, name)[1:, ..., :made]), name


@pytest.mark.parametrize("over,words", [({"target": 0.0}, "method.target=0.0 asks for no attention mass"),
                                        ({"rising_fit": "fit"}, "method.rising_fit=fit needs method.tail=literal")])
def test_config_refuses_a_zero_target_and_a_clipped_rising_fit(over, words):
    """`method=tactic method.target=0` attended only the exact set (~55 tokens) without a word (issue
    38): refused in one line, as a rising fit summed by the clipped tail (which assumes a falling curve)."""
    from omegaconf import OmegaConf
    from tiny_models import tiny

    from common.errors import ConfigError
    from methods import ModelInfo, build

    info = ModelInfo.from_hf_config(tiny("llama").config)
    with pytest.raises(ConfigError, match=words):
        build(OmegaConf.create({"name": "tactic", **over}), info)
    build(OmegaConf.create({"name": "tactic", "mode": "topk", "target": 0.0}), info)   # topk reads no target
    build(OmegaConf.create({"name": "tactic", "rising_fit": "fit", "tail": "literal"}), info)
