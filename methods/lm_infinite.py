"""LM-Infinite (Glaciohound/LM-Infinite, models/llama.py + models/lambda_attention.py): the
Lambda-shaped mask with a distance cap.

A query at position p attends
  * the local branch: keys at distance 0 .. local_branch-1, at their real relative positions;
  * the global branch: the first `global_branch` tokens once they are out of the local branch
    (distance >= local_branch), with the query rotated by the capped distance
    min(limit_distance, kv_seq_len - 1) and the keys un-rotated ("stationary" states);
one softmax over both (merged from two parts here, kernels.lse). Nothing else is ever attended, so
the cache is bounded: sinks + a ring of the last local_branch tokens (the reference keeps every key
but reads only these).

Defaults: README's drop-in `convert_llama_model(model, 4096, 10)` (local 4096, global 10, limit =
local). The reference prefills the whole prompt in one pass; we stream it in chunks of
`prefill_chunk` tokens, which gives the same attention (the mask is per query) except that
kv_seq_len in the cap is the end of the chunk, not of the prompt: they differ only when
limit_distance > local_branch. The non-Lambda path's `triangle_offset` (0 by default) is not offered.

Decode is one pass over the store, like StreamingLLM's, and captured in a CUDA graph. Every stored
token is attended (the ring holds exactly the local branch; a sink is local or global), and a global
sink's logit (q rotated by the capped distance theta) . k equals (q rotated at p) . (k rotated at
p - theta): RoPE scores depend only on the angle difference. So each step re-rotates the G sinks' raw
keys into their store slots (at p - theta if global, at j if local) and reads [sinks | ring] by
length with one decode kernel, all from the device position. It was 11x StreamingLLM's decode: a
host sync per step (nonzero over the slots), no graph, two kernels and a merge per layer. The
rounding differs from the two-part form only at float precision (same softmax, one pass).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError
from kernels.lse import merge_attention
from kernels.window import FAR, window_attention_lse
from methods.base import Method, register
from methods.config import MethodConfig, option
from methods.parts.stores import SinkRingStore

_HIDDEN = 1 << 40


@dataclass(frozen=True)
class LMInfiniteConfig(MethodConfig):
    """LM-Infinite (Glaciohound/LM-Infinite): Lambda-shaped attention (first global_branch tokens +
    the last local_branch) with the distance capped at limit_distance. Defaults: convert_llama_model(model, 4096, 10)."""

    local_branch: int = option(4096, "local branch: keys at distance 0..local_branch-1 at real relative positions",
                               min=1)
    global_branch: int = option(10, "first tokens attended when out of the local branch (README: 10-100 behave "
                                "alike; its scripts use 100)", min=0)
    limit_distance: int | None = option(None, "distance cap for the global branch (null = local_branch, as "
                                        "convert_llama_model)", min=0)
    prefill_chunk: int | None = option(None, "prompt tokens per prefill chunk (null = local_branch)", min=1)

    @property
    def limit(self) -> int:
        return self.local_branch if self.limit_distance is None else self.limit_distance

    def check(self, info):
        if self.limit > info.max_position:
            raise ConfigError(f"method.limit_distance={self.limit} exceeds the model's {info.max_position} positions")

    def describe(self):
        return {"budget_unit": "tokens per KV head: global_branch sinks + local_branch window",
                "budget_total": self.global_branch + self.local_branch,
                "positions": f"window at real relative positions; sinks beyond it un-rotated at distance "
                             f"min({self.limit}, kv_len - 1)",
                "prefill": f"streamed in chunks of {self.prefill_chunk or self.local_branch}", "dense_layers": 0}

    @classmethod
    def variants(cls):
        return [{"global_branch": 2, "local_branch": 8, "prefill_chunk": 8},
                {"global_branch": 3, "local_branch": 10, "limit_distance": 14, "prefill_chunk": 6},
                {"global_branch": 0, "local_branch": 9}]

    def full_equivalent(self, context):
        return {"local_branch": max(self.local_branch, context)}


@register
class LMInfinite(Method):
    name = "lm_infinite"
    Config = LMInfiniteConfig
    decode_idempotent = True  # a step writes only its own position (its ring slot, or a sink once)
    graph_safe = True  # decode: slot, sink angles and length from the device position

    @property
    def prefill_chunk(self):
        return self.cfg.prefill_chunk or self.cfg.local_branch

    def setup(self, info, batch, max_len, device, dtype):
        c = self.cfg
        self.info, self.batch = info, batch
        # keys stored rotated at their absolute positions (the local branch only needs relative ones);
        # the sinks also un-rotated, for the global branch
        self.store = getattr(self, "store", None) or SinkRingStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, c.global_branch, c.local_branch,
                            info.head_dim, device, dtype)
        shape = (info.num_layers, batch, info.num_kv_heads, max(c.global_branch, 1), info.head_dim)
        sk = getattr(self, "sink_raw", None)
        ok = sk is not None and sk.shape == shape and sk.dtype == dtype and sk.device == torch.device(device)
        self.sink_raw = sk if ok else torch.empty(shape, device=device, dtype=dtype)

    def buffers(self):
        return {**self.store.buffers(), "sink_raw": self.sink_raw}

    def begin(self, step):
        super().begin(step)
        c, a, T, G = self.cfg, step.start, step.length, self.cfg.global_branch
        pos, S = step.positions, self.store
        if step.phase == "decode":
            # From the device position alone (no host int: the step can be captured in a CUDA graph).
            # Write-then-attend: the new token is part of the local branch.
            self.slots = S._slot_of(pos)
            S.mark(self.slots, pos)
            theta = torch.clamp(pos, max=c.limit)                     # capped distance, kv_len - 1 = pos
            n_global = torch.clamp(pos - c.local_branch + 1, min=0)  # sinks out of the local branch
            j = torch.arange(G, device=pos.device)
            self.sink_pos = torch.where(j < n_global, pos - theta, j)
            self.new_sink = (pos < G).view(1, 1, -1, 1)              # a short prompt: decode still writes sinks
            self.sink_slot = torch.clamp(pos, max=max(G - 1, 0))
            # the ring holds exactly the local branch, every sink is local or global: all filled slots
            self.lengths = torch.clamp(pos + 1, max=G + c.local_branch).to(torch.int32).expand(self.batch)
            self.lengths = self.lengths.contiguous()
            self.offsets = self.k_pos = self.angle = None  # prefill-only: nothing else outlives a step
            return
        self.slots, self.offsets = S.slots(a, a + T)
        self.old_sinks = min(a, G)                      # sinks written before this step
        self.new_sinks = max(0, min(G, a + T) - a)      # sinks among the new tokens
        self.angle = torch.tensor([min(c.limit, a + T - 1)], device=pos.device)
        p = S.slot_pos
        self.k_pos = torch.where(p >= 0, p, _HIDDEN)
        S.mark(self.slots, pos[self.offsets])

    def attend(self, layer, q, k, v, rope):
        step, c, scale, S, G = self.step, self.cfg, self.info.scaling, self.store, self.cfg.global_branch
        B, Hq, T, D = q.shape
        pos = step.positions
        q_rot, k_rot = rope.apply(q, pos), rope.apply(k, pos)
        if step.phase == "decode":
            S.write(layer, self.slots, k_rot, v)
            if G:
                sk = self.sink_raw[layer]
                sk.index_copy_(2, self.sink_slot, torch.where(self.new_sink, k, sk.index_select(2, self.sink_slot)))
                S.k[layer][:, :, :G] = rope.apply(sk[:, :, :G], self.sink_pos)
            out = kernels.decode_attention(q_rot[:, :, 0].contiguous(), S.k[layer], S.v[layer], self.lengths,
                                           scale, max_length=S.k.shape[3])
            self.record(layer, self.lengths)
            return out.view(B, 1, Hq * D)
        q_glob = rope.apply(q, self.angle)
        if self.new_sinks:
            self.sink_raw[layer, :, :, step.start:step.start + self.new_sinks] = k[:, :, :self.new_sinks]
        keys = torch.cat([S.k[layer], k_rot], 2)
        values = torch.cat([S.v[layer], v], 2)
        out_l, lse_l = window_attention_lse(q_rot, keys, values, scale, pos, torch.cat([self.k_pos, pos]),
                                            0, c.local_branch - 1)
        n_sink = self.old_sinks + self.new_sinks
        g_pos = torch.arange(n_sink, device=q.device)
        g_v = torch.cat([S.v[layer, :, :, :self.old_sinks], v[:, :, :self.new_sinks]], 2)
        out_g, lse_g = window_attention_lse(q_glob, self.sink_raw[layer, :, :, :n_sink], g_v, scale, pos, g_pos,
                                            c.local_branch, FAR)
        out, _ = merge_attention([(out_l, lse_l), (out_g, lse_g)])
        S.write(layer, self.slots, k_rot[:, :, self.offsets], v[:, :, self.offsets])
        return out.transpose(1, 2).reshape(B, T, Hq * D)
