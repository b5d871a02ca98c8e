"""Selection rules shared by methods: functions of scores that return (indices, counts).

Every rule here runs unchanged on every device and inside a captured CUDA graph: no host ints from
the data, fixed output shapes (`counts` says how much of each row is real; padding entries hold 0
and are never read by the sparse kernels).

Score convention: [B, H, S] fp32, -inf where a slot holds no token (H = query heads, or KV heads
after `group_reduce`).
"""
from __future__ import annotations

import torch

import kernels

GROUP_REDUCTIONS = ("softmax_sum", "logit_max", "sum", "max", "mean")


def group_reduce(scores: torch.Tensor, kv_heads: int, how: str, scale: float = 1.0) -> torch.Tensor:
    """Per-query-head scores [B, Hq, S] -> one row per KV head [B, Hkv, S], pooled over its group:
      softmax_sum  sum of the group's attention probabilities softmax(scale * s) (TidalDecode kv_head)
      logit_max    max of the raw scores over the group
      sum/max/mean of the scores as given (e.g. already probabilities: H2O/Cascading reductions).
    Slots that are -inf for the group stay -inf."""
    B, Hq, S = scores.shape
    grouped = scores.view(B, kv_heads, Hq // kv_heads, S)
    if how == "softmax_sum":
        out = torch.softmax(grouped * scale, dim=-1).sum(2)
        return out.masked_fill(grouped[:, :, 0] == float("-inf"), float("-inf"))
    if how in ("logit_max", "max"):
        return grouped.amax(2)
    if how == "sum":
        return grouped.sum(2)
    if how == "mean":
        return grouped.mean(2)
    raise ValueError(f"unknown group reduction {how!r}; one of {GROUP_REDUCTIONS}")


def force(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Scores with the slots `positions` [n] (device) set to +inf: always selected, counted in the
    budget (the current token of TidalDecode's efficiency path)."""
    return scores.index_fill(-1, positions, float("inf"))


def top_tokens(scores: torch.Tensor, lengths: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-`budget` slots per row: (index int32 [B, H, min(budget, S)] sorted by position in the
    valid prefix, counts int32 [B, H] = min(budget, tokens present))."""
    return kernels.topk_positions(scores, lengths, budget)


def top_pages(page_scores: torch.Tensor, pages_valid: torch.Tensor, budget: int, *, force_last: bool,
              row_budget: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top pages per row (Quest): (page index int32 [B, H, min(budget, n_pages)], counts int32 [B, H]).
    `row_budget` int [B] lowers the budget per sequence on the device (Quest's clamp of the budget
    to the context length); the last valid page is always taken with `force_last`."""
    return kernels.quest_topk_pages(page_scores, budget, pages_valid, force_last=force_last, row_budget=row_budget)


def marked(index: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """A readable copy of index sets for tests and analysis: entries past each count set to -1."""
    live = torch.arange(index.shape[-1], device=index.device) < counts.unsqueeze(-1)
    return torch.where(live, index, -1)


def top_first(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last dim, ties to the lower index. torch.topk breaks exact ties
    (repeated tokens give equal un-rotated keys, hence equal block scores; max pooling repeats a peak)
    one way for a row alone, another inside a batch, another on the GPU: a batch must select what each
    sequence selects alone, the GPU what the CPU selects."""
    return torch.sort(x, stable=True, dim=-1, descending=True).indices[..., :k]


def tie_round(x: torch.Tensor, bits: int = 12) -> torch.Tensor:
    """x rounded to a grid of 2^(e - bits) per row (2^e >= the row's largest finite |x|), so that
    ranking decisions are the same on every device and precision: scores that should tie (equal content
    scored through different reduction orders: BLAS tails, CUDA atomics) differ by a few ulps, which
    decides their order one way on the CPU, another on the GPU; after rounding they tie exactly and
    `top_first` gives the lower index. Values within ~2^-bits of the row's scale count as equal."""
    if x.shape[-1] == 0:
        return x
    finite = torch.where(torch.isfinite(x), x.abs(), torch.zeros((), dtype=x.dtype, device=x.device))
    top = finite.amax(-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
    step = torch.exp2(torch.ceil(torch.log2(top)) - bits)
    return torch.where(torch.isfinite(x), torch.round(x / step) * step, x)
