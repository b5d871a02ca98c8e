"""H2O (FMInference/H2O, h2o_hf/utils_real_drop): heavy hitters + a recent window, real eviction.

Every token's score is the post-softmax attention it has received, summed over all query rows seen
so far (prefill rows included) and accumulated across steps; a KV head keeps its `recent` most
recent tokens plus the `budget - recent` highest-scored others. Eviction is real: a bounded store of
budget + 1 slots per KV head (the extra slot takes the incoming token), keys rotated at their
original positions (the real-drop class; its `_streaming` variant shifts positions instead). The
prompt is prefilled densely (in chunks if prefill_chunk is set) and then evicted to the budget; each
decode step attends budget + 1 tokens and evicts one. The reference is MHA-only (scores per query
head, cache per KV head); for GQA the group's scores are pooled (`pool`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError
from methods import selection
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.stores import BoundedStore


@dataclass(frozen=True)
class H2OConfig(ChunkedPrefill):
    """H2O (FMInference/H2O): heavy hitters by accumulated attention + recent window, evicted for real
    (h2o_hf/utils_real_drop). Budget = heavy + recent tokens per KV head."""

    budget: int = option(2048, "tokens kept per KV head: heavy hitters + recent window", min=2)
    recent: int | None = option(None, "recent window inside the budget (null = budget // 2: the scripts' equal "
                                "split, H2O issue #31)", min=1)
    pool: str = option("sum", "GQA: how a KV group's query heads pool their attention into one score",
                       choices=("sum", "mean", "max"))

    @property
    def window(self) -> int:
        return self.recent if self.recent is not None else self.budget // 2

    def check(self, info):
        if self.window >= self.budget:
            raise ConfigError(f"method.recent={self.window} must be below method.budget={self.budget}")

    def describe(self):
        return {"budget_unit": "tokens kept per KV head (heavy + recent), the incoming token on top",
                "recent_effective": self.window, "heavy": self.budget - self.window,
                "score": f"post-softmax attention summed over queries and steps, {self.pool} over the group",
                "positions": "original (keys rotated once)", "eviction": "real (bounded store)",
                "prefill": "dense, then evicted to the budget"}

    @classmethod
    def variants(cls):
        return [{"budget": 16}, {"budget": 12, "recent": 3, "pool": "max", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context)}


@register
class H2O(Method):
    name = "h2o"
    Config = H2OConfig
    graph_safe = True  # decode: device lengths, per-head victim slots on the device

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        self.cap = self.cfg.budget + 1
        self.store = getattr(self, "store", None) or BoundedStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, self.cap, info.head_dim, device, dtype)
        self.free = torch.zeros(info.num_layers, batch, info.num_kv_heads, dtype=torch.long, device=device)

    def buffers(self):
        return {**self.store.buffers(), "free": self.free}

    def begin(self, step):
        super().begin(step)
        # tokens present once this step's token is in: a prefix of the slots
        self.lengths = torch.clamp(step.positions[-1:] + 1, max=self.cap).to(torch.int32).expand(self.batch).contiguous()

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        if step.phase == "decode":
            return self._decode(layer, q, k, v, step.positions)
        return self._prefill(layer, q, k, v, step.positions, step.start)

    def _decode(self, layer, q, k, v, position):
        S, c, B = self.store, self.cfg, q.shape[0]
        S.put(layer, self.free[layer], k, v, position)
        out, probs = kernels.decode_attention_mass(q[:, :, 0].contiguous(), S.k[layer], S.v[layer], self.lengths,
                                                   self.info.scaling, max_length=self.cap)
        S.score[layer] += selection.group_reduce(probs, self.info.num_kv_heads, c.pool)
        self.record(layer, self.lengths)
        # Full (budget + 1 tokens): the lowest-scored token outside the recent window leaves and its
        # slot takes the next token; otherwise the next token takes the next empty slot.
        protected = S.pos[layer] > position - c.window
        victim = torch.where(protected, float("inf"), S.score[layer]).argmin(-1)
        full = (self.lengths == self.cap).view(B, 1)
        self.free[layer] = torch.where(full, victim, self.lengths.view(B, 1).long())
        return out.view(B, 1, -1)

    def _prefill(self, layer, q, k, v, positions, start):
        S, c = self.store, self.cfg
        B, Hkv = q.shape[0], self.info.num_kv_heads
        n_old = min(start, c.budget)                 # what the previous chunks left (host int: never graphed)
        keys = torch.cat([S.k[layer, :, :, :n_old], k], 2)
        values = torch.cat([S.v[layer, :, :, :n_old], v], 2)
        k_pos = torch.cat([torch.zeros(n_old, dtype=torch.long, device=q.device), positions])  # old: all visible
        out = kernels.prefill_attention(q, keys, values, self.info.scaling, q_pos=positions, k_pos=k_pos)
        mass = kernels.attention_mass(q, keys, self.info.scaling, q_pos=positions, k_pos=k_pos)
        T = positions.numel()
        score = torch.cat([S.score[layer, :, :, :n_old], torch.zeros(B, Hkv, T, device=q.device)], 2)
        score = score + selection.group_reduce(mass, Hkv, c.pool)
        pos = torch.cat([S.pos[layer, :, :, :n_old], positions.view(1, 1, T).expand(B, Hkv, T)], 2)
        index = self.keep(score, pos, positions[-1])
        S.keep(layer, index, keys, values, pos, score)
        self.free[layer] = index.shape[-1]
        return out

    def keep(self, score: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The selection rule after a prefill chunk: candidate indices [B, Hkv, min(N, budget)] to keep:
        every candidate in the recent window, then the highest scores (sorted by position)."""
        c = self.cfg
        n = min(score.shape[-1], c.budget)
        ranked = torch.where(pos > last - c.window, float("inf"), score)
        index = ranked.topk(n, dim=-1).indices
        return index.gather(-1, pos.gather(-1, index).argsort(-1))
