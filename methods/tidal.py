"""TidalDecode (DerrickYLJ/TidalDecode): position-persistent sparse attention.

Reference HF accuracy path (src/tidal_build/modify_llama.py), the default here:
  * layers < dense_layers (2) and the prefill are dense; the full KV cache is kept;
  * token-selection layers = dense_layers and reselect_layer (the scripts' `correction_layer`,
    13 for 32-layer Llama-3): they run FULL attention for their own output and pick the top
    min(budget, kv_len) tokens on the exact pre-softmax scores q.k, per QUERY head (selection
    happens after repeat_kv); no forced sinks or window, the current token competes like any other;
  * every other layer attends only to the tokens picked by the latest selection layer of the same
    decode step (the set never persists across steps).
Options:
  select: kv_head          one set per KV head, shared by its query heads (KV traffic = budget per
                           KV head instead of up to g*budget); ranked by `group_score`:
                           softmax_sum (sum of the group's attention probabilities) or logit_max.
  include_current          the efficiency path (tidal/): the budget counts the current token, which
                           is always attended, plus the top budget-1 others.
  correction_interval: T   the paper's KV cache correction (sec. 3.2; not in the public code): every
                           T decode steps the tokens decoded since the last correction are re-run
                           through a dense prefill and their KV entries rewritten (phase "correct",
                           driven by the engine through `correction_span`). Off (null) by default,
                           as in the paper's evaluations.
"""
from __future__ import annotations

import torch

import kernels
from methods import attention
from methods.base import Method, register
from methods.stores import FullStore
from common.errors import ConfigError

SELECT = ("query_head", "kv_head")
GROUP_SCORE = ("softmax_sum", "logit_max")
RESELECT = 13  # the scripts' correction_layer for 32-layer Llama-3 (the code's own default is 9)


@register
class TidalDecode(Method):
    name = "tidal"
    graph_safe = True  # the CUDA decode path (kernels, device lengths) is static-shape

    def __init__(self, cfg):
        super().__init__(cfg)
        self.budget = int(cfg.get("budget", 4096))
        self.dense_layers = int(cfg.get("dense_layers", 2))
        r = cfg.get("reselect_layer", RESELECT)
        self.selection_layers = {self.dense_layers} | ({int(r)} if r is not None else set())
        self.select = str(cfg.get("select", "query_head"))
        self.group_score = str(cfg.get("group_score", "softmax_sum"))
        self.include_current = bool(cfg.get("include_current", False))
        interval = cfg.get("correction_interval")
        self.correction_interval = int(interval) if interval is not None else None
        self.index: torch.Tensor | None = None
        self.selected: dict[int, torch.Tensor] = {}  # selection layer -> its token set (for tests/analysis)
        self._clean_end = 0   # tokens before this position have dense-computed KV

    @classmethod
    def validate(cls, cfg, info):
        super().validate(cfg, info)
        n = info.num_layers
        budget = cfg.get("budget")
        if budget is None or int(budget) < 1:
            raise ConfigError(f"method.budget must be an integer >= 1, got {budget}")
        dense = int(cfg.get("dense_layers", 2))
        if not 0 <= dense < n:
            raise ConfigError(f"method.dense_layers={dense} is outside [0, {n}) for this {n}-layer model")
        r = cfg.get("reselect_layer", RESELECT)
        if r is not None and not dense < int(r) < n:
            raise ConfigError(f"method.reselect_layer={r} must lie in ({dense}, {n}) (after the first selection "
                              f"layer dense_layers={dense}, inside this {n}-layer model) or be null")
        if cfg.get("select", "query_head") not in SELECT:
            raise ConfigError(f"method.select must be one of {', '.join(SELECT)}, got {cfg.get('select')!r}")
        if cfg.get("group_score", "softmax_sum") not in GROUP_SCORE:
            raise ConfigError(f"method.group_score must be one of {', '.join(GROUP_SCORE)}, "
                              f"got {cfg.get('group_score')!r}")
        interval = cfg.get("correction_interval")
        if interval is not None and int(interval) < 1:
            raise ConfigError(f"method.correction_interval must be a positive integer or null, got {interval}")

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)
        self.batch = batch
        self._clean_end = 0

    def begin(self, step):
        super().begin(step)
        self.index = None
        self.selected = {}
        self.k = min(self.budget, step.end)  # host int: tokens per set this step (CPU path)
        if step.phase == "decode" and step.positions.is_cuda:
            self.lengths = self.device_lengths(step, self.batch)
        if step.phase != "decode":  # a dense prefill chunk or a correction leaves tokens < end clean
            self._clean_end = max(self._clean_end, step.end)

    def correction_span(self, seq_len: int) -> tuple[int, int] | None:
        """Engine hook after each decode step: the span of sparsely decoded tokens to recompute.
        Derived from seq_len (not counted in `begin`): a decode step replayed from a CUDA graph
        runs no Python."""
        if self.correction_interval and seq_len - self._clean_end >= self.correction_interval:
            return self._clean_end, seq_len
        return None

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        if step.phase == "decode" and q.is_cuda:
            return self._attend_kernels(layer, q, k, v)
        self.store.write(layer, step.start, k, v)  # a correction step overwrites the polluted KV here
        keys, values = self.store.view(layer, step.end)
        scale = self.info.scaling
        if step.phase != "decode" or layer < self.dense_layers:
            self.record(layer, step.end)
            return attention.dense(q, keys, values, scale=scale)
        if layer in self.selection_layers:
            out, scores = attention.selection(q, keys, values, scale=scale)
            self.index = self._top(scores)
            self.selected[layer] = self.index
            self.record(layer, step.end)
            return out
        self.record(layer, self.k)
        return attention.gathered(q, keys, values, self.index, scale=scale)

    def _attend_kernels(self, layer, q, k, v):
        """GPU decode: Triton kernels over the full-capacity store, lengths on the device, fixed
        set size (budget; `counts` hide what is not filled yet): no host sync, graph-capturable."""
        keys, values = self.store.k[layer], self.store.v[layer]
        pos = self.step.positions
        keys.index_copy_(2, pos, k)
        values.index_copy_(2, pos, v)
        B, Hq = q.shape[:2]
        q1, cap, scale = q[:, :, 0].contiguous(), self.store.capacity, self.info.scaling
        if layer < self.dense_layers:
            self.record(layer, self.lengths)
            return kernels.decode_attention(q1, keys, values, self.lengths, scale, max_length=cap).view(B, 1, -1)
        if layer in self.selection_layers:
            out, scores = kernels.selection_attention(q1, keys, values, self.lengths, scale, max_length=cap)
            scores = self._rank(scores, pos)
            self.index, self.counts = kernels.topk_positions(scores, self.lengths, self.budget)
            self.selected[layer] = self.index
            self.record(layer, self.lengths)
            return out.view(B, 1, -1)
        self.record(layer, self.counts)
        out = kernels.sparse_decode_tokens(q1, keys, values, self.index, self.counts, scale)
        return out.view(B, 1, -1)

    def _rank(self, scores: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Scores [B, Hq, S] (-inf past the length) -> the ranking the sets are drawn from:
        per KV head for select=kv_head, the current token first for include_current."""
        if self.select == "kv_head":
            B, Hq, S = scores.shape
            grouped = scores.view(B, self.info.num_kv_heads, Hq // self.info.num_kv_heads, S)
            if self.group_score == "softmax_sum":
                scores = torch.softmax(grouped * self.info.scaling, dim=-1).sum(2)
                scores = scores.masked_fill(grouped[:, :, 0] == float("-inf"), float("-inf"))
            else:
                scores = grouped.amax(2)
        if self.include_current:
            scores = scores.index_fill(-1, pos[-1:], float("inf"))
        return scores

    def _top(self, scores: torch.Tensor) -> torch.Tensor:
        """Top-k token indices [B, H, k] from unscaled fp32 scores [B, Hq, L]."""
        if self.select == "kv_head":
            B, Hq, L = scores.shape
            grouped = scores.view(B, self.info.num_kv_heads, Hq // self.info.num_kv_heads, L)
            if self.group_score == "softmax_sum":
                scores = torch.softmax(grouped * self.info.scaling, dim=-1).sum(2)
            else:
                scores = grouped.amax(2)
        if self.include_current:  # the current token always wins a slot
            scores = scores.clone()
            scores[..., -1] = float("inf")
        return scores.topk(self.k, dim=-1).indices

    def semantics(self):
        return {"method": self.name, "budget": self.budget, "dense_layers": self.dense_layers,
                "reselect_layer": self.cfg.get("reselect_layer", RESELECT), "select": self.select,
                "group_score": self.group_score if self.select == "kv_head" else None,
                "include_current": self.include_current, "correction_interval": self.correction_interval,
                "prefill_chunk": self.prefill_chunk,
                "selection_layers": sorted(self.selection_layers),
                "budget_unit": "tokens per KV head" if self.select == "kv_head" else "tokens per query head",
                "current_token": "forced, counted in the budget" if self.include_current else "competes, not forced",
                "sinks_window": "none forced",
                "selection_score": "exact q.k (pre-softmax)" if self.select == "query_head"
                else f"group {self.group_score} of exact q.k",
                "dense_layers_total": self.dense_layers + len(self.selection_layers),
                "prefill": "dense"}
