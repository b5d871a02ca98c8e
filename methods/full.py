"""Full (dense) attention: the reference all sparse methods must equal at budget >= context."""
from __future__ import annotations

from methods import attention
from methods.base import Method, register
from methods.stores import FullStore


@register
class Full(Method):
    name = "full"
    graph_safe = True

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)
        self.batch = batch

    def begin(self, step):
        super().begin(step)
        if step.phase == "decode" and step.positions.is_cuda:
            # KV length per sequence as a device tensor: the decode kernel reads it, so the step
            # has no host-side length and can be replayed from a CUDA graph.
            self.lengths = self.device_lengths(step, self.batch)

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        if step.phase == "decode" and q.is_cuda:
            keys, values = self.store.k[layer], self.store.v[layer]
            keys.index_copy_(2, step.positions, k)
            values.index_copy_(2, step.positions, v)
            self.record(layer, self.lengths)
            return attention.decode_kernel(q, keys, values, self.lengths, self.info.scaling, self.store.capacity)
        self.store.write(layer, step.start, k, v)
        keys, values = self.store.view(layer, step.end)
        self.record(layer, step.end)
        return attention.dense(q, keys, values, scale=self.info.scaling)

    def semantics(self):
        return {"method": self.name, "budget": None, "budget_unit": "all tokens", "dense_layers": "all",
                "prefill_chunk": self.prefill_chunk}
