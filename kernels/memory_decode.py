"""One decode query over two token-indexed parts, merged in one combine: InfLLM / Ltri-LLM's local window
(keys rotated at their positions, query q1) and memory (un-rotated keys, the query q2 rotated by the fixed
distance), each a set of token indices into its own store.

`two_part_decode_lse` runs kernels/lse.py's split-K kernel once per part and combines the per-split
partials of BOTH parts in a single pass (a softmax over the union is the merge of its splits, whichever
part they came from): against two `sparse_decode_tokens_lse` calls and `merge_attention`, two combines and
a merge (~40 small kernels per layer in the decode step) become one combine. The reference is exactly
that pair of calls and the merge; the two differ by float rounding only.

Both parts write their partials into one workspace (`two_part_workspace`, allocated once by the method
at setup and declared among its buffers), part 2 at the columns after part 1's, so the combine reads
them where they lie: no per-step allocation and no concatenation in the graph-captured decode step.
"""
from __future__ import annotations

import torch

from . import attention as A
from ._common import backend_for, num_sms, plan_splits
from .lse import _combine_lse, _partials, merge_attention, sparse_decode_tokens_lse_ref


def _splits(probe: torch.Tensor, programs: int, n_slots: int) -> int:
    """Splits kernels.lse._partials plans for a token-indexed part of n_slots columns (its formula)."""
    cfg = A.CONFIG["tokens"]
    block = cfg["block_n"] if probe.is_cuda else A.CPU_BLOCK_N
    return plan_splits(max(n_slots, 1), programs, block, num_sms(probe), cfg["splits_per_sm"], None)[0]


def two_part_workspace(batch: int, q_heads: int, head_dim: int, parts: list[tuple[int, int]], device,
                       old: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The partials of both parts: fp32 (op [B, Hq, NS, D], lp [B, Hq, NS]), NS the two parts' splits
    together; parts = [(index heads H, index width n)] per part. `old` is returned when it fits (a
    captured graph keeps pointing at it). None where the torch reference runs (it needs none)."""
    probe = torch.empty(0, device=device)
    if backend_for(probe) == "torch":
        return None
    ns = sum(_splits(probe, batch * h, n) for h, n in parts)
    shape = (batch, q_heads, ns, head_dim)
    if old is not None and old[0].shape == shape and old[0].device == probe.device:
        return old
    return (torch.empty(shape, device=device, dtype=torch.float32),
            torch.empty(shape[:3], device=device, dtype=torch.float32))


def two_part_decode_lse_ref(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, *, scores=None):
    """(out [B, Hq, D], lse [B, Hq]) of q1 over part 1 and q2 over part 2 as one softmax; `scores` as
    sparse_decode_tokens_lse's, for part 1 only."""
    a = sparse_decode_tokens_lse_ref(q1, k1, v1, index1, counts1, scale, scores)
    b = sparse_decode_tokens_lse_ref(q2, k2, v2, index2, counts2, scale)
    return merge_attention([a, b])


def two_part_decode_lse(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, *, scores=None,
                        workspace=None):
    """Conventions of kernels.lse.sparse_decode_tokens_lse for each part (index int32 [B, H, n], counts
    int32 [B, H], a count of 0 allowed); Triton on CUDA, the reference elsewhere. `workspace`: from
    two_part_workspace for these shapes (None: one is allocated for this call)."""
    if backend_for(q1) == "torch":
        return two_part_decode_lse_ref(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale,
                                       scores=scores)
    parts = [(index1.shape[1], index1.shape[-1]), (index2.shape[1], index2.shape[-1])]
    B, Hq, D = q1.shape
    op, lp = workspace if workspace is not None else two_part_workspace(B, Hq, D, parts, q1.device)
    n1 = _partials(q1, k1, v1, None, scale, index=index1, counts=counts1, scores=scores,
                   n_slots_max=parts[0][1], kind="tokens", into=(op, lp, 0))[1].shape[-1]
    n2 = _partials(q2, k2, v2, None, scale, index=index2, counts=counts2, n_slots_max=parts[1][1],
                   kind="tokens", into=(op, lp, n1))[1].shape[-1]
    assert n1 + n2 == lp.shape[-1], "workspace planned for other shapes"
    return _combine_lse(op, lp, q1.dtype)
