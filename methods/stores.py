"""KV storage layouts shared by methods. Preallocated for the run's maximum length: no per-step
`torch.cat`, writes are slice assignments.

Layout: k, v are [B, Hkv, capacity, D] per layer, stacked as [layers, B, Hkv, capacity, D].
"""
from __future__ import annotations

import torch


class FullStore:
    """Every token's key (rotated at its absolute position) and value, indexed by position."""

    def __init__(self):
        self.k = self.v = None
        self.capacity = 0

    def allocate(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 device, dtype) -> None:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        if self.k is not None and self.k.shape == shape and self.k.dtype == dtype and self.k.device == torch.device(device):
            return  # reuse between samples of the same size: no reallocation
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.capacity = capacity

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        if end > self.capacity:
            raise RuntimeError(f"KV store overflow: {end} > capacity {self.capacity}")
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]
