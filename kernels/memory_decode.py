"""One decode query over two token-indexed parts, merged in one combine: InfLLM / Ltri-LLM's local window
(keys rotated at their positions, query q1) and memory (un-rotated keys, the query q2 rotated by the fixed
distance), each a set of token indices into its own store.

`two_part_decode_mass` runs kernels/lse.py's split-K kernel once per part and combines the per-split
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
from ._common import (
    HAVE_TRITON,
    backend_for,
    kernel_for,
    next_pow2,
    num_sms,
    plan_splits,
    tl,
    triton,
)
from .lse import _partials, merge_attention, sparse_decode_tokens_lse_ref


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


def _two_partials(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, scores, workspace):
    """Both parts' split-K partials into one workspace (op, lp): the window's, then the memory's."""
    parts = [(index1.shape[1], index1.shape[-1]), (index2.shape[1], index2.shape[-1])]
    B, Hq, D = q1.shape
    op, lp = workspace if workspace is not None else two_part_workspace(B, Hq, D, parts, q1.device)
    n1 = _partials(q1, k1, v1, None, scale, index=index1, counts=counts1, scores=scores,
                   n_slots_max=parts[0][1], kind="tokens", into=(op, lp, 0))[1].shape[-1]
    n2 = _partials(q2, k2, v2, None, scale, index=index2, counts=counts2, n_slots_max=parts[1][1],
                   kind="tokens", into=(op, lp, n1))[1].shape[-1]
    assert n1 + n2 == lp.shape[-1] and op.is_contiguous() and lp.is_contiguous(), "workspace for other shapes"
    return op, lp


# --------------------------------------------------------------------------- the decode step's epilogue
# InfLLM's decode step needs, after the combine, the local window's attention mass under the merged lse
# (mass[j] = exp(scale * raw[slot of distance j] - lse) for the valid distances j < n_local, 0 elsewhere),
# held for the next step (PendingMass) with the step's position. In torch that is ~20 small kernels per
# layer (the combine's ~14, the mass's ~7, the hold's 2); `two_part_decode_mass` does it in one launch after
# the two parts' partials. Local window newest first: distance j is position a - j, ring slot (a - j) % R.

def local_mass_ref(scores, lse, first, ring_size: int, n_local: int, scale: float) -> torch.Tensor:
    """mass [B, Hq, n_local] fp32 from the raw logits `scores` [B, Hq, R] at the window's slots."""
    lpos = first - torch.arange(n_local, device=scores.device)
    raw = scores.index_select(-1, lpos.remainder(ring_size))
    ok = torch.isfinite(raw) & (lpos >= 0)
    return torch.where(ok, torch.exp(raw * scale - lse.unsqueeze(-1)), 0.0)


if HAVE_TRITON:

    @triton.jit
    def _epilogue_kernel(Op, Lp, Out, Lse, Sc, First, Mass, Pos, NS, R, NL, scale, s_ob, s_oh, s_sb, s_sh,
                         s_mb, s_mh, HQ, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_J: tl.constexpr):
        # one program per (batch, query head): _common._combine_kernel, then its natural-log lse, then the
        # local mass of the window's n_local newest slots under it, into the pending mass
        pid = tl.program_id(0)
        b = pid // HQ
        h = pid % HQ
        ss = tl.arange(0, BLOCK_S)
        dd = tl.arange(0, D)
        lp = Lp + pid.to(tl.int64) * NS
        op = Op + pid.to(tl.int64) * NS * D
        m = tl.full((), float("-inf"), tl.float32)
        for s0 in range(0, NS, BLOCK_S):
            m = tl.maximum(m, tl.max(tl.load(lp + s0 + ss, mask=s0 + ss < NS, other=float("-inf")), 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        acc = tl.zeros((D,), tl.float32)
        den = tl.zeros((), tl.float32)
        for s0 in range(0, NS, BLOCK_S):
            smask = s0 + ss < NS
            w = tl.exp2(tl.load(lp + s0 + ss, mask=smask, other=float("-inf")) - m)
            o = tl.load(op + (s0 + ss)[:, None] * D + dd[None, :], mask=smask[:, None] & (w[:, None] > 0), other=0.0)
            acc += tl.sum(w[:, None] * o, 0)
            den += tl.sum(w, 0)
        out = acc / tl.where(den > 0, den, 1.0)
        tl.store(Out + b.to(tl.int64) * s_ob + h * s_oh + dd, out.to(Out.dtype.element_ty))
        lse = tl.where(den > 0, (m + tl.log2(tl.where(den > 0, den, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(Lse + pid, lse)
        a = tl.load(First)
        jj = tl.arange(0, BLOCK_J)
        for j0 in range(0, NL, BLOCK_J):
            j = j0 + jj
            lpos = a - j
            slot = ((lpos % R) + R) % R
            raw = tl.load(Sc + b.to(tl.int64) * s_sb + h * s_sh + slot, mask=j < NL, other=0.0)
            ok = (lpos >= 0) & (tl.abs(raw) < float("inf"))   # finite (NaN compares false)
            mass = tl.where(ok, tl.exp(raw * scale - lse), 0.0)
            tl.store(Mass + b.to(tl.int64) * s_mb + h * s_mh + j, mass, mask=j < NL)
        if pid == 0:
            tl.store(Pos, a)


def two_part_decode_mass(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, *, scores, first,
                         ring_size: int, mass_out, pos_out, workspace=None):
    """One combine of both parts (part 1 the local window, its raw logits into `scores` [B, Hq, R]), then the
    local mass [B, Hq, n_local] into `mass_out` (fp32, its last dim contiguous) and `first` ([1] int64,
    the step's position) into `pos_out` [1]: the pending mass of the step. Returns (out, lse)."""
    n_local = mass_out.shape[-1]
    if backend_for(q1) == "torch":
        out, lse = two_part_decode_lse_ref(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale,
                                           scores=scores)
        mass_out.copy_(local_mass_ref(scores, lse, first, ring_size, n_local, scale))
        pos_out.copy_(first)
        return out, lse
    B, Hq, D = q1.shape
    op, lp = _two_partials(q1, k1, v1, index1, counts1, q2, k2, v2, index2, counts2, scale, scores, workspace)
    assert mass_out.stride(-1) == 1 and scores.stride(-1) == 1
    out = torch.empty(B, Hq, D, device=q1.device, dtype=q1.dtype)
    lse = torch.empty(B, Hq, device=q1.device, dtype=torch.float32)
    kernel_for(_epilogue_kernel, op)[(B * Hq,)](
        op, lp, out, lse, scores, first, mass_out, pos_out, lp.shape[-1], ring_size, n_local, float(scale),
        out.stride(0), out.stride(1), scores.stride(0), scores.stride(1), mass_out.stride(0), mass_out.stride(1),
        Hq, D=D, BLOCK_S=16, BLOCK_J=min(1024, next_pow2(n_local)) if q1.is_cuda else 64, num_warps=4)
    return out, lse
