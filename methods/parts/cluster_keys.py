"""Batched Lloyd k-means over key vectors, in torch (the same code on the CPU and the GPU).

Tactic (sec. 3.3) clusters the keys of every head after the prefill: centroids start as randomly
sampled keys, each key goes to the centroid of HIGHEST DOT PRODUCT (not the nearest in L2), the
centroids become the means of their keys, repeated until no assignment changes or for at most
`iters` iterations, one run (no restarts). `metric="cosine"` assigns by the dot product of the
L2-normalised key and centroid instead (the ClusterKV-style variant); centroids stay plain means.

The random initial keys come from a CPU generator seeded by the caller, then move to the device:
the same seed picks the same keys on every device, so a CPU run and a CUDA run cluster alike.
Assignment (kernels/kmeans.py) never holds the [n, k] scores whole: at 128K keys and 4K clusters per
head they would be 2 GiB per head; the GPU kernel keeps one tile in registers, the torch reference
works in blocks of keys. Each iteration is one call of kernels.kmeans_assign_update: on the GPU one
kernel assigns, sums the keys per cluster (fp32 atomics: the centroids' last bits vary from run to
run), counts them and counts the keys that moved; on the CPU the torch reference does the same
deterministically.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from kernels.kmeans import kmeans_assign_update

METRICS = ("dot", "cosine")


def init_indices(groups: int, n: int, k: int, seed: int) -> torch.Tensor:
    """k distinct key indices per group, int64 [groups, k], from a CPU generator (device-independent)."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(groups)])


def init_indices_many(specs) -> list[torch.Tensor]:
    """`init_indices(*spec)` for each (groups, n, k, seed) spec, drawn on worker threads: each is a CPU
    randperm per group, ~0.5 ms at 32K keys (8 a layer on the H100's host: 16.7 ms of a 4-layer
    clustering that took ~30 ms), and the draws of different seeds are independent. Same values as
    drawing them one by one (randperm releases the GIL, so the threads overlap)."""
    specs = list(specs)
    if len(specs) <= 1:
        return [init_indices(*s) for s in specs]
    with ThreadPoolExecutor(max_workers=min(8, len(specs))) as pool:
        return list(pool.map(lambda s: init_indices(*s), specs))


def _unit(t: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(t.float(), dim=-1)


def kmeans(x: torch.Tensor, k: int, iters: int, seed: int = 0, metric: str = "dot",
           init_period: int | None = None, init: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Cluster G independent sets of n keys, x [G, n, D], into k clusters each.

    `init_period` p: group g starts from the initial indices drawn for group g % p (the caller's
    groups are (sequence, KV head) with the head fastest: p = KV heads makes a sequence's clusters
    independent of its place in the batch). None = one draw per group. `init`: those draws made
    beforehand, init_indices(p, n, k, seed) (init_indices_many draws several layers' at once). A
    group that converged stays put while others iterate (its assignment, hence its centroids, no
    longer change), so the result of each group does not depend on the others.

    Returns (centroids fp32 [G, k, D], assignment int64 [G, n], sizes int64 [G, k], iterations run).
    Every centroid is the mean of the keys assigned to it (the last assignment); a cluster that
    ends empty keeps its previous centroid and has size 0 (callers skip it)."""
    if metric not in METRICS:
        raise ValueError(f"unknown k-means metric {metric!r}; one of {METRICS}")
    G, n, D = x.shape
    x = x.contiguous()   # once: the caller's keys are a strided view of the cache (a 64 MB copy per call at 32K)
    k = max(1, min(int(k), n))
    p = G if init_period is None else int(init_period)
    if G % p:
        raise ValueError(f"init_period {p} does not divide {G} groups")
    if init is None:
        init = init_indices(p, n, k, seed)
    elif tuple(init.shape) != (p, k):
        raise ValueError(f"init {tuple(init.shape)} must be init_indices(...) of shape ({p}, {k})")
    idx = init.repeat(G // p, 1).to(x.device)
    c = x.gather(1, idx.unsqueeze(-1).expand(G, k, D)).float()
    cosine = metric == "cosine"
    # cosine scores the unit keys against unit centroids but sums the raw keys (plain-mean centroids)
    xs, acc = (_unit(x).to(x.dtype), x) if cosine else (x, None)
    prev, ran = None, 0
    for ran in range(1, max(1, int(iters)) + 1):
        a, sums, sizes, changed = kmeans_assign_update(xs, _unit(c) if cosine else c, prev, acc)
        if changed is not None and int(changed) == 0:   # converged: the centroids would not move
            ran -= 1
            break
        c = torch.where(sizes.unsqueeze(-1) > 0, sums / sizes.clamp(min=1).unsqueeze(-1), c)
        prev = a
    # sizes: the last call's, of its assignment a, which is prev (on a break a == prev, nothing moved)
    return c, prev, sizes, ran
