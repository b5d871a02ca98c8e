"""Tactic's selection rules as functions of scores (device-only, static shapes, no host ints taken
from the data), in the style of methods/parts/selection.py.

Vocabulary. A *row* is one selection set: a query head (H = Hq) or a KV head shared by its group
(H = Hkv). Clusters are ranked per row by q.centroid; unpacking them in rank order gives the
*sorted token list* of the row (rank j = 0, 1, ...; inside a cluster, tokens by position). The
*exact set* E (positional sinks + the recent, not yet clustered tokens) is outside the list and
always attended. A budget K is a count of list tokens: the row attends list ranks 0..K-1 plus E.
"""
from __future__ import annotations

import torch

# The ranking and the list unpacking (`rank`, `list_positions`) live in kernels/tactic_select.py, the
# curve fit and the bisection (`fit_curve`, `tail_mass`, `min_count`, `harmonic`) in kernels/tactic_fit.py:
# they are the references of fused kernels, and kernels must not import methods.
from kernels.tactic_fit import fit_curve, harmonic, min_count, tail_mass  # noqa: F401  (re-exported)


def rows_gather_vec(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """src [B, Hkv, S, D], idx int64 [B, H, M] -> [B, H, M, D] (as `rows_gather`, one vector each)."""
    B, Hkv, _, D = src.shape
    H, M = idx.shape[1:]
    flat = idx.reshape(B, Hkv, (H // Hkv) * M, 1).expand(-1, -1, -1, D)
    return src.gather(2, flat).view(B, H, M, D)


def per_row(k_heads: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-query-head counts [B, Hq] -> per row [B, rows]: a row shared by a group takes the group's
    largest count (every query head of the group reaches its target)."""
    B, Hq = k_heads.shape
    if rows == Hq:   # one row per query head: nothing to reduce (an amax would still be a launch)
        return k_heads
    return k_heads.view(B, rows, Hq // rows).amax(-1)


def top_p_sorted(probs: torch.Tensor, target: float) -> torch.Tensor:
    """Tokens needed, in the given order, for cumulative probability >= target: probs [..., S]
    (already in selection order) -> int64 [...] (all of them when the target is never reached)."""
    cum = probs.cumsum(-1)
    return ((cum < target).sum(-1) + 1).clamp(max=probs.shape[-1])
