"""TidalDecode (DerrickYLJ/TidalDecode): position-persistent sparse attention.

Reference HF accuracy path (src/tidal_build/modify_llama.py), the default here:
  * layers < dense_layers (2) and the prefill are dense; the full KV cache is kept;
  * token-selection layers = dense_layers and reselect_layer (the scripts' `correction_layer`,
    13 for 32-layer Llama-3): they run FULL attention for their own output and pick the top
    min(budget, kv_len) tokens on the exact pre-softmax scores q.k, per QUERY head (selection
    happens after repeat_kv); no forced sinks or window, the current token competes like any other;
  * every other layer attends only to the tokens picked by the latest selection layer of the same
    decode step (the set never persists across steps).
The paper's KV cache correction (sec. 3.2; not in the public code) is `correction_interval`: every
T decode steps the tokens decoded since the last correction are re-run through a dense prefill and
their KV entries rewritten (phase "correct", driven by the engine through `correction_span`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError
from methods.base import Method, register
from methods.config import ChunkedPrefill, layer_range, option
from methods.parts import selection
from methods.parts.stores import FullStore

SELECT = ("query_head", "kv_head")
GROUP_SCORE = ("softmax_sum", "logit_max")


@dataclass(frozen=True)
class TidalConfig(ChunkedPrefill):
    """TidalDecode (DerrickYLJ/TidalDecode): full attention + exact top-k token selection at two layers,
    every other sparse layer reuses the latest selection. Defaults follow the HF accuracy path."""

    budget: int = option(4096, "tokens per set (scripts: 128 for NIAH, 4096 for LongBench / PG-19)", min=1)
    dense_layers: int = option(2, "layers 0..dense_layers-1 dense; layer dense_layers selects first", min=0)
    reselect_layer: int | None = option(13, "the re-selection (scripts' correction_layer) layer, 13 for "
                                        "32-layer Llama-3 (the code's own default is 9); null = select once")
    select: str = option("query_head", "query_head: one set per query head (reference); kv_head: one set per "
                         "KV head, shared by its group", choices=SELECT)
    group_score: str = option("softmax_sum", "kv_head only: rank by the group's summed probabilities or "
                              "its max logit", choices=GROUP_SCORE)
    include_current: bool = option(False, "true = efficiency path: the current token forced, counted in the budget")
    correction_interval: int | None = option(None, "KV cache correction every T decode steps (paper sec. 3.2); "
                                             "null = off, as in the paper's evaluations", min=1)

    def check(self, info):
        layer_range("dense_layers", self.dense_layers, info)
        r, n = self.reselect_layer, info.num_layers
        if r is not None and not self.dense_layers < r < n:
            raise ConfigError(f"method.reselect_layer={r} must lie in ({self.dense_layers}, {n}) (after the first "
                              f"selection layer dense_layers={self.dense_layers}, inside this {n}-layer model) "
                              f"or be null")

    @property
    def selection_layers(self) -> tuple[int, ...]:
        return (self.dense_layers,) + ((self.reselect_layer,) if self.reselect_layer is not None else ())

    def describe(self):
        kv = self.select == "kv_head"
        return {"budget_unit": "tokens per KV head" if kv else "tokens per query head",
                "current_token": "forced, counted in the budget" if self.include_current else "competes, not forced",
                "sinks_window": "none forced",
                "selection_score": f"group {self.group_score} of exact q.k" if kv else "exact q.k (pre-softmax)",
                "selection_layers": list(self.selection_layers),
                "dense_layers_total": self.dense_layers + len(self.selection_layers), "prefill": "dense"}

    @classmethod
    def variants(cls):
        return [{"budget": 8, "reselect_layer": 4},
                {"budget": 8, "reselect_layer": 3, "select": "kv_head", "include_current": True,
                 "correction_interval": 5},
                {"budget": 6, "reselect_layer": None, "dense_layers": 1, "select": "kv_head",
                 "group_score": "logit_max", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context)}


@register
class TidalDecode(Method):
    name = "tidal"
    Config = TidalConfig
    graph_safe = True  # static shapes, device lengths: the decode step is capturable
    decode_idempotent = True  # a step writes only its own position

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)
        self.batch = batch
        self._clean_end = 0   # tokens before this position have dense-computed KV
        self.selected: dict[int, torch.Tensor] = {}  # selection layer -> its token sets, -1 = none

    def buffers(self):
        return self.store.buffers()

    def begin(self, step):
        super().begin(step)
        self.lengths = self.device_lengths(step, self.batch)
        self.index = self.counts = None
        self.selected = {}
        if step.phase != "decode":  # a dense prefill chunk or a correction leaves tokens < end clean
            self._clean_end = max(self._clean_end, step.end)

    def correction_span(self, seq_len: int) -> tuple[int, int] | None:
        """Engine hook after each decode step: the span of sparsely decoded tokens to recompute.
        Derived from seq_len (not counted in `begin`): a decode step replayed from a CUDA graph
        runs no Python."""
        interval = self.cfg.correction_interval
        if interval and seq_len - self._clean_end >= interval:
            return self._clean_end, seq_len
        return None

    def attend(self, layer, q, k, v, rope):
        step, c, scale = self.step, self.cfg, self.info.scaling
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.positions, k, v)  # a correction step overwrites the polluted KV here
        if step.phase != "decode":
            keys, values = self.store.view(layer, step.end)
            return kernels.prefill_attention(q, keys, values, scale)
        B = q.shape[0]
        q1, keys, values, cap = q[:, :, 0].contiguous(), self.store.k[layer], self.store.v[layer], self.store.capacity
        if layer < c.dense_layers:
            self.record(layer, self.lengths)
            return kernels.decode_attention(q1, keys, values, self.lengths, scale, max_length=cap).view(B, 1, -1)
        if layer in c.selection_layers:
            out, scores = kernels.selection_attention(q1, keys, values, self.lengths, scale, max_length=cap)
            self.index, self.counts = self.select(scores, step.positions)
            self.selected[layer] = selection.marked(self.index, self.counts)
            self.record(layer, self.lengths)
            return out.view(B, 1, -1)
        self.record(layer, self.counts)
        return kernels.sparse_decode_tokens(q1, keys, values, self.index, self.counts, scale).view(B, 1, -1)

    def select(self, scores: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The selection rule: unscaled q.k scores [B, Hq, S] (-inf past the length) -> token sets
        (int32 [B, H, k], counts [B, H]); H = Hq, or Hkv with select=kv_head."""
        c = self.cfg
        if c.select == "kv_head":
            scores = selection.group_reduce(scores, self.info.num_kv_heads, c.group_score, self.info.scaling)
        if c.include_current:  # the current token always wins a slot
            scores = selection.force(scores, positions[-1:])
        return selection.top_tokens(scores, self.lengths, c.budget)
