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

# The ranking and the list unpacking (`rank`, `list_positions`) live in kernels/tactic_select.py: they
# are the reference of the fused selection kernel, and kernels must not import methods.


def rows_gather_vec(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """src [B, Hkv, S, D], idx int64 [B, H, M] -> [B, H, M, D] (as `rows_gather`, one vector each)."""
    B, Hkv, _, D = src.shape
    H, M = idx.shape[1:]
    flat = idx.reshape(B, Hkv, (H // Hkv) * M, 1).expand(-1, -1, -1, D)
    return src.gather(2, flat).view(B, H, M, D)


# --- the curve fit (Algorithm 1) -------------------------------------------------------------------

def fit_curve(u1: float, mu1: torch.Tensor, u2: float, mu2: torch.Tensor,
              rising: str = "flat") -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) of y = a/x + b through two window means: mu_j = mean of exp-scores over window j of the
    list, u_j = mean of 1/x over the same ranks (x = rank + 1), so mu_j = a*u_j + b holds exactly for
    the curve. Coinciding windows give a flat tail a = 0, b = mean of the two. A rising fit (a < 0: the
    far window is heavier, noise of an unsorted cluster interior) does too with rising="flat" (the
    config's `rising_fit`, default; the paper leaves the case open); rising="fit" keeps it as fitted."""
    du = u1 - u2
    if du <= 0:
        return torch.zeros_like(mu1), (mu1 + mu2) / 2
    a = (mu1 - mu2) / du
    if rising == "fit":
        return a, mu1 - a * u1
    flat = a <= 0
    b = torch.where(flat, (mu1 + mu2) / 2, mu1 - a * u1)
    return torch.where(flat, torch.zeros_like(a), a), b


def tail_mass(a: torch.Tensor, b: torch.Tensor, lo: int, hi: torch.Tensor, harm: torch.Tensor,
              tail: str = "clip", rising: bool = True) -> torch.Tensor:
    """Fitted mass of list ranks x = lo+1 .. hi (1-based; hi int64 >= lo, same shape as a), in closed form
    with harmonic numbers harm[x] = 1 + 1/2 + .. + 1/x. Where b < 0 the curve reaches 0 at x0 = a / -b.
    tail="clip": sum of max(a/x + b, 0), nothing past x0. tail="literal": Algorithm 1 as written, sum of
    a/x + b as is, negative past x0; its running sum then rises to x0 and falls after, so with `rising`
    hi is cut at x0 (the first k reaching a target lies on the rising part: the bisection's mass_at)
    and without it (the denominator, all n ranks) the whole sum is taken."""
    stop = torch.where(b < 0, torch.floor(a / (-b).clamp_min(1e-30)), torch.full_like(a, float(harm.numel())))
    cut = tail == "clip" or rising
    top = (torch.minimum(hi, stop.clamp(max=harm.numel() - 1).long()) if cut else hi).clamp(min=lo)
    return a * (harm[top] - harm[lo]).to(a.dtype) + b * (top - lo).to(a.dtype)


def min_count(mass_at, target: torch.Tensor, n: int) -> torch.Tensor:
    """Smallest K in [0, n] with mass_at(K) >= target (mass_at non-decreasing; K = n if none), by a
    fixed number of bisection steps (static: no host sync). target [..] -> int64 [..]."""
    lo = torch.zeros(target.shape, dtype=torch.long, device=target.device)
    hi = torch.full_like(lo, n)
    for _ in range(max(1, int(n).bit_length() + 1)):
        mid = (lo + hi) // 2
        ok = mass_at(mid) >= target
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid + 1)
    return torch.minimum(lo, hi)


def per_row(k_heads: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-query-head counts [B, Hq] -> per row [B, rows]: a row shared by a group takes the group's
    largest count (every query head of the group reaches its target)."""
    B, Hq = k_heads.shape
    return k_heads.view(B, rows, Hq // rows).amax(-1)


def top_p_sorted(probs: torch.Tensor, target: float) -> torch.Tensor:
    """Tokens needed, in the given order, for cumulative probability >= target: probs [..., S]
    (already in selection order) -> int64 [...] (all of them when the target is never reached)."""
    cum = probs.cumsum(-1)
    return ((cum < target).sum(-1) + 1).clamp(max=probs.shape[-1])


def harmonic(n: int, device) -> torch.Tensor:
    """harm[x] = sum_{t=1..x} 1/t for x = 0..n, fp32 (accumulated in fp64)."""
    t = torch.arange(n + 1, dtype=torch.float64)
    return torch.cat([torch.zeros(1, dtype=torch.float64), (1.0 / t[1:]).cumsum(0)]).to(device, torch.float32)
