"""InfLLM / Ltri-LLM's context memory with every block on the device (offload=false): the decode step
without a host sync, in static shapes, so that the engine can capture it in a CUDA graph.

The host path (offload=true) copies the retrieved blocks into a contiguous buffer on the host's say-so
(InfLLM's _arrange). Here nothing moves: the raw (un-rotated) key and value of every token stays in a
store at its absolute position (`PositionalStore`), and the memory part of the attention reads
[sinks | retrieved blocks | remainder] through token indices into that store (kernels.lse.
sparse_decode_tokens_lse). Which keys are attended is the host path's; only their order inside the
memory softmax differs (blocks in block order instead of buffer-slot order): float rounding only.

`Geometry` is the memory layout of a step (sinks, formed blocks, remainder) from the step's first
position: host ints in a prefill chunk, device tensors in a decode step (the CUDA-graph case). A
decode step's local window is indexed newest first (index j = distance j), so its valid entries form
the prefix the sparse kernel reads and the last block_size of them sit at fixed columns.

`PendingMass` makes the decode step idempotent at a position (the engine then warms a graph up without
saving the method's buffers, which at 128K would be a 16 GiB copy): a step does not add its local
attention mass to the ring's scores; it leaves it (and its position) pending, and the next step at a
LATER position folds it in first. The block that leaves the window after a step never needs that
step's own mass (its last token is out of that query's window), so representatives are the host path's.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.memory_index import memory_positions
from kernels.memory_stage import scatter_rows
from kernels.memory_write import fold_ref
from kernels.topk import topk_positions


def _same(t, shape, dtype, device) -> bool:
    return t is not None and t.shape == shape and t.dtype == dtype and t.device == torch.device(device)


def reuse(t, shape, dtype, device) -> torch.Tensor:
    """t when it already has this shape, dtype and device (a captured graph keeps pointing at it), else new."""
    return t if _same(t, shape, dtype, device) else torch.empty(shape, device=device, dtype=dtype)


class PositionalStore:
    """Un-rotated keys and values of every token at its absolute position: [L, B, Hkv, capacity, D]. On the
    device (offload=false), or in host memory (offload=true): pinned on CUDA, where kernels/memory_stage.py
    writes the step's rows into it, and methods/parts/infllm_stage.py gathers a step's memory out of it,
    through unified addressing (no host sync; CUDA-graph captured); a plain CPU tensor on the CPU. On the
    meta device (a probe of the device storage a method declares) the host store is declared with 0 rows."""

    def __init__(self):
        self.k = self.v = None
        self.host = False
        self.pinned = None       # how the host store was pinned: "cudaHostRegister" or "pin_memory"
        self._registered = None  # (tensor, pointer) registered with cudaHostRegister, unregistered on reallocation

    def allocate(self, layers, batch, kv_heads, capacity, head_dim, device, dtype, *, host: bool = False) -> None:
        device = torch.device(device)
        shape = (layers, batch, kv_heads, max(1, capacity), head_dim)
        where = torch.device("cpu") if host and device.type != "meta" else device
        if host and device.type == "meta":   # a probe of device storage (runners/plan.py): none of it is
            shape = (layers, batch, kv_heads, 0, head_dim)
        if _same(self.k, shape, dtype, where) and self.host == host:
            return
        self.release()
        self.host = host
        if host and device.type == "cuda":
            both = _pinned((2, *shape), dtype, self)
        else:
            both = torch.empty((2, *shape), device=where, dtype=dtype)
        self.k, self.v = both[0], both[1]

    def release(self) -> None:
        self.k = self.v = None
        if self._registered is not None:
            torch.cuda.cudart().cudaHostUnregister(self._registered[1])
            self._registered = None

    def __del__(self):   # unregistered before the memory is freed (a later registration could overlap it)
        if getattr(self, "_registered", None) is not None and torch.cuda.is_initialized():
            self.release()

    def write(self, layer, positions, k, v) -> None:
        if self.host:
            scatter_rows(self.k[layer], self.v[layer], positions, k, v)
        else:
            self.k[layer].index_copy_(2, positions, k)
            self.v[layer].index_copy_(2, positions, v)

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"store_k": self.k, "store_v": self.v}

    def device_bytes(self) -> int:
        return 0 if self.host else sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None) if self.host else 0


def _pinned(shape, dtype, store: PositionalStore) -> torch.Tensor:
    """A CPU tensor in page-locked memory of exactly its size: torch's pinned allocator rounds a request up
    to a power of two (a 16.1 GiB store would pin 32 GiB), so the memory is registered with
    cudaHostRegister (portable | mapped) instead; pin_memory=True where that call fails (recorded)."""
    with torch.inference_mode(False):
        t = torch.empty(shape, dtype=dtype)
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 3)
        if int(err) == 0:
            store._registered, store.pinned = (t, t.data_ptr()), "cudaHostRegister"
            return t
        store.pinned = f"pin_memory (cudaHostRegister: error {int(err)})"
        return torch.empty(shape, dtype=dtype, pin_memory=True)


class Geometry(NamedTuple):
    """The memory of one step: init_len sinks, n_blocks formed blocks, the remainder [rem_start,
    rem_start + rem_len). Ints (prefill) or int64 [1] device tensors (decode). A tuple: a model split over
    GPUs hands its tensors on to the next GPU (runners/pipeline.py moves tuples, not other classes)."""

    init_len: object
    n_blocks: object
    rem_start: object
    rem_len: object

    @classmethod
    def of(cls, a, T: int, n_init: int, n_local: int, block_size: int) -> Geometry:
        """`a`: the step's first position, an int or a device tensor; the same formulas either way."""
        if isinstance(a, int):
            init_len = min(n_init, max(0, a - n_local))
            nb = max(0, a - n_local - n_init) // block_size
            rem_start = init_len + nb * block_size
            return cls(init_len, nb, rem_start, max(a - rem_start + T - n_local, 0))
        init_len = (a - n_local).clamp(0, n_init)
        nb = (a - n_local - n_init).clamp(min=0) // block_size
        rem_start = init_len + nb * block_size
        return cls(init_len, nb, rem_start, (a - rem_start + T - n_local).clamp(min=0))


def staged(geo: Geometry, cfg) -> tuple[int, int]:
    """(rows, blocks) the memory of a step of geometry `geo` (host ints) holds per layer, sequence, KV head."""
    nsel = min(geo.n_blocks, cfg.topk)
    return geo.init_len + nsel * cfg.block_size + geo.rem_len, nsel


class MemoryLayout:
    """Token positions of the memory per (sequence, KV head): [sinks | retrieved blocks | remainder], for one
    step's geometry. `index` adds a layer's blocks: one kernel (kernels/memory_index.py) in the decode step;
    the layout itself holds no tensor of its own (nothing per step to build or to hand between GPUs)."""

    def __init__(self, geo: Geometry, n_init: int, block_size: int, width: int, kv_heads: int, capacity: int,
                 device=None):
        self.geo, self.n_init, self.bs, self.kv_heads, self.capacity = geo, n_init, block_size, kv_heads, capacity
        self.width = width

    def index(self, ids: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids int [B, U, k] (the first `counts` [B, U] valid; U = 1, shared by the layer's heads, or Hkv)
        -> (positions int32 [B, Hkv, width], counts int32 [B, Hkv]). Columns past a count hold positions
        that are never read (clamped into the store)."""
        g = self.geo
        return memory_positions(ids, counts, g.init_len, g.rem_start, g.rem_len, self.n_init, self.bs, self.width,
                                self.kv_heads, self.capacity)


def memory_index(geo: Geometry, ids: torch.Tensor, counts: torch.Tensor, n_init: int, block_size: int,
                 width: int, kv_heads: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MemoryLayout(...).index(ids, counts) in one call."""
    return MemoryLayout(geo, n_init, block_size, width, kv_heads, capacity, ids.device).index(ids, counts)


def select_blocks(qm: torch.Tensor, reprs: torch.Tensor, n_blocks, units: int, topk: int, live=None):
    """InfLLM's retrieval on the device: qm [B, Hq, D] fp32 chunk-mean memory query, reprs [B, N, Hq, D]
    (N = the run's block capacity); blocks at or past n_blocks (int or [1] tensor) never chosen. Returns
    (ids int32 [B, units, min(topk, N)] in block order, counts int32 [B, units] = min(topk, n_blocks)):
    the top-k of <qm, repr> summed over each unit's heads, ties to the lower block (selection.top_first's
    set). live: live_blocks(N, n_blocks) when the caller made it (once per decode step, not per layer)."""
    B, N, Hq, D = reprs.shape
    if units == 1:   # one GEMV over the concatenated heads (no permuted copy of the index)
        s = torch.bmm(reprs.float().view(B, N, Hq * D), qm.reshape(B, Hq * D, 1)).view(B, 1, N)
    else:
        s = torch.einsum("bhd,bnhd->bhn", qm, reprs.float()).unflatten(1, (units, -1)).sum(2)   # [B, units, N]
    # a where, not an added -inf: an unformed block's index row is uninitialised (NaN + -inf is NaN)
    s = torch.where(live if live is not None else live_blocks(N, n_blocks, s.device), s, float("-inf"))
    return topk_positions(s, None, topk, impl="radix" if s.is_cuda else "auto")


def live_blocks(N: int, n_blocks, device) -> torch.Tensor:
    """bool [N]: the formed blocks (below n_blocks, an int or [1]); a decode step makes it once, not per layer."""
    return torch.arange(N, device=device) < n_blocks


class PendingMass:
    """A decode step's local attention mass, folded into the ring's scores by the next later step."""

    def __init__(self):
        self.mass = self.pos = None
        # host flag: a decode step held a mass since the last prefill chunk cleared them (conservative: a graph
        # replay holds without Python, but its capture set it); a prefill chunk folds and clears only then
        self.held = False

    def allocate(self, layers, batch, q_heads, n_local, device) -> None:
        shape = (layers, batch, q_heads, n_local)
        if not _same(self.mass, shape, torch.float32, device):
            self.mass = torch.empty(shape, device=device, dtype=torch.float32)
            self.pos = torch.empty(layers, 1, device=device, dtype=torch.long)
        self.pos.fill_(-1)
        self.held = False

    def prepare(self, a) -> torch.Tensor:
        """At the start of a step whose first position is `a` (int or [1]): the pending masses' position [1]
        if they are due (from a position before `a`), else -1. Every layer holds (or clears) at the same step,
        so layer 0's position is every layer's. Step state: the method keeps it (a model split over GPUs
        hands the method's attributes to the next GPU's instance, not its storage objects' own)."""
        p = self.pos[0]
        return torch.where((p >= 0) & (p < a), p, -1)

    def fold(self, layer: int, score: torch.Tensor, due_pos: torch.Tensor) -> None:
        """score [B, Hq, R] += the pending mass of `layer` if it is due (a decode step: kernels/memory_write.py
        does this in its one launch)."""
        fold_ref(score, self.mass[layer], due_pos, score.shape[-1])

    def clear(self, layer: int) -> None:
        """Called by every layer of a prefill chunk; a no-op while nothing was held."""
        if self.held:
            self.pos[layer].fill_(-1)
            if layer == self.pos.shape[0] - 1:
                self.held = False

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"pending_mass": self.mass, "pending_pos": self.pos}
