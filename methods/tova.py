"""TOVA (schwartz-lab-NLP/TOVA, "Transformers are Multi-State RNNs"): a bounded cache that keeps, at
every step, the tokens the current query attends to most, averaged over the heads.

Reference behaviour (src/tova_cache.py `TOVACache.reduce`, called after every attention forward):
the new tokens are appended; when the layer then holds more than `cache_size` tokens, the last query
row's post-softmax attention, averaged over all query heads (`mean(attn[:, :, -1, :], dim=1)`), ranks
them and the top `cache_size` stay, the same set for every head of the layer. Nothing is protected:
the incoming token itself may leave. After a prompt the cache is cut to the budget by the prompt's
last query; each decode step attends budget + 1 tokens and evicts one. Keys keep their original
positions (the repository's default; its log-compressed positions option is not implemented here,
so TOVA reads no further than the model's positions). kvpress's TOVAPress scores the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import register
from methods.config import ChunkedPrefill, option
from methods.parts.eviction import EvictionMethod


@dataclass(frozen=True)
class TOVAConfig(ChunkedPrefill):
    """TOVA (schwartz-lab-NLP/TOVA): keep the `budget` tokens with the highest attention from the current
    query, averaged over heads; evict one per decode step (the incoming token may be the one). Budget =
    tokens kept per layer, the incoming token on top."""

    budget: int = option(512, "tokens kept per layer (TOVA's cache_size, the multi-state size)", min=1)
    heads: str = option("shared", "shared: one score averaged over all query heads, one kept set per layer "
                        "(TOVACache, kvpress); kv_group: averaged over each KV head's query group, a set per KV head",
                        choices=("shared", "kv_group"))

    def describe(self):
        return {"budget_unit": "tokens kept per layer (the incoming token on top, and it may be evicted)",
                "score": "post-softmax attention of the current query only (no accumulation), mean over "
                         + ("all query heads" if self.heads == "shared" else "each KV head's query group"),
                "positions": "original (keys rotated once)", "eviction": "real (bounded store)",
                "prefill": "dense, then cut to the budget by the prompt's last query"}

    @classmethod
    def variants(cls):
        return [{"budget": 12}, {"budget": 10, "heads": "kv_group", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context)}


@register
class TOVA(EvictionMethod):
    """The rule: the current query's attention, averaged over the heads (all, or each KV group); nothing
    protected, nothing accumulated; a prefill chunk is ranked by its last query. The rest (the bounded
    store, [kept | chunk] prefill, top-budget keep, arg-min victim) is methods/parts/eviction.py."""

    name = "tova"
    Config = TOVAConfig
    score_rows = "last"  # TOVACache.reduce ranks by attn[:, :, -1, :]

    def score(self, probs: torch.Tensor) -> torch.Tensor:
        B, Hq, N = probs.shape
        Hkv = self.info.num_kv_heads
        if self.cfg.heads == "shared":
            return probs.mean(1, keepdim=True).expand(B, Hkv, N)
        return probs.view(B, Hkv, Hq // Hkv, N).mean(2)

    def fused(self):
        return {"shared": self.cfg.heads == "shared", "pool": "mean"}
