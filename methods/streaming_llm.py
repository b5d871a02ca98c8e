"""StreamingLLM (mit-han-lab/streaming-llm): attention sinks + a window of recent tokens.

Reference behaviour (pos_shift/modify_llama.py, kv_cache.py): keys are cached BEFORE RoPE; at every
step all cached keys are re-rotated by their position inside the cache (arange(kv_len): sinks at
0..sink-1, then the kept recent tokens contiguously) and each query sits at its own in-cache
position. Nothing is ever attended outside sinks + window.

Same scores, less work: RoPE scores depend only on the query-key distance, and the kept recent
tokens are the last ones of the sequence, contiguous, so their in-cache distance to the query equals
their absolute one. Recent keys are therefore rotated ONCE, at their absolute position, when they are
written; the query sits at its absolute position; only the sinks, whose in-cache distance is not
their absolute one, are re-rotated every step (from an un-rotated copy), at j + (first kept recent
position - sink). Re-rotating the whole ring in every layer of every step, as the reference does,
was an extra pass over the cache: 1.67x full attention at a 32K cache on the H100. Angles are formed
in float64 (`Rope.apply(precise=True)`): float32 angles at absolute positions near 1M would err by
up to 0.03 rad where the reference's in-cache positions stay small.

Options: see `StreamingConfig` (the budget, the "K" of the tables, is sink + window).

Storage: `SinkRingStore` (preallocated sink slots + ring, no per-step cat) and `sink_k`, the sinks'
un-rotated keys. A decode step writes its token into the ring first and attends over the filled
slots (a prefix, read by length); a prefill chunk attends over the kept slots, gathered, plus its own
keys (plain causal attention, no mask), then writes what stays.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError
from methods.base import Method, register
from methods.config import MethodConfig, option
from methods.parts.stores import SinkRingStore


@dataclass(frozen=True)
class StreamingConfig(MethodConfig):
    """StreamingLLM (mit-han-lab/streaming-llm): attention sinks + recent window, keys cached before RoPE
    and re-rotated by their in-cache position every step. Defaults: run_streaming_llama.py's 4 + 2000."""

    sink: int = option(4, "first tokens kept forever (eval_long_ppl.py uses 1 + 255)", min=0)
    window: int = option(2000, "most recent tokens kept", min=1)
    budget: int | None = option(None, "if set: total kept = budget, i.e. window = budget - sink")
    window_includes_current: bool = option(False, "false: a step attends sink + window older tokens + itself "
                                           "(eval_long_ppl.py); true: the window counts the new tokens "
                                           "(StartRecentKVCache.evict_for_space)")
    prefill: str = option("stream", "stream: prompt in chunks of `stride` through the bounded cache; dense: one "
                          "dense prefill, then eviction to sink + window", choices=("stream", "dense"))
    stride: int | None = option(None, "chunk length of the streamed prefill (null = window)", min=1)

    @property
    def effective_window(self) -> int:
        return self.budget - self.sink if self.budget is not None else self.window

    def check(self, info):
        if self.effective_window < 1:
            raise ConfigError(f"method.budget={self.budget} must exceed sink={self.sink} (window would be "
                              f"{self.effective_window})")
        if self.window_includes_current and self.prefill == "stream" and (self.stride or 0) > self.effective_window:
            raise ConfigError(f"method.stride={self.stride} exceeds window={self.effective_window}: with "
                              f"window_includes_current a chunk must fit in the window")

    def describe(self):
        return {"window_effective": self.effective_window, "budget_total": self.sink + self.effective_window,
                "prefill_stride": (self.stride or self.effective_window) if self.prefill == "stream" else None,
                "budget_unit": "tokens kept per KV head (sink + window), same set for every head and layer",
                "current_token": "inside the window" if self.window_includes_current else "on top of the window",
                "positions": "in-cache (as distances: recent keys rotated once at absolute positions, sinks "
                              "re-rotated each step; float64 angles)", "dense_layers": 0}

    @classmethod
    def variants(cls):
        return [{"sink": 2, "window": 12, "stride": 8},
                {"sink": 4, "window": 10, "prefill": "dense", "window_includes_current": True},
                {"sink": 0, "budget": 9, "stride": 5, "window_includes_current": True}]

    def max_context(self, info):
        return None  # bounded cache, in-cache positions: any length reads through sink + window

    def full_equivalent(self, context):
        return {"budget": None, "window": max(self.effective_window, context)}


@register
class StreamingLLM(Method):
    name = "streaming_llm"
    Config = StreamingConfig
    graph_safe = True  # decode: slot, visibility and lengths from the device position
    decode_idempotent = True  # a step writes its own slot and marks it with its own position

    def __init__(self, cfg):
        super().__init__(cfg)
        c = self.cfg
        self.sink, self.window = c.sink, c.effective_window
        # false: W older tokens + the current one must be kept across a decode step -> W + 1 slots.
        self.ring = self.window if c.window_includes_current else self.window + 1

    @property
    def prefill_chunk(self):
        return (self.cfg.stride or self.window) if self.cfg.prefill == "stream" else None

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.batch = batch
        self.store = getattr(self, "store", None) or SinkRingStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, self.sink, self.ring, info.head_dim,
                            device, dtype)
        # un-rotated keys of the sinks, re-rotated into the store's sink slots every step
        shape = (info.num_layers, batch, info.num_kv_heads, self.sink, info.head_dim)
        old = getattr(self, "sink_k", None)
        if not (old is not None and old.shape == shape and old.dtype == dtype and old.device == torch.device(device)):
            self.sink_k = torch.zeros(shape, device=device, dtype=dtype)

    def buffers(self):
        return {**self.store.buffers(), "sink_k": self.sink_k}

    # --- per step: which slots are visible and at which in-cache positions ------------------------
    def begin(self, step):
        super().begin(step)
        S, T = self.sink, step.length
        kept_old = max(self.window - T, 0) if self.cfg.window_includes_current else self.window
        pos = step.positions
        if step.phase == "decode":
            # From the device position alone (no host int: the step can be captured in a CUDA graph).
            # Write-then-attend: the new token's slot is part of the view.
            self.first_recent = torch.clamp(pos - kept_old, min=S)  # oldest non-sink token still visible
            self.slots, self.offsets = self.store._slot_of(pos), None
            self.store.mark(self.slots, pos)
        else:
            a = step.start
            self.first_recent = max(S, a - kept_old)
            self.slots, self.offsets = self.store.slots(a, a + T)
        p = self.store.slot_pos
        if step.phase != "decode":
            # Every kept slot precedes the whole chunk: gathered, they are visible to all its queries, and
            # [kept | chunk] is plain (lower-right) causal attention, SDPA's fused path without a mask. A
            # [T, sink + ring + T] position mask over every slot, empty ones included, made this prefill
            # 1.4x full attention's at 4K on the CPU. One host sync per prefill chunk.
            self.kept = ((p >= 0) & ((p < S) | (p >= self.first_recent))).nonzero().squeeze(1)
        else:
            self.kept = None  # prefill-only: nothing a captured decode step does not declare outlives it
        # Sink j sits at in-cache distance icp(q) - j from a query at absolute position q, i.e. at
        # rotation position j + (q - icp(q)) = j + first_recent - sink (the same for every query of a step).
        self.sink_pos = torch.arange(S, device=p.device) + (self.first_recent - S)
        if step.phase == "decode":
            self.new_sink = (pos < S).view(1, 1, -1, 1)       # a short prompt: decode still writes sinks
            self.sink_slot = torch.clamp(pos, max=max(S - 1, 0))
        else:
            self.store.mark(self.slots, pos[self.offsets])    # old view captured above
            self.n_new_sinks = max(0, min(a + T, S) - a)       # slots() lists sink positions first
        # Tokens attended by the step's last query. In a decode step the visible slots are exactly the
        # filled ones, and slots fill in order: a prefix of that many slots, read by length.
        last = pos[-1:]
        self.lengths = (self._icp(last) + 1).to(torch.int32).expand(self.batch).contiguous()

    def _icp(self, p: torch.Tensor) -> torch.Tensor:
        """In-cache position: sinks keep theirs, kept recent tokens follow them contiguously."""
        return torch.where(p < self.sink, p, self.sink + p - self.first_recent)

    def _refresh_sinks(self, layer, rope) -> None:
        """The store's sink slots := the sinks rotated for this step (S keys, not the ring)."""
        if self.sink:
            self.store.k[layer][:, :, :self.sink] = rope.apply(self.sink_k[layer], self.sink_pos, precise=True)

    def attend(self, layer, q, k, v, rope):
        pos, store, scale, S = self.step.positions, self.store, self.info.scaling, self.sink
        qr = rope.apply(q, pos, precise=True)
        kr = rope.apply(k, pos, precise=True)
        self.record(layer, self.lengths)
        if self.step.phase == "decode":
            store.write(layer, self.slots, kr, v)
            if S:
                sk = self.sink_k[layer]
                sk.index_copy_(2, self.sink_slot, torch.where(self.new_sink, k, sk.index_select(2, self.sink_slot)))
            self._refresh_sinks(layer, rope)
            out = kernels.decode_attention(qr[:, :, 0].contiguous(), store.k[layer], store.v[layer], self.lengths,
                                           scale, max_length=store.k.shape[3])
            return out.view(q.shape[0], 1, -1)
        # prefill chunk: the kept slots (gathered: no empty slot's garbage enters) + the chunk's own keys,
        # causal among themselves. Scores depend on distances only, so order inside the kept set is free.
        self._refresh_sinks(layer, rope)
        keys = torch.cat([store.k[layer].index_select(2, self.kept), kr], 2)
        values = torch.cat([store.v[layer].index_select(2, self.kept), v], 2)
        out = kernels.prefill_attention(qr, keys, values, scale)
        store.write(layer, self.slots, kr[:, :, self.offsets], v[:, :, self.offsets])
        if self.n_new_sinks:
            self.sink_k[layer][:, :, self.slots[:self.n_new_sinks]] = k[:, :, self.offsets[:self.n_new_sinks]]
        return out
