"""StreamingLLM (mit-han-lab/streaming-llm): attention sinks + a window of recent tokens.

Reference behaviour (pos_shift/modify_llama.py, kv_cache.py): keys are cached BEFORE RoPE; at every
step all cached keys are re-rotated by their position inside the cache (arange(kv_len): sinks at
0..sink-1, then the kept recent tokens contiguously) and each query sits at its own in-cache
position. Nothing is ever attended outside sinks + window.

Options (all recorded by `semantics`):
  sink, window       first tokens kept forever, most recent tokens kept.
  budget             if set, window = budget - sink (total tokens kept; the tables' "K").
  window_includes_current
      false (eval_long_ppl.py: evict after each forward to sink+window, then the next token is
            appended): a step of T new tokens attends sink + window older tokens + itself.
      true  (StartRecentKVCache.evict_for_space before the new tokens, run_streaming_llama.py): the
            cache including the T new tokens never exceeds sink + window.
  prefill            stream: the prompt goes through the bounded cache in chunks of `stride`
                     (each chunk attends to what is kept + itself, causally); dense: one dense
                     prefill over the whole prompt, then eviction to sinks + window.
  stride             chunk length of the streamed prefill (null = window).

Storage: `SinkRingStore` (preallocated sink slots + ring, un-rotated keys, no per-step cat). A
decode step writes its token into the ring first and attends over all slots with a visibility
mask; a prefill chunk attends over the kept slots plus its own keys, then writes what stays.
"""
from __future__ import annotations

import torch

from methods import attention
from methods.base import Method, register
from methods.rope import rotate_half
from methods.stores import SinkRingStore
from common.errors import ConfigError

_HIDDEN = 1 << 40  # key position for slots a query must not see (mask: k_pos <= q_pos)


@register
class StreamingLLM(Method):
    name = "streaming_llm"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.sink, self.window = _sink_window(cfg)
        self.includes_current = bool(cfg.get("window_includes_current", False))
        self.mode = str(cfg.get("prefill", "stream"))
        self.stride = int(cfg.get("stride") or self.window)
        self.prefill_chunk = self.stride if self.mode == "stream" else None
        # false: W older tokens + the current one must be kept across a decode step -> W + 1 slots.
        self.ring = self.window if self.includes_current else self.window + 1

    @classmethod
    def validate(cls, cfg, info):
        sink, window = _sink_window(cfg)
        if sink < 0:
            raise ConfigError(f"method.sink must be >= 0, got {sink}")
        if window < 1:
            raise ConfigError(f"method.window must be >= 1 (budget must exceed sink), got window={window}")
        if cfg.get("prefill", "stream") not in ("stream", "dense"):
            raise ConfigError(f"method.prefill must be stream or dense, got {cfg.get('prefill')!r}")
        stride = cfg.get("stride")
        if stride is not None and int(stride) < 1:
            raise ConfigError(f"method.stride must be a positive integer or null, got {stride}")
        if (cfg.get("window_includes_current") and cfg.get("prefill", "stream") == "stream"
                and stride is not None and int(stride) > window):
            raise ConfigError(f"method.stride={stride} exceeds window={window}: with window_includes_current "
                              f"a chunk must fit in the window")

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.store = SinkRingStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, self.sink, self.ring, info.head_dim,
                            device, dtype)

    # --- per step: which slots are visible and at which in-cache positions ------------------------
    def begin(self, step):
        super().begin(step)
        a, T, S = step.start, step.length, self.sink
        kept_old = max(self.window - T, 0) if self.includes_current else self.window
        self.first_recent = max(S, a - kept_old)  # oldest non-sink token still visible
        slots, offsets = self.store.slots(a, a + T)
        self.slots, self.offsets = slots, offsets
        if step.phase == "decode":  # write-then-attend: the new token's slot is part of the view
            self.store.mark(slots, step.positions[offsets])
        p = self.store.slot_pos
        visible = (p >= 0) & ((p < S) | (p >= self.first_recent))
        self.slot_icp = self._icp(p)
        self.k_pos = torch.where(visible, self.slot_icp, _HIDDEN)
        self.q_icp = self._icp(step.positions)
        if step.phase != "decode":  # old view captured above; now note what this chunk leaves behind
            self.store.mark(slots, step.positions[offsets])
        last = a + T - 1
        self.attended = (last if last < S else S + last - self.first_recent) + 1
        self._cs = None

    def _icp(self, p: torch.Tensor) -> torch.Tensor:
        """In-cache position: sinks keep theirs, kept recent tokens follow them contiguously."""
        return torch.where(p < self.sink, p, self.sink + p - self.first_recent)

    def _rotations(self, rope, like):
        """cos/sin for the slots and the queries, computed once per step and shared by layers."""
        if self._cs is None:
            cs, ss = rope.cos_sin(self.slot_icp, like)
            cq, sq = rope.cos_sin(self.q_icp, like)
            self._cs = (cs.unsqueeze(1), ss.unsqueeze(1), cq.unsqueeze(1), sq.unsqueeze(1))
        return self._cs

    def attend(self, layer, q, k, v, rope):
        cs, ss, cq, sq = self._rotations(rope, q)
        qr = (q * cq + rotate_half(q) * sq).to(q.dtype)
        store = self.store
        self.record(layer, self.attended)
        if self.step.phase == "decode":
            store.write(layer, self.slots, k, v)
            keys = (store.k[layer] * cs + rotate_half(store.k[layer]) * ss).to(k.dtype)
            return attention.dense(qr, keys, store.v[layer], q_pos=self.q_icp, k_pos=self.k_pos,
                                   scale=self.info.scaling)
        # prefill chunk: kept slots (re-rotated) + the chunk's own keys, causal by in-cache position
        old = (store.k[layer] * cs + rotate_half(store.k[layer]) * ss).to(k.dtype)
        new = (k * cq + rotate_half(k) * sq).to(k.dtype)
        out = attention.dense(qr, torch.cat([old, new], 2), torch.cat([store.v[layer], v], 2),
                              q_pos=self.q_icp, k_pos=torch.cat([self.k_pos, self.q_icp]),
                              scale=self.info.scaling)
        store.write(layer, self.slots, k[:, :, self.offsets], v[:, :, self.offsets])
        return out

    def semantics(self):
        return {"method": self.name, "sink": self.sink, "window": self.window, "budget": self.cfg.get("budget"),
                "budget_total": self.sink + self.window, "window_includes_current": self.includes_current,
                "prefill": self.mode, "stride": self.prefill_chunk,
                "budget_unit": "tokens kept per KV head (sink + window), same set for every head and layer",
                "current_token": "inside the window" if self.includes_current else "on top of the window",
                "positions": "in-cache (keys stored un-rotated, re-rotated each step)",
                "dense_layers": 0}


def _sink_window(cfg) -> tuple[int, int]:
    sink = int(cfg.get("sink", 4))
    budget = cfg.get("budget")
    window = int(budget) - sink if budget is not None else int(cfg.get("window", 2000))
    return sink, window
