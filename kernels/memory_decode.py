"""One decode query over two token-indexed parts, merged in one combine: InfLLM / Ltri-LLM's local window
(keys rotated at their positions, query q1) and memory (un-rotated keys, the query q2 rotated by the fixed
distance), each a set of token indices into its own store.

`two_part_decode_lse` runs kernels/lse.py's split-K kernel once per part and combines the per-split
partials of BOTH parts in a single pass (a softmax over the union is the merge of its splits, whichever
part they came from): against two `sparse_decode_tokens_lse` calls and `merge_attention`, two combines and
a merge (~40 small kernels per layer in the decode step) become one combine. The reference is exactly
that pair of calls and the merge; the two differ by float rounding only.
"""
from __future__ import annotations

import torch

from ._common import backend_for
from .lse import _combine_lse, _partials, merge_attention, sparse_decode_tokens_lse_ref


def two_part_decode_lse_ref(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, *, scores=None):
    """(out [B, Hq, D], lse [B, Hq]) of q1 over part 1 and q2 over part 2 as one softmax; `scores` as
    sparse_decode_tokens_lse's, for part 1 only."""
    a = sparse_decode_tokens_lse_ref(q1, k1, v1, index1, counts1, scale, scores)
    b = sparse_decode_tokens_lse_ref(q2, k2, v2, index2, counts2, scale)
    return merge_attention([a, b])


def two_part_decode_lse(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, *, scores=None):
    """Conventions of kernels.lse.sparse_decode_tokens_lse for each part (index int32 [B, H, n], counts
    int32 [B, H], a count of 0 allowed); Triton on CUDA, the reference elsewhere."""
    if backend_for(q1) == "torch":
        return two_part_decode_lse_ref(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale,
                                       scores=scores)
    op1, lp1 = _partials(q1, k1, v1, None, scale, index=index1, counts=counts1, scores=scores,
                         n_slots_max=index1.shape[-1], kind="tokens")
    op2, lp2 = _partials(q2, k2, v2, None, scale, index=index2, counts=counts2, n_slots_max=index2.shape[-1],
                         kind="tokens")
    return _combine_lse(torch.cat([op1, op2], 2), torch.cat([lp1, lp2], 2), q1.dtype)
