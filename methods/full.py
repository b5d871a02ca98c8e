"""Full (dense) attention: the reference every sparse method must equal at budget >= context."""
from __future__ import annotations

from methods import attention
from methods.base import Method, register
from methods.stores import FullStore


@register
class Full(Method):
    name = "full"

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.store = FullStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.start, k, v)
        keys, values = self.store.view(layer, step.end)
        self.record(layer, step.end)
        return attention.dense(q, keys, values, scale=self.info.scaling)

    def semantics(self):
        return {"method": self.name, "budget": None, "budget_unit": "all tokens", "dense_layers": "all",
                "prefill_chunk": self.prefill_chunk}
