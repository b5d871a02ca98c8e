"""Rotary embedding by arbitrary positions, through the model's own rotary module.

Using the HF module (rather than re-deriving inv_freq) keeps every rope variant the model family
supports (Llama-3 scaling, linear, YaRN with its attention factor) exactly as HF computes it.
"""
from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rope:
    def __init__(self, rotary_module: torch.nn.Module):
        self.module = rotary_module
        rope_type = getattr(rotary_module, "rope_type", "default")
        if rope_type == "dynamic":
            # Dynamic NTK changes inv_freq with the sequence length seen so far; a cache of
            # rotated keys would then be stale. Refuse rather than be silently wrong.
            from common.errors import ConfigError

            raise ConfigError("dynamic NTK rope scaling is not supported (cached keys would go stale)")
        self._cache: list = []

    def new_step(self) -> None:
        """Forget cached tables (called by the engine at the start of every step)."""
        self._cache.clear()

    def cos_sin(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [..., T, D] for integer `positions` of shape [T] or [B, T].

        Within a step every layer rotates by the same positions tensor: the table is computed
        once per (tensor, dtype) and reused (it is 2 of ~45 kernels per layer otherwise)."""
        for pos_ref, dtype, cos, sin in self._cache:
            if pos_ref is positions and dtype == like.dtype:
                return cos, sin
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)
        cos, sin = self.module(like, pos)
        self._cache.append((positions, like.dtype, cos, sin))
        if len(self._cache) > 4:
            self._cache.pop(0)
        return cos, sin

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [B, H, T, D] by positions [T] (shared across batch) or [B, T]."""
        cos, sin = self.cos_sin(positions, x)
        if x.is_cuda:  # one fused kernel instead of ~8 element-wise ones (same rounding)
            from kernels.fused import rope

            return rope(x, cos, sin)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        return (x * cos + rotate_half(x) * sin).to(x.dtype)
