"""SnapKV (FasterDecoding/SnapKV, snapkv_utils.py `SnapKVCluster`): the prompt is compressed once, at
prefill, by what its last queries (the observation window) attend to; decoding is dense over what is
kept plus every generated token.

Reference behaviour: a prompt of fewer than `max_capacity_prompt` tokens is kept whole. Otherwise
the window's queries attend (softmax over the whole prompt, causal inside the window); each key
before the window gets its attention summed over the window's queries, smoothed along the sequence
by a 1-D pool (`avgpool`/`maxpool`, kernel 5, padding kernel // 2, stride 1, avg_pool1d counting
the padding), and the top `max_capacity_prompt - window` of those stay, with the window itself.
Defaults: init_snapkv's window 32, capacity 2048, kernel 5, avgpool. The reference repeats the KV
heads before compressing (`repeat_kv` "moved ahead"): one kept set per *query* head, a cache of Hq
heads (`heads=query`); kvpress's SnapKVPress averages the pooled scores over each KV group instead,
one set per KV head (`heads=kv_group`; its window default is 64).

Prompt in chunks (prefill_chunk): the rule is applied after every chunk to the cache plus the chunk,
with that chunk's last queries as the window (a generalisation; the reference sees one forward).
Keys keep their original positions. SnapKV is its rule (`SnapKV` below: the score, the protected
window, how many stay) on the prompt compression of methods/parts/eviction.py, which holds the store
(bounded by what the rule keeps: per store head, min(prompt, budget) + the tokens the run may still add),
the [kept | chunk] prefill, the keep and the dense decode over the kept prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from common.errors import ConfigError
from methods.base import register
from methods.config import ChunkedPrefill, option
from methods.parts.eviction import PromptCompression


@dataclass(frozen=True)
class SnapKVConfig(ChunkedPrefill):
    """SnapKV (FasterDecoding/SnapKV): prefill-time selection by the observation window's pooled attention,
    then dense decode over the kept tokens and every generated one. Budget = prompt tokens kept per head
    (max_capacity_prompt, the window included). Defaults: the SnapKV code's (window 32, kernel 5, avgpool,
    a set per query head); kvpress: window=64 heads=kv_group."""

    budget: int = option(2048, "prompt tokens kept per head, the observation window included (max_capacity_prompt)",
                         min=2)
    window: int = option(32, "observation window: the last prompt queries that score, and are kept (kvpress: 64)",
                         min=1)
    kernel: int = option(5, "pooling kernel along the sequence (odd: padding kernel // 2 keeps the length)", min=1)
    pooling: str = option("avgpool", "1-D pooling of the window's summed attention", choices=("avgpool", "maxpool"))
    heads: str = option("query", "query: a kept set per query head, the KV repeated (SnapKV code); kv_group: pooled "
                        "scores averaged over the KV group, a set per KV head (kvpress)", choices=("query", "kv_group"))

    def check(self, info):
        if self.window >= self.budget:
            raise ConfigError(f"method.window={self.window} must be below method.budget={self.budget}")
        if self.kernel % 2 == 0:
            raise ConfigError(f"method.kernel={self.kernel} must be odd (the pooled scores keep the prompt's length)")

    def describe(self):
        return {"budget_unit": f"prompt tokens kept per {'query' if self.heads == 'query' else 'KV'} head "
                               "(window included); generated tokens all kept on top",
                "score": f"attention of the last {self.window} prompt queries summed, {self.pooling} k={self.kernel}"
                         + (", averaged over the KV group" if self.heads == "kv_group" else ""),
                "selection": "once, after the prefill (after each chunk when chunked); dense decode",
                "positions": "original", "prefill": "dense"}

    @classmethod
    def variants(cls):
        return [{"budget": 16, "window": 4},
                {"budget": 12, "window": 3, "kernel": 3, "pooling": "maxpool", "heads": "kv_group", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context + 1)}


@register
class SnapKV(PromptCompression):
    """The rule: the observation window's attention, summed over its queries and pooled along the prompt
    (a set per query head, or the pooled scores averaged over each KV group); the window protected; the
    top `budget - window` before it kept, a prompt shorter than the budget whole. The rest (the store
    sized by what is kept, [kept | chunk] prefill, the keep, dense decode) is methods/parts/eviction.py."""

    name = "snapkv"
    Config = SnapKVConfig

    @property
    def store_heads(self) -> int:
        return self.info.num_heads if self.cfg.heads == "query" else self.info.num_kv_heads

    def observed(self) -> int:
        """The window: the chunk's last `window` queries (all of them if shorter)."""
        return min(self.cfg.window, self.step.length)

    def rows(self, T):
        return slice(-self.observed(), None)

    def protected(self, pos, last):
        return pos > last - self.observed()

    def prefix_keep(self, layer: int, n_prefix: int) -> int:
        """How many tokens before the window stay (PyramidKV overrides it per layer)."""
        return self.cfg.budget - self.cfg.window

    def keep_count(self, layer, N):
        if N < self.cfg.budget:                         # SnapKV: a short prompt is kept whole
            return N
        w = self.observed()
        return min(self.prefix_keep(layer, N - w), N - w) + w

    def score(self, probs):
        """The window's attention before it [B, Hq, N - w], pooled along the sequence (avg_pool1d counts
        the zero padding), averaged over the KV group for kv_group; the window's own entries 0 (protected)."""
        c, w, N = self.cfg, self.observed(), probs.shape[-1]
        pool = F.avg_pool1d if c.pooling == "avgpool" else F.max_pool1d
        scores = pool(probs[:, :, :N - w], kernel_size=c.kernel, padding=c.kernel // 2, stride=1)
        if self.H != scores.shape[1]:                   # kv_group: average the pooled scores over the group
            scores = scores.view(scores.shape[0], self.H, -1, N - w).mean(2)
        return F.pad(scores, (0, w))
