"""StreamingLLM (mit-han-lab/streaming-llm): attention sinks + a window of recent tokens.

Reference behaviour (pos_shift/modify_llama.py, kv_cache.py): keys are cached BEFORE RoPE; at every
step all cached keys are re-rotated by their position inside the cache (arange(kv_len): sinks at
0..sink-1, then the kept recent tokens contiguously) and each query sits at its own in-cache
position. Nothing is ever attended outside sinks + window.

Options: see `StreamingConfig` (the budget, the "K" of the tables, is sink + window).

Storage: `SinkRingStore` (preallocated sink slots + ring, un-rotated keys, no per-step cat). A
decode step writes its token into the ring first and attends over all slots with a visibility
mask; a prefill chunk attends over the kept slots plus its own keys, then writes what stays.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError
from methods.base import Method, register
from methods.config import MethodConfig, option
from methods.stores import SinkRingStore

_HIDDEN = 1 << 40  # key position for slots a query must not see (mask: k_pos <= q_pos)


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
                "positions": "in-cache (keys stored un-rotated, re-rotated each step)", "dense_layers": 0}

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

    def buffers(self):
        return self.store.buffers()

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
        self.visible = (p >= 0) & ((p < S) | (p >= self.first_recent))
        self.slot_icp = self._icp(p)
        self.k_pos = torch.where(self.visible, self.slot_icp, _HIDDEN)
        self.q_icp = self._icp(pos)
        if step.phase != "decode":  # old view captured above; now note what this chunk leaves behind
            self.store.mark(self.slots, pos[self.offsets])
        # Tokens attended by the step's last query. In a decode step the visible slots are exactly the
        # filled ones, and slots fill in order: a prefix of that many slots, read by length.
        last = pos[-1:]
        self.lengths = (self._icp(last) + 1).to(torch.int32).expand(self.batch).contiguous()

    def _icp(self, p: torch.Tensor) -> torch.Tensor:
        """In-cache position: sinks keep theirs, kept recent tokens follow them contiguously."""
        return torch.where(p < self.sink, p, self.sink + p - self.first_recent)

    def attend(self, layer, q, k, v, rope):
        # rope.apply: cos/sin computed once per step (cached by positions tensor), one fused kernel
        # per rotation on CUDA (the whole ring is re-rotated every layer of every step).
        qr = rope.apply(q, self.q_icp)
        store, scale = self.store, self.info.scaling
        self.record(layer, self.lengths)
        if self.step.phase == "decode":
            store.write(layer, self.slots, k, v)
            keys = rope.apply(store.k[layer], self.slot_icp)
            out = kernels.decode_attention(qr[:, :, 0].contiguous(), keys, store.v[layer], self.lengths, scale,
                                           max_length=store.k.shape[3])
            return out.view(q.shape[0], 1, -1)
        # prefill chunk: kept slots (re-rotated) + the chunk's own keys, causal by in-cache position;
        # where() keeps whatever an empty slot holds (garbage, NaN) out of the arithmetic.
        vis = self.visible.view(1, 1, -1, 1)
        old = torch.where(vis, rope.apply(store.k[layer], self.slot_icp), 0)
        new = rope.apply(k, self.q_icp)
        values = torch.cat([torch.where(vis, store.v[layer], 0), v], 2)
        out = kernels.prefill_attention(qr, torch.cat([old, new], 2), values, scale, q_pos=self.q_icp,
                                        k_pos=torch.cat([self.k_pos, self.q_icp]))
        store.write(layer, self.slots, k[:, :, self.offsets], v[:, :, self.offsets])
        return out
