"""DuoAttention (mit-han-lab/duo-attention), LycheeDecode's baseline: retrieval KV heads attend every
token, streaming KV heads only the first `sink` tokens and the `recent` tokens before the current one
(plus it), from a head file of the same kind as LycheeDecode's (its own recipe: DuoAttention's gate
training, `python -m offline.train_heads method=direct`).

Reference behaviour (duo_attn/patch/static_kv_cache.py): a decode step appends the token to the
streaming cache of sink + recent slots and attends all of them, then evicts back to sink + recent;
prefill runs the streaming heads with a streaming (Λ-shaped) pattern (`prefill: streaming`, here at
token granularity; `dense` attends everything in prefill). The full KV cache is kept here (positions
stay the original ones, as the reference's, so attention is identical; the memory saving is not
modelled). DuoAttention* of the LycheeDecode paper (Table 1, "double the retrieval head budget") is
`head_scale: 2`: the top 2N heads by the head file's scores.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError
from kernels.hybrid import hybrid_decode, streaming_prefill_attention
from methods.base import register
from methods.config import option
from methods.lychee import HeadConfig, HybridHeads
from methods.parts import headfile, lychee_sets


@dataclass(frozen=True)
class DuoConfig(HeadConfig):
    """DuoAttention (mit-han-lab/duo-attention): retrieval heads dense, streaming heads sink + recent
    (reference 64 + 256); the head file's own recipe (DuoAttention's gate training)."""

    recipe: str = option("passkey-duo", "training recipe of the auto head file (the file name's suffix)")
    sink: int = option(64, "streaming heads: first tokens kept (reference sink_size)", min=0)
    recent: int = option(256, "streaming heads: tokens before the current one kept (reference recent_size)", min=0)
    budget: int | None = option(None, "if set: streaming heads attend `budget` tokens in all, recent = budget - "
                                "sink - 1 (the current token counts)", min=2)
    head_scale: float = option(1.0, "retrieval heads = the top round(head_scale x N) heads by the file's scores "
                               "(N = the file's set); 2 = the paper's DuoAttention* (Table 1)", min=0.0)
    prefill: str = option("streaming", "streaming: streaming heads prefill with the Λ pattern (reference); dense",
                          choices=("streaming", "dense"))

    @property
    def window(self) -> int:
        return self.budget - self.sink - 1 if self.budget is not None else self.recent

    def check(self, info):
        if self.window < 0:
            raise ConfigError(f"method.budget={self.budget} must exceed sink={self.sink} + 1 (the current token)")
        self.head_set(info)

    def head_set(self, info) -> headfile.HeadSet:
        hs = headfile.resolve(self.heads, model=self.head_model, recipe=self.recipe, num_layers=info.num_layers,
                              num_kv_heads=info.num_kv_heads, force_layer0=False, method="DuoAttention")
        return hs.scaled(self.head_scale, keep_layer0=False)

    def describe(self):
        return {"budget_unit": f"streaming heads: {self.sink} sinks + {self.window} recent + the current token",
                "retrieval_heads": "dense (every token)", "head_scale": self.head_scale,
                "prefill": self.prefill, "positions": "original"}

    @classmethod
    def variants(cls):
        return [{"heads": "random:1:4", "sink": 2, "recent": 6},
                {"heads": "inline:10/01/00/11/00/10", "budget": 9, "sink": 3, "prefill": "dense", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": None, "recent": max(self.window, context)}


@register
class DuoAttention(HybridHeads):
    name = "duo"
    Config = DuoConfig

    def prefill(self, layer, q, keys, values):
        if self.cfg.prefill == "dense" or all(self.roles_host[layer]):
            return super().prefill(layer, q, keys, values)
        return streaming_prefill_attention(q, keys, values, self.info.scaling, self.roles_host[layer],
                                           self.cfg.sink, self.cfg.window)

    def begin(self, step):
        super().begin(step)
        if step.phase == "decode":
            span = self.store.capacity
            self.index, self.counts = lychee_sets.sink_recent(self.lengths, self.info.num_kv_heads, self.cfg.sink,
                                                              self.cfg.window + 1, span)

    def decode(self, layer, q1, keys, values):
        all_ret = all(self.roles_host[layer])
        out = hybrid_decode(q1, keys, values, self.lengths, self.roles[layer], None if all_ret else self.index,
                            None if all_ret else self.counts, self.info.scaling, max_length=self.store.capacity,
                            roles=self.roles_host[layer])
        self.record_hybrid(layer, all_ret)
        return out
