"""KV storage layouts shared by methods. Preallocated for the run's maximum length: no per-step
`torch.cat`, writes are slice assignments.

Layout: k, v are [B, Hkv, capacity, D] per layer, stacked as [layers, B, Hkv, capacity, D].
"""
from __future__ import annotations

import torch

import kernels


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

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [B, Hkv, T, D] into the slots of `positions` [T] (a device tensor: no host int,
        so the same call serves prefill chunks and graph-captured decode steps)."""
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"k": self.k, "v": self.v}


class PageBounds:
    """Quest page metadata: per-channel key min/max of each page of `page_size` tokens aligned to
    position 0, per KV head: kmin, kmax [layers, B, Hkv, n_pages, D] in the key dtype (min/max are
    exact, so nothing is lost). Updated incrementally on append by `kernels.quest_update_pages`
    (only the pages an append touches; a page that starts inside the append is overwritten, so
    stale bounds of a previous sample never merge in)."""

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

    def update(self, layer: int, k_new: torch.Tensor, start: torch.Tensor) -> None:
        """Fold the keys k_new [B, Hkv, T, D] written at positions start.. (int32 [B] on the device)."""
        kernels.quest_update_pages(self.kmin[layer], self.kmax[layer], k_new, start, self.page_size)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"kmin": self.kmin, "kmax": self.kmax}


def padded_capacity(capacity: int, page_size: int) -> int:
    """Capacity rounded up to whole pages, so a page's keys are always one slice of the store."""
    return -(-capacity // page_size) * page_size


class SinkRingStore:
    """Sink + rolling storage with UN-rotated keys (StreamingLLM, and any method that re-assigns
    positions after eviction): slots [0, sink) hold the first tokens, slots [sink, sink+ring) a ring
    of the most recent ones (absolute position p >= sink lives in slot sink + (p - sink) % ring).
    `slot_pos` [sink+ring] (device, shared by all layers) holds the absolute position each slot
    holds, -1 for empty (reset by every `allocate`); methods derive visibility and in-cache
    positions from it. k/v of empty slots are whatever was there: readers mask them."""

    def __init__(self):
        self.k = self.v = self.slot_pos = None
        self.sink = self.ring = 0

    def allocate(self, layers: int, batch: int, kv_heads: int, sink: int, ring: int, head_dim: int,
                 device, dtype) -> None:
        self.sink, self.ring = int(sink), int(ring)
        shape = (layers, batch, kv_heads, self.sink + self.ring, head_dim)
        if not (self.k is not None and self.k.shape == shape and self.k.dtype == dtype
                and self.k.device == torch.device(device)):
            self.k = torch.empty(shape, device=device, dtype=dtype)
            self.v = torch.empty(shape, device=device, dtype=dtype)
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

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"k": self.k, "v": self.v, "slot_pos": self.slot_pos}


class BoundedStore:
    """A fixed number of slots per KV head, any token in any slot (eviction methods: H2O, TOVA):
    k, v [layers, B, Hkv, cap, D] (keys rotated at their absolute positions), and per slot the
    absolute position it holds, `pos` [layers, B, Hkv, cap] int64 (-1 empty), and an accumulated
    score, `score` [layers, B, Hkv, cap] fp32. Heads evict independently; filled slots always form
    a prefix, so the decode kernels read them by length. `allocate` resets pos and score (small);
    k/v of empty slots are whatever was there: readers mask them by length."""

    def __init__(self):
        self.k = self.v = self.pos = self.score = None

    def allocate(self, layers: int, batch: int, kv_heads: int, cap: int, head_dim: int, device, dtype) -> None:
        shape = (layers, batch, kv_heads, cap, head_dim)
        if not (self.k is not None and self.k.shape == shape and self.k.dtype == dtype
                and self.k.device == torch.device(device)):
            self.k = torch.empty(shape, device=device, dtype=dtype)
            self.v = torch.empty(shape, device=device, dtype=dtype)
            self.pos = torch.empty(shape[:-1], device=device, dtype=torch.long)
            self.score = torch.empty(shape[:-1], device=device, dtype=torch.float32)
        self.pos.fill_(-1)
        self.score.zero_()

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def put(self, layer: int, slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor) -> None:
        """One token per (sequence, KV head) into slot[b, h] (int64 [B, Hkv], device): k, v
        [B, Hkv, 1, D], its absolute position [1]; its score starts at 0."""
        idx = slot.unsqueeze(-1)
        D = k.shape[-1]
        self.k[layer].scatter_(2, idx.unsqueeze(-1).expand(-1, -1, 1, D), k)
        self.v[layer].scatter_(2, idx.unsqueeze(-1).expand(-1, -1, 1, D), v)
        self.pos[layer].scatter_(2, idx, position.view(1, 1, 1).expand_as(idx))
        self.score[layer].scatter_(2, idx, 0.0)

    def keep(self, layer: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
             score: torch.Tensor) -> None:
        """Make slots 0..n-1 hold the candidates `index` [B, Hkv, n] of (k, v [B, Hkv, N, D],
        pos, score [B, Hkv, N]): the compaction after a prefill chunk."""
        n, D = index.shape[-1], k.shape[-1]
        rows = index.unsqueeze(-1).expand(-1, -1, -1, D)
        self.k[layer, :, :, :n] = k.gather(2, rows)
        self.v[layer, :, :, :n] = v.gather(2, rows)
        self.pos[layer, :, :, :n] = pos.gather(2, index)
        self.score[layer, :, :, :n] = score.gather(2, index)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"k": self.k, "v": self.v, "pos": self.pos, "score": self.score}
