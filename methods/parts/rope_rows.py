"""Rotation by per-row positions: each head's kept keys at their own positions (eviction's re-rotation
at ranks in a bounded store; InfLLM's and LM-Infinite's per-token angles). The one place the per-row RoPE
formula is written, through the model's own table (`Rope.cos_sin`, so HF's rope variants hold here too).
Kept beside methods/parts/rope.py rather than in it: rope.py is measured engine code."""
from __future__ import annotations

import torch

from methods.parts.rope import Rope, rotate_half


def apply_rows(rope: Rope, x: torch.Tensor, positions: torch.Tensor, precise: bool = False) -> torch.Tensor:
    """x [B, H, N, D] rotated by per-row positions [B, H, N] (one cos/sin table for all rows)."""
    cos, sin = rope.cos_sin(positions.reshape(1, -1), x, precise)
    cos, sin = cos.view(*positions.shape, -1), sin.view(*positions.shape, -1)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def ranks(pos: torch.Tensor, n_valid: torch.Tensor | int) -> torch.Tensor:
    """In-cache positions of a bounded store: the rank of each slot's original position `pos` [..., N]
    among the first n_valid slots (later slots rank after them)."""
    slot = torch.arange(pos.shape[-1], device=pos.device)
    keyed = torch.where(slot < n_valid, pos, torch.iinfo(torch.long).max)
    return keyed.argsort(-1).argsort(-1)
