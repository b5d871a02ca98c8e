"""PyramidKV (Zefan-Cai/KVCache-Factory `PyramidKVCluster`, as vendored by Cascading's
cascade/models/pyramid_kv_utils.py): SnapKV's selection with a per-layer budget that shrinks
linearly with depth, the total about the same as SnapKV's.

Per layer l of L, with C = max_capacity_prompt, w = window, n = prompt length (integer arithmetic,
as the reference): min = (C - w) // beta, max = 2 (C - w) - min; if max >= n - w then max = n - w
and min = 2 (C - w) - max; step = (max - min) // (L - 1); the layer keeps max - l * step tokens
before the window. A prompt shorter than C is kept whole and one shorter than 2 (C - w) gets
SnapKV's uniform C - w, as the reference does. Everything else is SnapKV's (methods/snapkv.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from methods.base import register
from methods.config import option
from methods.snapkv import SnapKV, SnapKVConfig


@dataclass(frozen=True)
class PyramidKVConfig(SnapKVConfig):
    """PyramidKV (KVCache-Factory PyramidKVCluster): SnapKV with a per-layer budget shrinking linearly with
    depth (more tokens in lower layers); `budget` is the mean per layer (max_capacity_prompt)."""

    beta: int = option(20, "pyramid steepness: the top layer keeps about (budget - window) / beta tokens", min=1)

    def describe(self):
        return {**super().describe(), "per_layer": f"pyramid, beta={self.beta}: lower layers keep more, mean = budget"}

    @classmethod
    def variants(cls):
        return [{"budget": 16, "window": 4, "beta": 4},
                {"budget": 14, "window": 3, "beta": 2, "heads": "kv_group", "prefill_chunk": 24}]


@register
class PyramidKV(SnapKV):
    name = "pyramidkv"
    Config = PyramidKVConfig

    def keep_bound(self) -> int:
        """The lowest layer keeps at most 2 (C - w) - min before the window, below 2 (C - w)."""
        return max(self.cfg.budget, 2 * (self.cfg.budget - self.cfg.window) + self.cfg.window)

    def prefix_keep(self, layer: int, n_prefix: int) -> int:
        c, L = self.cfg, self.info.num_layers
        C, w, n = c.budget, c.window, n_prefix + c.window
        if n < 2 * (C - w) or L < 2:
            return C - w
        lo = (C - w) // c.beta
        hi = 2 * (C - w) - lo
        if hi >= n - w:
            hi = n - w
            lo = 2 * (C - w) - hi
        return hi - layer * ((hi - lo) // (L - 1))
