"""Full (dense) attention: the reference all sparse methods must equal at budget >= context."""
from __future__ import annotations

from dataclasses import dataclass

import kernels
from methods.base import Method, register
from methods.config import ChunkedPrefill
from methods.parts.stores import FullStore


@dataclass(frozen=True)
class FullConfig(ChunkedPrefill):
    """Dense attention over every cached token: the reference all sparse methods equal at budget >= context."""

    def describe(self):
        return {"budget": None, "budget_unit": "all tokens", "dense_layers": "all", "prefill": "dense"}

    def full_equivalent(self, context):
        return {}


@register
class Full(Method):
    name = "full"
    Config = FullConfig
    graph_safe = True
    decode_idempotent = True  # a step writes only its own position

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)
        self.batch = batch

    def buffers(self):
        return self.store.buffers()

    def begin(self, step):
        super().begin(step)
        # KV length per sequence as a device tensor: the decode kernel reads it, so the step has no
        # host-side length and can be replayed from a CUDA graph.
        self.lengths = self.device_lengths(step, self.batch)

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.positions, k, v)
        if step.phase == "decode":
            self.record(layer, self.lengths)
            out = kernels.decode_attention(q[:, :, 0].contiguous(), self.store.k[layer], self.store.v[layer],
                                           self.lengths, self.info.scaling, max_length=self.store.capacity)
            return out.view(q.shape[0], 1, -1)
        keys, values = self.store.view(layer, step.end)
        return kernels.prefill_attention(q, keys, values, self.info.scaling)
