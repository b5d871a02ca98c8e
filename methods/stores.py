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


class PageBounds:
    """Quest page metadata: per-channel key min/max of each page of `page_size` tokens aligned to
    position 0, per KV head: kmin, kmax [layers, B, Hkv, n_pages, D] in the key dtype (min/max are
    exact, so nothing is lost). Updated incrementally: an append recomputes only the pages it
    touches, from the keys already written to the store (exact, and stale data from a previous
    sample in the tail of a page is masked out)."""

    def __init__(self, page_size: int):
        self.page_size = int(page_size)
        self.kmin = self.kmax = None

    def allocate(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 device, dtype) -> None:
        pages = -(-capacity // self.page_size)
        shape = (layers, batch, kv_heads, pages, head_dim)
        if self.kmin is not None and self.kmin.shape == shape and self.kmin.dtype == dtype \
                and self.kmin.device == torch.device(device):
            return
        self.kmin = torch.empty(shape, device=device, dtype=dtype)
        self.kmax = torch.empty(shape, device=device, dtype=dtype)

    def update(self, layer: int, keys: torch.Tensor, start: int, end: int) -> None:
        """Tokens start..end-1 were just written; `keys` [B, Hkv, cap, D] is the layer's key store
        (cap a multiple of page_size, see `padded_capacity`)."""
        P = self.page_size
        p0, p1 = start // P, (end - 1) // P + 1
        blk = keys[:, :, p0 * P:p1 * P].unflatten(2, (p1 - p0, P))  # [B, Hkv, pages, P, D]
        live = (torch.arange(p0 * P, p1 * P, device=keys.device) < end).view(p1 - p0, P, 1)
        self.kmin[layer, :, :, p0:p1] = torch.where(live, blk, float("inf")).amin(dim=3)
        self.kmax[layer, :, :, p0:p1] = torch.where(live, blk, float("-inf")).amax(dim=3)

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = -(-length // self.page_size)
        return self.kmin[layer, :, :, :n], self.kmax[layer, :, :, :n]


def padded_capacity(capacity: int, page_size: int) -> int:
    """Capacity rounded up to whole pages, so a page's keys are always one slice of the store."""
    return -(-capacity // page_size) * page_size


class SinkRingStore:
    """Sink + rolling storage with UN-rotated keys (StreamingLLM, and any method that re-assigns
    positions after eviction): slots [0, sink) hold the first tokens, slots [sink, sink+ring) a ring
    of the most recent ones (absolute position p >= sink lives in slot sink + (p - sink) % ring).
    `slot_pos` [sink+ring] (device, shared by all layers) holds the absolute position each slot
    holds, -1 for empty; methods derive visibility and in-cache positions from it. Zero-filled at
    allocation so that masked slots never carry NaN into attention."""

    def __init__(self):
        self.k = self.v = self.slot_pos = None
        self.sink = self.ring = 0

    def allocate(self, layers: int, batch: int, kv_heads: int, sink: int, ring: int, head_dim: int,
                 device, dtype) -> None:
        self.sink, self.ring = int(sink), int(ring)
        shape = (layers, batch, kv_heads, self.sink + self.ring, head_dim)
        if not (self.k is not None and self.k.shape == shape and self.k.dtype == dtype
                and self.k.device == torch.device(device)):
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.slot_pos = torch.full((self.sink + self.ring,), -1, dtype=torch.long, device=device)

    def slots(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots, offsets) for the tokens of absolute positions start..end-1 that are kept: those
        with p < sink, and the last `ring` of those with p >= sink (earlier ones would be
        overwritten within the same write). `offsets` index into the new tokens. Host ints only:
        no device sync."""
        device = self.slot_pos.device
        sink_end = max(start, min(end, self.sink))
        ring_start = min(end, max(start, self.sink, end - self.ring))
        pos = torch.cat([torch.arange(start, sink_end, device=device),
                         torch.arange(ring_start, end, device=device)])
        return self._slot_of(pos), pos - start

    def _slot_of(self, pos: torch.Tensor) -> torch.Tensor:
        return torch.where(pos < self.sink, pos, self.sink + (pos - self.sink) % max(self.ring, 1))

    def mark(self, slots: torch.Tensor, positions: torch.Tensor) -> None:
        self.slot_pos.index_copy_(0, slots, positions)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [B, Hkv, n, D] (un-rotated) into `slots` [n]."""
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
