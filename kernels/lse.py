"""Decode attention that also returns its log-sum-exp, and the merge of attention parts.

A method that attends one query to several key sets under different rotations (InfLLM/Ltri-LLM:
the local window at real relative positions, the memory at a fixed distance; LM-Infinite: the
window and the sinks at the distance cap) computes each part's normalised output and log-sum-exp
and merges them with `merge_attention`: the result equals one softmax over the union of the parts
(the two-stage online softmax of InfLLM's `dot_production_attention`).

Conventions as kernels/attention.py: q [B, Hq, D], k/v [B, Hkv, S_cap, D], lengths int32 [B] (here
0 is allowed: an empty part gives out 0 and lse -inf). lse is fp32, natural log, of the SCALED
logits: lse = log sum_j exp(scale * q.k_j). The Triton path runs attention.py's split-K kernel and
merges its per-split partials here (in torch: [B, Hq, splits] floats), so no second kernel exists
to drift from the first.
"""
from __future__ import annotations

import math

import torch

from . import attention as A
from ._common import LOG2E, backend_for, kernel_for, next_pow2, num_sms, plan_splits

LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- merge

def merge_attention(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge normalised attention parts [(out [..., D], lse [...])] into (out, lse) of the union.

    out_i may be anything (garbage, NaN) where lse_i is -inf: such a part has no keys and weighs 0
    (where(), not 0 x out). All parts empty -> out 0, lse -inf. Math in fp32, out in part 0's dtype."""
    lses = torch.stack([lse.float() for _, lse in parts])
    m = lses.amax(0)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    acc, den = None, torch.zeros_like(m_safe)
    for out, lse in parts:
        w = torch.where(torch.isfinite(lse), torch.exp(lse.float() - m_safe), torch.zeros_like(m_safe))
        term = torch.where(w.unsqueeze(-1) > 0, w.unsqueeze(-1) * out.float(), 0.0)
        acc = term if acc is None else acc + term
        den = den + w
    out = acc / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(den > 0, m_safe + torch.log(torch.where(den > 0, den, torch.ones_like(den))),
                      torch.full_like(den, float("-inf")))
    return out.to(parts[0][0].dtype), lse


# ----------------------------------------------------------------------------- torch references

def _softmax_parts(s: torch.Tensor, valid: torch.Tensor, vs: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """s [B, Hq, N] scaled fp32 logits, valid [B, Hq, N], vs [B, Hq, N, D] -> (out, lse)."""
    s = torch.where(valid, s, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(valid, torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1)), 0.0)
    vs = torch.where(valid.unsqueeze(-1), vs.float(), 0.0)
    return torch.einsum("bhn,bhnd->bhd", p, vs).to(dtype), lse


def decode_attention_lse_ref(q, k, v, lengths, scale, max_length=None):
    B, Hq, _ = q.shape
    Hkv = k.shape[1]
    S = int(max_length) if max_length is not None else int(lengths.max())
    S = min(S, k.shape[2])
    live = (torch.arange(S, device=q.device) < lengths.view(-1, 1, 1).long()).expand(B, Hq, S)
    s = A._logits_ref(q, k, S) * scale
    vs = v[:, :, :S].repeat_interleave(Hq // Hkv, 1)
    return _softmax_parts(s, live, vs, q.dtype)


def sparse_decode_tokens_lse_ref(q, k, v, index, counts, scale, scores=None):
    B, Hq, _ = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    n = index.shape[-1]
    R = Hq // index.shape[1]
    valid = (torch.arange(n, device=q.device) < counts.unsqueeze(-1).long()).repeat_interleave(R, 1)
    pos = index.long().clamp(0, S - 1).repeat_interleave(R, 1)
    kvh = (torch.arange(Hq, device=q.device) // (Hq // Hkv)).view(1, Hq, 1)
    bi = torch.arange(B, device=q.device).view(B, 1, 1)
    ks, vs = k[bi, kvh, pos], v[bi, kvh, pos]
    raw = torch.einsum("bhd,bhnd->bhn", q.float(), ks.float())
    if scores is not None:  # raw q.k at each valid slot; other columns untouched (as the kernel)
        cur = scores.gather(-1, pos)
        scores.scatter_(-1, pos, torch.where(valid, raw, cur))
    return _softmax_parts(raw * scale, valid, vs, q.dtype)


# ----------------------------------------------------------------------------- Triton path

def _partials(q, k, v, lengths, scale, *, index=None, counts=None, scores=None, n_slots_max: int, kind: str,
              into=None):
    """attention.py's split-K kernel, stopped before its combine: (op [B, Hq, NS, D] fp32 normalised
    per split, lp [B, Hq, NS] base-2 lse per split, -inf for an empty split). `into` (op, lp, first):
    write the splits at columns first.. of these preallocated tensors (memory_decode's workspace)."""
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    assert Hq % Hkv == 0 and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert D >= 16 and D == next_pow2(D), "head dim must be a power of two >= 16"
    G = Hq // Hkv
    indexed = index is not None
    H = index.shape[1] if indexed else Hkv
    R = Hq // H
    cfg = A.CONFIG[kind]
    block = cfg["block_n"] if q.is_cuda else A.CPU_BLOCK_N
    ns, chunk = plan_splits(max(n_slots_max, 1), B * H, block, num_sms(q), cfg["splits_per_sm"], None)
    if into is None:
        op = A._empty(B, Hq, ns, D, device=q.device, dtype=torch.float32)
        lp = A._empty(B, Hq, ns, device=q.device, dtype=torch.float32)
        row = ns
    else:   # the kernel's row stride is NS: the whole workspace's, its base pointer moved to column `first`
        row, first = into[1].shape[-1], into[2]
        assert first + ns <= row
        op, lp = into[0][:, :, first:], into[1][:, :, first:]
    lens = lengths if lengths is not None else counts
    idx = index if indexed else lens
    cnt = counts if indexed else lens
    sc = scores if scores is not None else op
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    kernel_for(A._split_attn_kernel, q)[(B * H, ns)](
        q, k, v, lens, idx, cnt, sc, op, lp, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        idx.stride(0), idx.stride(1) if idx.dim() > 1 else 0, cnt.stride(0),
        sc.stride(0), sc.stride(1), H, sc.shape[-1] if scores is not None else 0, chunk, row,
        R=R, G=G, R_PAD=max(16, next_pow2(R)), D=D, BLOCK_N=block, PAGE=1, INDEXED=indexed,
        LEN_MASK=not indexed, WRITE_SCORES=scores is not None, PREC=prec, UPCAST=upcast,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return op[:, :, :ns], lp[:, :, :ns]


def _combine_lse(op: torch.Tensor, lp: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split partials into (out [B, Hq, D], natural-log lse [B, Hq]); all splits empty -> (0, -inf)."""
    m = lp.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp2(lp - m)
    den = w.sum(-1)
    out = (w.unsqueeze(-1) * torch.where(w.unsqueeze(-1) > 0, op, 0.0)).sum(-2)
    out = out / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(den > 0, (m.squeeze(-1) + torch.log2(torch.where(den > 0, den, torch.ones_like(den)))) * LN2,
                      torch.full_like(den, float("-inf")))
    return out.to(dtype), lse


# ----------------------------------------------------------------------------- public ops

def decode_attention_lse(q, k, v, lengths, scale, *, max_length=None):
    """Decode attention over the prefix of `lengths` slots (0 allowed) -> (out [B, Hq, D], lse [B, Hq])."""
    if backend_for(q) == "torch":
        return decode_attention_lse_ref(q, k, v, lengths, scale, max_length)
    S = int(max_length) if max_length is not None else int(lengths.max())
    op, lp = _partials(q, k, v, lengths, scale, n_slots_max=S, kind="dense")
    return _combine_lse(op, lp, q.dtype)


def sparse_decode_tokens_lse(q, k, v, index, counts, scale, *, scores=None):
    """Decode attention over token index sets (as `sparse_decode_tokens`: index int32 [B, H, n], H = Hq
    or Hkv, counts int32 [B, H]) -> (out, lse). With `scores` (fp32 [B, Hq, S_cap]) the raw q.k of every
    attended slot is written at that slot's column (one pass over K); other columns are left as they
    were: the attention statistic InfLLM accumulates for its local window."""
    if backend_for(q) == "torch":
        return sparse_decode_tokens_lse_ref(q, k, v, index, counts, scale, scores)
    op, lp = _partials(q, k, v, None, scale, index=index, counts=counts, scores=scores,
                       n_slots_max=index.shape[-1], kind="tokens")
    return _combine_lse(op, lp, q.dtype)
