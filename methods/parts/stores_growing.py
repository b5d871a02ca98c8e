"""A full store that grows to what a rule keeps (SnapKV, PyramidKV: the prompt compressed once, every
later token kept): sized when the rule knows its size, never for the whole run per head. Kept beside
methods/parts/stores.py rather than in it: stores.py is measured engine code."""
from __future__ import annotations

import torch

from methods.parts.stores import FullStore


class GrowingStore(FullStore):
    def grow(self, capacity: int) -> None:
        """At least `capacity` slots, the filled ones kept. New tensors (the engine re-captures its graph),
        normal ones even when grown inside the engine's inference mode: like setup's, a later sample (or a
        test) may write them outside it."""
        if capacity <= self.capacity:
            return
        shape = (*self.k.shape[:3], capacity, self.k.shape[4])
        with torch.inference_mode(False), torch.no_grad():
            for name in ("k", "v"):
                old, new = getattr(self, name), self.k.new_empty(shape)
                new[:, :, :, :self.capacity] = old
                setattr(self, name, new)
        self.capacity = capacity
