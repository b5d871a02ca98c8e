"""Cluster index over a FullStore's keys (Tactic): per layer and KV head, clusters of token
positions with their centroids, laid out for static-shape decode steps.

Per layer, stacked as [layers, B, Hkv, ...]:
  cent   [.., Cmax, D]  centroid (mean of the cluster's rotated keys), key dtype
  csize  [.., Cmax]     tokens in the cluster (int32; 0 = empty cluster, never ranked)
  cstart [.., Cmax]     where the cluster's positions start in `order` (int32)
  order  [.., cap]      token positions grouped by cluster, cluster after cluster (int32); inside a
                        cluster by position (a stable sort)
Clusters 0..n_clusters-1 and order entries 0..n_tokens-1 are valid: two host ints, equal for every
layer and head (each clustering event clusters the same positions everywhere), kept by the method.
Entries past them are never read unmasked, so nothing is reset between sequences: `add` overwrites
what it makes valid.
"""
from __future__ import annotations

import torch

from methods.parts.cluster_keys import init_indices_many, kmeans


class ClusterIndex:
    def __init__(self):
        self.cent = self.csize = self.cstart = self.order = None

    def allocate(self, layers: int, batch: int, kv_heads: int, max_clusters: int, capacity: int, head_dim: int,
                 device, dtype) -> None:
        shape = (layers, batch, kv_heads, max_clusters)
        same = (self.cent is not None and self.cent.shape[:-1] == shape and self.order.shape[-1] == capacity
                and self.cent.dtype == dtype and self.cent.device == torch.device(device))
        if same:
            return  # reuse between samples of the same size: a captured graph points at these
        self.cent = torch.empty(*shape, head_dim, device=device, dtype=dtype)
        self.csize = torch.zeros(shape, device=device, dtype=torch.int32)   # 0 = empty: never ranked
        self.cstart = torch.zeros(shape, device=device, dtype=torch.int32)
        self.order = torch.zeros(layers, batch, kv_heads, capacity, device=device, dtype=torch.int32)

    @property
    def max_clusters(self) -> int:
        return self.cent.shape[3]

    def add_layers(self, layers, keys_of, first_pos: int, c0: int, t0: int, n_clusters: int, iters: int,
                   metric: str, seeds) -> tuple[int, list[int]]:
        """`add` for each of `layers` (keys_of(layer): its keys [B, Hkv, m, D]; seeds[i]: layers[i]'s seed),
        with every layer's initial keys drawn at once on CPU threads. Returns (clusters made per layer,
        k-means iterations run per layer)."""
        layers, seeds = list(layers), list(seeds)
        if not layers:
            return 0, []
        _, Hkv, m, _ = keys_of(layers[0]).shape
        inits = init_indices_many([(Hkv, m, max(1, min(int(n_clusters), m)), s) for s in seeds])
        made, ran = 0, []
        for layer, seed, init in zip(layers, seeds, inits):
            made, r = self.add(layer, keys_of(layer), first_pos, c0, t0, n_clusters, iters, metric, seed, init)
            ran.append(r)
        return made, ran

    def add(self, layer: int, keys: torch.Tensor, first_pos: int, c0: int, t0: int, n_clusters: int,
            iters: int, metric: str, seed: int, init: torch.Tensor | None = None) -> tuple[int, int]:
        """Cluster `keys` [B, Hkv, m, D] (positions first_pos..first_pos+m-1) into `n_clusters` per
        head (at most m), written as clusters c0.. and order entries t0..t0+m-1. Returns (clusters
        made, k-means iterations run)."""
        B, Hkv, m, D = keys.shape
        if c0 + n_clusters > self.max_clusters or t0 + m > self.order.shape[-1]:
            raise RuntimeError(f"cluster index full: {c0}+{n_clusters} clusters of {self.max_clusters}, "
                               f"{t0}+{m} tokens of {self.order.shape[-1]}")
        cent, assign, sizes, ran = kmeans(keys.reshape(B * Hkv, m, D), n_clusters, iters, seed=seed, metric=metric,
                                       init_period=Hkv, init=init)   # same draws for every sequence: batch-invariant
        k = cent.shape[1]
        perm = torch.sort(assign, dim=-1, stable=True).indices           # positions grouped by cluster
        starts = t0 + torch.cumsum(sizes, -1) - sizes                    # exclusive cumsum
        self.cent[layer, :, :, c0:c0 + k] = cent.view(B, Hkv, k, D).to(self.cent.dtype)
        self.csize[layer, :, :, c0:c0 + k] = sizes.view(B, Hkv, k).to(torch.int32)
        self.cstart[layer, :, :, c0:c0 + k] = starts.view(B, Hkv, k).to(torch.int32)
        self.order[layer, :, :, t0:t0 + m] = (perm + first_pos).view(B, Hkv, m).to(torch.int32)
        return k, ran

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"cent": self.cent, "csize": self.csize, "cstart": self.cstart, "order": self.order}
