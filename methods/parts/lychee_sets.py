"""LycheeDecode's token-selection modes (HITsz-TMG/TMGNLP LycheeDecode/src/utils/utils.py), as
functions of the retrieval heads' scores returning (index int32 [B, n, k], counts int32 [B, n]) in
the kit's convention (methods/parts/selection.py): the valid prefix of a row is sorted by position,
padding holds 0. Scores: fp32 [B, n, S], unscaled q̄·K, -inf at or past each length. Every rule is
device-only (no host int from the data) and has a fixed output shape.

  topk       get_sparse_attn_mask_from_topk: the first `sink` and last `recent` tokens are forced in
             and COUNT in the budget; the remaining budget - sink - recent go to the best others;
             budget <= sink + recent keeps sinks + recent only (so the set can exceed the budget).
  ratio      get_sparse_attn_mask_from_radio: topk with budget int((1 - ratio) * length) (ratio =
             the sparsity), the same forced sinks and recent tokens.
  topp       get_sparse_attn_mask_from_topp: the smallest prefix of tokens by probability whose
             mass before the last one is <= p (probabilities softmax(scale * s)); nothing forced.
  threshold  get_sparse_attn_mask_from_threshold: tokens with probability > tau; nothing forced.
"""
from __future__ import annotations

import math

import torch

from kernels.topk import topk_positions


def _pos(scores: torch.Tensor) -> torch.Tensor:
    return torch.arange(scores.shape[-1], device=scores.device)


def forced(scores: torch.Tensor, lengths: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """[B, 1, S] bool: the sink and recent slots of each sequence (inside its length)."""
    pos = _pos(scores).view(1, 1, -1)
    n = lengths.view(-1, 1, 1)   # int32 against int64 positions: compared as int64, no conversion launch
    return ((pos < sink) | (pos >= n - recent)) & (pos < n)


# Token rows longer than this go to torch.topk + sort, shorter ones to kernels/topk.py's radix kernel in two
# stages (C chunks, each chunk's top-k, then the row's top-k of the C x k candidates): the dispatch cut for
# LycheeDecode's k = 4096 token sets (kernels/topk.py keeps 32K for its other callers). Estimated, not
# measured (issue 33), from the one-stage kernel's H100 times at k = 4096 (results/bench/
# lychee_kernels_h100.json: 0.068 ms at 16K, 0.58 ms at 128K: ~4.3 us per 1K scores a program, the rows
# side by side) against torch.topk + sort (0.12-0.15 ms at 16K, 0.11-0.17 ms at 128K, ~30 kernels a call,
# each ~2 us more in a CUDA graph). Two stages read S / C + C k scores in sequence (token_chunks):
# ~23K at 32K (~0.10 ms), ~33K at 64K (~0.14 ms), ~40K at 96K (~0.17 ms), ~47K at 128K (~0.20 ms): ahead of
# torch up to ~64K-96K, behind it at 128K. The capacity sits a few hundred slots past the context, so
# the cut is 96K. Timing switches: LycheeDecode's topk_radix_max / topk_chunks (bench.profile_decode --alt).
RADIX_MAX = 98304


def token_chunks(S: int, k: int) -> int:
    """Chunks of the two-stage top-k for a token row of S scores and k = 4096-like budgets: stage 1 reads
    S / C scores a program, stage 2 C k candidates, each about linearly in what it reads, so C = sqrt(S / k)
    balances them (kernels/topk.py's "auto" cuts k = 4096 rows into 16K chunks: 16K + 12K scores at 32K,
    against 11K + 12K here). kernels/topk.py's chunk_plan falls back to one stage where C k > S / 2."""
    return max(1, round(math.sqrt(S / max(1, k))))


def topk(scores, lengths, budget: int, sink: int, recent: int, out=None, rows=None, boosted: bool = False,
         radix_max: int | None = None, chunks=None, block: int | None = None):
    """Top-`budget` set per row with sinks and recent tokens forced in and counted. out/rows: write the
    sets in place (kernels.topk.topk_positions). boosted: the scores already hold +inf at the forced
    slots (and -inf elsewhere where budget <= sink + recent): LycheeDecode's attention kernel writes them
    so (kernels.hybrid_decode's score_force). radix_max: the radix/torch cut (None: RADIX_MAX). chunks: the
    radix kernel's two-stage split (None: token_chunks; "auto": kernels/topk.py's; an int), block: its
    scores per loop step (None: its default, 1024 on CUDA): the same set either way."""
    S = scores.shape[-1]
    k = min(max(int(budget), sink + recent), S)
    chunks = token_chunks(S, k) if chunks is None else chunks
    if not boosted:
        force = forced(scores, lengths, sink, recent)
        scores = scores.masked_fill(force, float("inf"))   # one launch (a where with a scalar is two)
        if budget <= sink + recent:
            # only the forced tokens: rank them first, drop every other slot
            scores = scores.masked_fill(~torch.isposinf(scores), float("-inf"))
    return topk_positions(scores, lengths, k, out=out, rows=rows, chunks=chunks, block=block,
                          radix_max=RADIX_MAX if radix_max is None else radix_max)


def top_blocks(block_scores, budget_blocks: int, out=None, rows=None, chunks=None):
    """The block-level path (modeling_llama_block_level.py, get_sparse_block_indices_from_topk): the
    top `budget_blocks` blocks by max-pooled q̄·K, nothing forced. Block scores are -inf past the length.
    chunks: the top-k's two-stage split (kernels/topk.py; the same blocks), a timing switch."""
    return topk_positions(block_scores, None, budget_blocks, out=out, rows=rows,
                          chunks="auto" if chunks is None else chunks)


def from_mask(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A selection mask [B, n, S] -> (positions sorted ascending, padded with 0; counts)."""
    S = mask.shape[-1]
    key = torch.where(mask, _pos(mask), S)
    idx = key.sort(-1).values
    return torch.where(idx == S, 0, idx).to(torch.int32), mask.sum(-1).to(torch.int32)


def ratio(scores, lengths, sparsity: float, sink: int, recent: int):
    """topk with a per-sequence budget int((1 - sparsity) * length), computed on the device in float64
    (Python's int(float) truncation of the reference)."""
    n = lengths.view(-1, 1, 1).long()
    budget = torch.floor((1.0 - sparsity) * n.double()).long()
    must = forced(scores, lengths, sink, recent)
    n_forced = must.sum(-1, keepdim=True)
    keep = torch.maximum(torch.minimum(budget, n), n_forced)  # budget <= forced count: forced only
    boosted = torch.where(must, float("inf"), scores)
    order = boosted.sort(dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, _pos(scores).expand_as(order))
    mask = (rank < keep) & (scores > float("-inf"))
    return from_mask(mask)


def probabilities(scores: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.softmax(scores * scale, dim=-1)  # -inf past the length -> exactly 0


def topp(scores, lengths, p: float, scale: float):
    probs = probabilities(scores, scale)
    srt, order = probs.sort(dim=-1, descending=True, stable=True)
    keep_sorted = (srt.cumsum(-1) - srt) <= p
    mask = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted) & (scores > float("-inf"))
    return from_mask(mask)


def threshold(scores, lengths, tau: float, scale: float):
    mask = (probabilities(scores, scale) > tau) & (scores > float("-inf"))
    return from_mask(mask)


def sink_recent(lengths: torch.Tensor, heads: int, sink: int, recent: int, span: int):
    """DuoAttention's streaming set: the first `sink` and last `recent` tokens of each sequence
    (index [B, heads, min(sink + recent, span)], counts [B, heads])."""
    B = lengths.shape[0]
    k = min(sink + recent, span)
    j = torch.arange(k, device=lengths.device).view(1, 1, k)
    n = lengths.view(B, 1, 1).long()
    first = min(sink, k)
    n_sink = torch.clamp(n, max=first)                        # sinks present
    start = torch.maximum(n - recent, n_sink)                 # recent window, not overlapping sinks
    pos = torch.where(j < n_sink, j, start + (j - n_sink))
    count = n_sink + (n - start)
    pos = torch.where(j < count, pos, 0)
    return pos.expand(B, heads, k).to(torch.int32).contiguous(), count.view(B, 1).expand(B, heads).to(torch.int32).contiguous()
