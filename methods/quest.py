"""Quest (mit-han-lab/Quest): query-aware page selection from per-page key min/max bounds.

Reference eval path (evaluation/quest_attention.py), the default here:
  * layers < dense_layers (2) and every prefill are dense; the full KV cache is kept (rotated keys
    at absolute positions, so pages are aligned to position 0);
  * a decode step scores each page of `page_size` (16) tokens by the upper bound
    sum_d max(q_d*kmin_d, q_d*kmax_d) in fp32 (no 1/sqrt(d): ranking is unaffected), per QUERY head;
  * the budget is first clamped to the context (`token_budget = min(kv_seq_len, token_budget)`;
    the kernel path, `include_current_page=true`, has no clamp: budget 4096 at 134 tokens keeps all
    9 pages),
    then it keeps the top min(max(min_pages, budget // page_size), n_pages) pages per query head
    (Quest issue #22: the floor of 3 pages, and the clamp, sparsify even when the context fits the
    budget: budget 1024 at 1,000 tokens keeps 62 of 63 pages); the current (partial) page competes
    like any other; exact attention over the chosen pages.
Page min/max are kept incrementally on append; the eval path recomputes them from all keys each
step, which gives the same values (min/max are exact).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels.quest_pages import quest_select_pages
from methods.base import Method, register
from methods.config import ChunkedPrefill, layer_range, option
from methods.parts import selection
from methods.parts.stores import FullStore, PageBounds, padded_capacity

POOL = ("query_head", "kv_head")


@dataclass(frozen=True)
class QuestConfig(ChunkedPrefill):
    """Quest (mit-han-lab/Quest): page-level top-k from per-page key min/max bounds; dense prefill.
    Defaults follow the reference eval path (evaluation/quest_attention.py)."""

    budget: int = option(4096, "tokens; pages chosen = min(max(min_pages, budget // page_size), n_pages)", min=1)
    page_size: int = option(16, "pages aligned to position 0 (the reference's chunk_size)", min=1)
    dense_layers: int = option(2, "layers 0..dense_layers-1 are always dense", min=0)
    min_pages: int = option(3, "the eval path's floor (Quest issue #22); the kernel path has none (1)", min=1)
    pool: str = option("query_head", "query_head: pages per query head (reference); kv_head: one set per KV head "
                       "from the group's summed bounds (sparse-frontier share_pages)", choices=POOL)
    include_current_page: bool = option(False, "true = kernel path: the current page always attended, "
                                        "counted in the budget, and the budget not clamped to the context")
    clamp_budget: bool = option(True, "true = reference eval path: budget = min(context, budget) before the page "
                                "count (sparsifies contexts shorter than the budget; the kernel path, "
                                "include_current_page, never clamps); false = budget as given")

    @property
    def clamps(self) -> bool:
        # the clamp is the eval path's (evaluation/quest_attention.py); the kernel path has none
        return self.clamp_budget and not self.include_current_page

    def check(self, info):
        layer_range("dense_layers", self.dense_layers, info)

    def describe(self):
        per = "tokens per KV head (pages summed over the group)" if self.pool == "kv_head" else "tokens per query head"
        return {"budget_unit": per, "granularity": f"pages of {self.page_size} aligned to position 0",
                "current_page": ("forced, counted in the budget" if self.include_current_page
                                 else "competes, not forced"),
                "budget_clamped_to_context": self.clamps, "prefill": "dense"}

    @classmethod
    def variants(cls):
        return [{"budget": 16, "page_size": 4},
                {"budget": 12, "page_size": 4, "pool": "kv_head", "include_current_page": True, "min_pages": 1},
                {"budget": 24, "page_size": 8, "clamp_budget": False, "dense_layers": 1, "prefill_chunk": 16}]

    def full_equivalent(self, context):
        # every page of the context, the partial last one included; the reference's clamp to the
        # context would drop that partial page again
        return {"budget": max(self.budget, -(-context // self.page_size) * self.page_size), "clamp_budget": False}


@register
class Quest(Method):
    name = "quest"
    Config = QuestConfig
    graph_safe = True  # static shapes, device lengths: the decode step is capturable
    decode_idempotent = True  # a step writes only its own position (page bounds: min/max)

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        c = self.cfg
        cap = padded_capacity(max_len, c.page_size)  # a page is always one slice of the store
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, cap, info.head_dim, device, dtype)
        self.bounds = getattr(self, "bounds", None) or PageBounds(c.page_size)
        self.bounds.allocate(info.num_layers, batch, info.num_kv_heads, cap, info.head_dim, device, dtype)
        self.batch = batch
        self.page_budget = max(c.min_pages, c.budget // c.page_size)  # host int: the selection's width
        # layer -> (pages, counts, lengths) of the last decode step. The step only keeps references:
        # the readable copies and token counts are made on demand, off the step (~15 small kernels
        # per layer; the suspected cause of a 0.6-1.3 ms/token Quest slowdown seen on the H100 after
        # the method kit, not yet re-measured).
        self._sets: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        # Timing switches of the page top-k (kernels/topk.py; the same pages whatever they are): "auto" =
        # the module's measured choice, 1 = one program per row (the path before issue 33's pass).
        self.topk_chunks = getattr(self, "topk_chunks", "auto")
        self.topk_warps = getattr(self, "topk_warps", None)

    def buffers(self):
        return {**self.store.buffers(), **self.bounds.buffers()}

    def begin(self, step):
        super().begin(step)
        c = self.cfg
        self.lengths = self.device_lengths(step, self.batch)           # KV length after this step
        self.starts = self.lengths - step.length                       # where this step's keys go
        self.pages_valid = (self.lengths - 1) // c.page_size + 1
        # Pages per sequence on the device (no host sync): the reference clamps the budget to the
        # context first, then applies the floor of min_pages.
        budget = torch.clamp(self.lengths, max=c.budget) if c.clamps else torch.full_like(self.lengths, c.budget)
        self.row_budget = torch.clamp(budget // c.page_size, min=c.min_pages).to(torch.int32)

    def attend(self, layer, q, k, v, rope):
        step, c, scale = self.step, self.cfg, self.info.scaling
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.positions, k, v)
        self.bounds.update(layer, k, self.starts)
        if step.phase != "decode":
            keys, values = self.store.view(layer, step.end)
            return kernels.prefill_attention(q, keys, values, scale)
        B = q.shape[0]
        q1, keys, values = q[:, :, 0].contiguous(), self.store.k[layer], self.store.v[layer]
        if layer < c.dense_layers:
            self.record(layer, self.lengths)
            return kernels.decode_attention(q1, keys, values, self.lengths, scale,
                                            max_length=self.store.capacity).view(B, 1, -1)
        pages, counts = self.select(layer, q1)
        self._sets[layer] = (pages, counts, self.lengths)
        out = kernels.sparse_decode_pages(q1, keys, values, pages, counts, c.page_size, self.lengths, scale)
        return out.view(B, 1, -1)

    def select(self, layer: int, q1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Page sets (int32 [B, H, k], counts [B, H]) for the rotated decode query q1 [B, Hq, D];
        H = Hq, or Hkv with pool=kv_head. `selected` shows them with -1 past the counts."""
        c = self.cfg
        kmin, kmax = self.bounds.kmin[layer], self.bounds.kmax[layer]
        if c.pool == "query_head":  # scores + top-k in two kernels on the GPU (kernels/quest_pages.py)
            return quest_select_pages(q1, kmin, kmax, self.pages_valid, self.page_budget,
                                      force_last=c.include_current_page, row_budget=self.row_budget,
                                      chunks=self.topk_chunks, warps=self.topk_warps)
        scores = kernels.quest_page_scores(q1, kmin, kmax, self.pages_valid)  # [B, Hq, n_pages] fp32
        scores = selection.group_reduce(scores, self.info.num_kv_heads, "sum")
        pages, counts = selection.top_pages(scores, self.pages_valid, self.page_budget,
                                            force_last=c.include_current_page, row_budget=self.row_budget)
        return pages, counts

    @property
    def selected(self) -> dict[int, torch.Tensor]:
        """Pages of the last decode step per sparse layer ([B, H, k], -1 past each count)."""
        return {layer: selection.marked(p, n) for layer, (p, n, _) in self._sets.items()}

    def _tokens(self, pages, counts, lengths):
        """Tokens each set attends: whole pages, the current one only up to the length."""
        P = self.cfg.page_size
        live = torch.arange(pages.shape[-1], device=pages.device) < counts.unsqueeze(-1)
        per_page = (lengths.view(-1, 1, 1) - pages * P).clamp(0, P)
        return (per_page * live).sum(-1)

    def stats(self):
        heads = {layer: self._tokens(p, n, lengths) for layer, (p, n, lengths) in sorted(self._sets.items())}
        self._attended.update(heads)
        out = super().stats()
        out["attended_per_head"] = {layer: [round(float(x), 2) for x in n.float().mean(0)] for layer, n in heads.items()}
        return out
