"""Storage of InfLLM-style context memory (InfLLM, Ltri-LLM): a ring of the most recent tokens, and
evicted tokens in blocks kept in host memory behind a GPU-resident LRU cache.

WindowRing    per layer, the last R tokens (slot = position % R): un-rotated keys (what the memory
              stores), keys rotated at their absolute position (what the local window attends), values,
              and per query head the local-window attention each token has received (fp32).
BlockMemory   evicted blocks of `block_size` tokens. offload=True (InfLLM): every block lives in the host
              tier (pinned when the device is CUDA; grown in chunks as blocks form), and at most `budget`
              blocks per (layer, sequence) are resident in a device cache, evicted least recently used
              exactly as InfLLM's ContextManager does (remove_lru_blocks, cache_strategy "lru": a retrieval
              stamps its blocks with one counter value; ties go in first-cached order). offload=False:
              every block stays in a device tensor preallocated for the run (no transfers).
              `transfers` counts host->device block loads, `stores` device->host block writes.

Host-side bookkeeping (which block sits in which cache slot, LRU stamps) is plain Python: InfLLM syncs
the retrieval result to the host every step, and so does the host path here (not CUDA-graph safe), which
only the evidence options take now. The device path does not use BlockMemory's blocks: every token stays
in a positional store (on the GPU, or in pinned host memory with offload) and retrieval runs on the
device (methods/parts/infllm_device.py, infllm_stage.py; CUDA-graph captured).
"""
from __future__ import annotations

import torch


def _same(t: torch.Tensor | None, shape, dtype, device) -> bool:
    return t is not None and t.shape == shape and t.dtype == dtype and t.device == torch.device(device)


class WindowRing:
    def __init__(self):
        self.k_raw = self.k_rot = self.v = self.score = None
        self.size = 0

    def allocate(self, layers, batch, kv_heads, q_heads, size, head_dim, device, dtype) -> None:
        self.size = int(size)
        shape = (layers, batch, kv_heads, self.size, head_dim)
        if not _same(self.k_raw, shape, dtype, device):
            self.k_raw = torch.empty(shape, device=device, dtype=dtype)
            self.k_rot = torch.empty(shape, device=device, dtype=dtype)
            self.v = torch.empty(shape, device=device, dtype=dtype)
            self.score = torch.empty((layers, batch, q_heads, self.size), device=device, dtype=torch.float32)

    def slots(self, start: int, end: int) -> torch.Tensor:
        """Slots of absolute positions start..end-1 (int64, on the device)."""
        return torch.arange(start, end, device=self.k_raw.device) % self.size

    def write(self, layer, slots, k_raw, k_rot, v) -> None:
        """New tokens [B, Hkv, T, D] into `slots` [T]; their accumulated scores start at 0."""
        self.k_raw[layer].index_copy_(2, slots, k_raw)
        self.k_rot[layer].index_copy_(2, slots, k_rot)
        self.v[layer].index_copy_(2, slots, v)
        self.score[layer].index_fill_(2, slots, 0.0)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"ring_k_raw": self.k_raw, "ring_k_rot": self.k_rot, "ring_v": self.v, "ring_score": self.score}


class BlockMemory:
    def __init__(self):
        self.cache_k = self.cache_v = None
        self.host_k: list[torch.Tensor] = []
        self.host_v: list[torch.Tensor] = []
        self.transfers = self.stores = 0

    def allocate(self, layers, batch, kv_heads, block_size, head_dim, max_blocks, *, offload: bool,
                 budget: int, device, dtype, pin: bool = True, host_chunk: int = 64) -> None:
        """Storage for up to `max_blocks` blocks per (layer, sequence). With offload the device holds
        `budget` blocks per (layer, sequence); the host tier grows by `host_chunk` blocks at a time and
        is kept (reused) across samples."""
        self.layers, self.batch, self.offload = layers, batch, offload
        self.block_size, self.max_blocks = block_size, max(1, max_blocks)
        self.capacity = min(budget, self.max_blocks) if offload else self.max_blocks
        shape = (layers, batch, self.capacity, kv_heads, block_size, head_dim)
        if not _same(self.cache_k, shape, dtype, device):
            self.cache_k = torch.empty(shape, device=device, dtype=dtype)
            self.cache_v = torch.empty(shape, device=device, dtype=dtype)
        host_shape = (layers, batch, host_chunk, kv_heads, block_size, head_dim)
        if self.host_k and (self.host_k[0].shape != host_shape or self.host_k[0].dtype != dtype):
            self.host_k, self.host_v = [], []
        self.host_shape, self.device, self.dtype = host_shape, torch.device(device), dtype
        self.pin = pin and self.device.type == "cuda"
        self.n_blocks = 0
        # per (layer, sequence): block id -> cache slot, LRU stamps (insertion order = first cached)
        self.slot_of = [[{} for _ in range(batch)] for _ in range(layers)]
        self.stamp = [[{} for _ in range(batch)] for _ in range(layers)]
        self.free = [[list(range(self.capacity)) for _ in range(batch)] for _ in range(layers)]
        self.counter = [0] * layers
        self.transfers = self.stores = 0

    # --- writing blocks ------------------------------------------------------------------------
    def _host(self, block: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        chunk, off = divmod(block, self.host_shape[2])
        while len(self.host_k) <= chunk:
            with torch.inference_mode(False):  # grown inside a step: a normal tensor, reusable later
                self.host_k.append(torch.empty(self.host_shape, dtype=self.dtype, pin_memory=self.pin))
                self.host_v.append(torch.empty(self.host_shape, dtype=self.dtype, pin_memory=self.pin))
        return self.host_k[chunk], self.host_v[chunk], off

    def put(self, layer: int, block: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Block `block` of every sequence: k, v [B, Hkv, block_size, D] (un-rotated). Blocks are put in
        order 0, 1, 2, ... (the same for every layer)."""
        if self.offload:
            hk, hv, off = self._host(block)
            hk[layer, :, off].copy_(k, non_blocking=self.pin)
            hv[layer, :, off].copy_(v, non_blocking=self.pin)
            self.stores += 1
        else:
            self.cache_k[layer, :, block].copy_(k)
            self.cache_v[layer, :, block].copy_(v)
        self.n_blocks = max(self.n_blocks, block + 1)

    # --- the cache -----------------------------------------------------------------------------
    def resident(self, layer: int, b: int) -> list[int]:
        """Blocks resident on the device for (layer, sequence), least recently used first."""
        if not self.offload:
            return list(range(self.n_blocks))
        st = self.stamp[layer][b]
        return [blk for blk, _ in sorted(st.items(), key=lambda kv: kv[1])]

    def ensure(self, layer: int, b: int, blocks: list[int]) -> dict[int, int]:
        """Make `blocks` resident for (layer, sequence b) and return {block: cache slot}. InfLLM's
        order: evict (LRU first, never one of `blocks`) as many as needed to fit the missing ones, then
        stamp `blocks` with a new counter value (first-time blocks join in the given order), then load
        the missing ones from the host tier."""
        if not self.offload:
            return {blk: blk for blk in blocks}
        slot_of, stamp, free = self.slot_of[layer][b], self.stamp[layer][b], self.free[layer][b]
        missing = [blk for blk in dict.fromkeys(blocks) if blk not in slot_of]
        need = len(stamp) - self.capacity + len(missing)
        if need > 0:
            wanted = set(blocks)
            for blk in [x for x, _ in sorted(stamp.items(), key=lambda kv: kv[1]) if x not in wanted][:need]:
                free.append(slot_of.pop(blk))
                del stamp[blk]
        if len(missing) > len(free):
            raise RuntimeError(f"{len(set(blocks))} blocks wanted at once but the device cache holds {self.capacity}")
        self.counter[layer] += 1
        for blk in dict.fromkeys(blocks):
            stamp[blk] = self.counter[layer]
        for blk in missing:
            slot = free.pop()
            hk, hv, off = self._host(blk)
            self.cache_k[layer, b, slot].copy_(hk[layer, b, off], non_blocking=self.pin)
            self.cache_v[layer, b, slot].copy_(hv[layer, b, off], non_blocking=self.pin)
            slot_of[blk] = slot
            self.transfers += 1
        return {blk: slot_of[blk] for blk in blocks}

    def buffers(self) -> dict[str, torch.Tensor]:
        out = {"cache_k": self.cache_k, "cache_v": self.cache_v}
        for i, (hk, hv) in enumerate(zip(self.host_k, self.host_v)):
            out[f"host_k{i}"], out[f"host_v{i}"] = hk, hv
        return out

    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.cache_k, self.cache_v) if t is not None)

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host_k + self.host_v)


class IndexVectors:
    """Ltri-LLM's span index vectors, per indexing layer and sequence: a pool vec [B, cap, dim] (model
    dtype) with the span of each vector, span_of [B, cap], and the block of each span, span_block
    [B, cap_spans]; the counts live on the host. A pool grows by an eighth (at least 256 rows) when full
    and is kept across samples, so the device memory it holds follows what it stores (ltri.table4 measures
    it) instead of a worst-case preallocation."""

    def __init__(self):
        self.vec: dict[int, torch.Tensor] = {}
        self.span_of: dict[int, torch.Tensor] = {}
        self.span_block: dict[int, torch.Tensor] = {}

    def allocate(self, dims: dict[int, int], batch: int, device, dtype) -> None:
        """`dims`: indexing layer -> vector dimension."""
        for layer in list(self.vec):
            v = self.vec[layer]
            if layer not in dims or v.shape[0] != batch or v.shape[2] != dims[layer] or v.dtype != dtype \
                    or v.device != torch.device(device):
                del self.vec[layer], self.span_of[layer], self.span_block[layer]
        self.dims, self.batch, self.device, self.dtype = dict(dims), batch, torch.device(device), dtype
        self.count = {layer: [0] * batch for layer in dims}
        self.spans = {layer: [0] * batch for layer in dims}

    @staticmethod
    def _next_cap(cap: int, rows: int) -> int:
        return cap if rows <= cap else max(rows, cap + max(256, cap // 8))

    @staticmethod
    def _resized(t: torch.Tensor | None, new_cap: int, shape_tail, dtype, device) -> torch.Tensor:
        cap = 0 if t is None else t.shape[1]
        if new_cap <= cap:
            return t
        with torch.inference_mode(False):
            new = torch.empty((shape_tail[0], new_cap, *shape_tail[1:]), dtype=dtype, device=device)
        if t is not None:
            new[:, :cap] = t
        return new

    @classmethod
    def _grown(cls, t: torch.Tensor | None, rows: int, shape_tail, dtype, device) -> torch.Tensor:
        return cls._resized(t, cls._next_cap(0 if t is None else t.shape[1], rows), shape_tail, dtype, device)

    def add(self, layer: int, b: int, block: int, vectors: torch.Tensor, span_local: torch.Tensor,
            n_spans: int) -> None:
        """Vectors [n, dim] of block `block`, belonging to its spans 0..n_spans-1 (span_local [n])."""
        n0, s0 = self.count[layer][b], self.spans[layer][b]
        n, dim = vectors.shape
        B = self.batch
        self.vec[layer] = self._grown(self.vec.get(layer), n0 + n, (B, dim), self.dtype, self.device)
        self.span_of[layer] = self._grown(self.span_of.get(layer), n0 + n, (B,), torch.long, self.device)
        self.span_block[layer] = self._grown(self.span_block.get(layer), s0 + n_spans, (B,), torch.long, self.device)
        self.vec[layer][b, n0:n0 + n] = vectors.to(self.dtype)
        self.span_of[layer][b, n0:n0 + n] = span_local.to(self.device) + s0
        self.span_block[layer][b, s0:s0 + n_spans] = block
        self.count[layer][b] += n
        self.spans[layer][b] += n_spans

    def add_rows(self, layer: int, vectors: torch.Tensor, span: torch.Tensor, span_block: torch.Tensor,
                 sizes: list[int], n_spans: list[int], n: int) -> None:
        """n blocks of every sequence at once, as n x B `add` calls (block-major) would store them: maps m = b n + j
        (sequence b, its j-th block) with sizes[m] vectors and n_spans[m] spans; vectors [sum sizes, dim] and
        span [sum sizes] (each vector's span, numbered over all maps in order) flat in map order, span_block
        [sum n_spans] the block of each span. The pools grow to the capacities those calls would reach (the
        same device_bytes), then one copy per sequence and pool."""
        B, dim = self.batch, vectors.shape[1]
        cnt, sp = list(self.count[layer]), list(self.spans[layer])
        cap_v = 0 if self.vec.get(layer) is None else self.vec[layer].shape[1]
        cap_s = 0 if self.span_block.get(layer) is None else self.span_block[layer].shape[1]
        for j in range(n):
            for b in range(B):
                cnt[b] += sizes[b * n + j]
                sp[b] += n_spans[b * n + j]
                cap_v, cap_s = self._next_cap(cap_v, cnt[b]), self._next_cap(cap_s, sp[b])
        self.vec[layer] = self._resized(self.vec.get(layer), cap_v, (B, dim), self.dtype, self.device)
        self.span_of[layer] = self._resized(self.span_of.get(layer), cap_v, (B,), torch.long, self.device)
        self.span_block[layer] = self._resized(self.span_block.get(layer), cap_s, (B,), torch.long, self.device)
        at = as_ = 0
        for b in range(B):
            k, s = sum(sizes[b * n:(b + 1) * n]), sum(n_spans[b * n:(b + 1) * n])
            n0, s0 = self.count[layer][b], self.spans[layer][b]
            self.vec[layer][b, n0:n0 + k] = vectors[at:at + k].to(self.dtype)
            self.span_of[layer][b, n0:n0 + k] = span[at:at + k] + (s0 - as_)
            self.span_block[layer][b, s0:s0 + s] = span_block[as_:as_ + s]
            self.count[layer][b], self.spans[layer][b] = n0 + k, s0 + s
            at, as_ = at + k, as_ + s

    def view(self, layer: int, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, s = self.count[layer][b], self.spans[layer][b]
        return self.vec[layer][b, :n], self.span_of[layer][b, :n], self.span_block[layer][b, :s]

    def buffers(self) -> dict[str, torch.Tensor]:
        out = {}
        for layer in self.vec:
            out[f"index_vec{layer}"] = self.vec[layer]
            out[f"index_span_of{layer}"] = self.span_of[layer]
            out[f"index_span_block{layer}"] = self.span_block[layer]
        return out

    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.vec, self.span_of, self.span_block)
                   for t in d.values() if t.device.type != "cpu" or self.device.type == "cpu")
