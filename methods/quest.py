"""Quest (mit-han-lab/Quest): query-aware page selection from per-page key min/max bounds.

Reference eval path (evaluation/quest_attention.py), the default here:
  * layers < dense_layers (2) and every prefill are dense; the full KV cache is kept (rotated keys
    at absolute positions, so pages are aligned to position 0);
  * a decode step scores each page of `page_size` (16) tokens by the upper bound
    sum_d max(q_d*kmin_d, q_d*kmax_d) in fp32 (no 1/sqrt(d): ranking is unaffected), per QUERY head;
  * it keeps the top k = min(max(min_pages, budget // page_size), n_pages) pages per query head
    (Quest issue #22: the floor of 3 pages sparsifies even when the context fits the budget);
    the current (partial) page competes like any other; exact attention over the chosen pages.
Options:
  pool: kv_head            one page set per KV head, scored by the sum of its query heads' bounds
                           (sparse-frontier `share_pages`), so a group reads one budget, not g.
  include_current_page     the kernel path (quest/): the budget counts the current page, which is
                           always attended, plus the top k-1 of the other pages. The kernel path has
                           no 3-page floor: set min_pages: 1 with it to match.
Page min/max are kept incrementally on append (`PageBounds`); the eval path recomputes them from
all keys each step, which gives the same values (min/max are exact).
"""
from __future__ import annotations

import torch

import kernels
from methods import attention
from methods.base import Method, register
from methods.stores import FullStore, PageBounds, padded_capacity
from common.errors import ConfigError


@register
class Quest(Method):
    name = "quest"
    graph_safe = True  # the CUDA decode path (kernels, device lengths) is static-shape

    def __init__(self, cfg):
        super().__init__(cfg)
        self.budget = int(cfg.get("budget", 4096))
        self.page_size = int(cfg.get("page_size", 16))
        self.dense_layers = int(cfg.get("dense_layers", 2))
        self.min_pages = int(cfg.get("min_pages", 3))
        self.pool = str(cfg.get("pool", "query_head"))
        self.include_current = bool(cfg.get("include_current_page", False))
        self._heads: dict[int, torch.Tensor] = {}
        self.selected: dict[int, torch.Tensor] = {}  # layer -> page indices of the last decode step

    @classmethod
    def validate(cls, cfg, info):
        super().validate(cfg, info)
        for key, low, default in (("budget", 1, None), ("page_size", 1, 16), ("min_pages", 1, 3)):
            val = cfg.get(key, default)
            if val is None or int(val) < low:
                raise ConfigError(f"method.{key} must be an integer >= {low}, got {val}")
        dense = int(cfg.get("dense_layers", 2))
        if not 0 <= dense < info.num_layers:
            raise ConfigError(f"method.dense_layers={dense} is outside [0, {info.num_layers}) for this "
                              f"{info.num_layers}-layer model")
        if cfg.get("pool", "query_head") not in ("query_head", "kv_head"):
            raise ConfigError(f"method.pool must be query_head or kv_head, got {cfg.get('pool')!r}")

    def setup(self, info, batch, max_len, device, dtype):
        self.info = info
        cap = padded_capacity(max_len, self.page_size)  # a page is always one slice of the store
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, cap, info.head_dim, device, dtype)
        self.bounds = getattr(self, "bounds", None) or PageBounds(self.page_size)
        self.bounds.allocate(info.num_layers, batch, info.num_kv_heads, cap, info.head_dim, device, dtype)
        self._heads = {}
        self.selected: dict[int, torch.Tensor] = {}
        self.batch = batch

    def begin(self, step):
        super().begin(step)
        L = step.end
        n_pages = -(-L // self.page_size)
        # Host ints only: the selection sizes never need a device sync.
        self.n_pages = n_pages
        self.n_select = min(max(self.min_pages, self.budget // self.page_size), n_pages)
        if step.phase == "decode" and step.positions.is_cuda:
            self.lengths = self.device_lengths(step, self.batch)
            self.pages_valid = (self.lengths - 1) // self.page_size + 1

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        if step.phase == "decode" and q.is_cuda:
            return self._attend_kernels(layer, q, k, v)
        self.store.write(layer, step.start, k, v)
        self.bounds.update(layer, self.store.k[layer], step.start, step.end)
        keys, values = self.store.view(layer, step.end)
        if step.phase != "decode" or layer < self.dense_layers:
            self.record(layer, step.end)
            return attention.dense(q, keys, values, scale=self.info.scaling)
        pages = self.select(layer, q)
        self.selected[layer] = pages  # kept by reference (no copy) for tests and analysis
        out, attended = attention.paged(q, keys, values, pages, self.page_size, step.end, scale=self.info.scaling)
        self.record(layer, attended)
        self._heads[layer] = attended
        return out

    def _attend_kernels(self, layer, q, k, v):
        """GPU decode: Triton kernels (page bounds update, bounds, page-sparse attention) over the
        full-capacity store with lengths on the device: no host sync, graph-capturable. Same
        selection rule as `select`: top max(min_pages, budget // page_size) pages (clamped by the
        valid pages through `counts`), the current page forced with include_current_page."""
        keys, values = self.store.k[layer], self.store.v[layer]
        pos = self.step.positions
        keys.index_copy_(2, pos, k)
        values.index_copy_(2, pos, v)
        kmin, kmax = self.bounds.kmin[layer], self.bounds.kmax[layer]
        kernels.quest_update_pages(kmin, kmax, k, self.lengths - 1, self.page_size)
        B = q.shape[0]
        q1, scale = q[:, :, 0].contiguous(), self.info.scaling
        if layer < self.dense_layers:
            self.record(layer, self.lengths)
            out = kernels.decode_attention(q1, keys, values, self.lengths, scale, max_length=self.store.capacity)
            return out.view(B, 1, -1)
        scores = kernels.quest_page_scores(q1, kmin, kmax, self.pages_valid)  # [B, Hq, n_pages]
        if self.pool == "kv_head":
            Hq, P = scores.shape[1:]
            scores = scores.view(B, self.info.num_kv_heads, Hq // self.info.num_kv_heads, P).sum(2)
        k_pages = max(self.min_pages, self.budget // self.page_size)
        pages, counts = kernels.quest_topk_pages(scores, k_pages, self.pages_valid, force_last=self.include_current)
        self.selected[layer] = pages
        self.record(layer, counts * self.page_size)  # whole pages (the current one may be partial)
        out = kernels.sparse_decode_pages(q1, keys, values, pages, counts, self.page_size, self.lengths, scale)
        return out.view(B, 1, -1)

    def select(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Page indices [B, H, k] (H = Hq, or Hkv with pool=kv_head) for rotated decode query q."""
        kmin, kmax = self.bounds.view(layer, self.step.end)
        scores = attention.quest_scores(q, kmin, kmax)  # [B, Hq, n_pages] fp32
        if self.pool == "kv_head":
            B, Hq, P = scores.shape
            scores = scores.view(B, self.info.num_kv_heads, Hq // self.info.num_kv_heads, P).sum(2)
        if not self.include_current:
            return scores.topk(self.n_select, dim=-1).indices
        # Kernel path: the current page is always attended and counts against the budget.
        cur = self.n_pages - 1
        others = scores[..., :cur].topk(min(self.n_select - 1, cur), dim=-1).indices
        last = torch.full_like(others[..., :1], cur)
        return torch.cat([others, last], dim=-1)

    def stats(self):
        out = super().stats()
        out["attended_per_head"] = {layer: [round(float(x), 2) for x in n.float().mean(0)]
                                    for layer, n in sorted(self._heads.items())}
        return out

    def semantics(self):
        return {"method": self.name, "budget": self.budget, "page_size": self.page_size,
                "dense_layers": self.dense_layers, "min_pages": self.min_pages, "pool": self.pool,
                "include_current_page": self.include_current, "prefill_chunk": self.prefill_chunk,
                "budget_unit": ("tokens per KV head (pages summed over the group)" if self.pool == "kv_head"
                                else "tokens per query head"),
                "granularity": f"pages of {self.page_size} aligned to position 0",
                "current_page": "forced, counted in the budget" if self.include_current else "competes, not forced",
                "prefill": "dense"}
