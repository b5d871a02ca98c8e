"""Hybrid-head decode (LycheeDecode, DuoAttention): in one layer, some KV heads ("retrieval") attend
every cached token while the others ("sparse"/"streaming") attend only their KV head's index set;
and the retrieval heads' selection scores.

Conventions as kernels/attention.py: q [B, Hq, D]; k, v [B, Hkv, S_cap, D]; lengths int32 [B];
`retrieval` bool [Hkv] on the device (one layer's roles); index int32 [B, Hkv, Kmax] per KV head
(shared by its query group) with counts int32 [B, Hkv]; entries at or past a count are padding.
Rows of retrieval heads in index/counts are ignored.

`retrieval_scores`: the reference's selection score, q̄·K UNSCALED with q̄ the query averaged over
the GQA group (LycheeDecode's avg_pool2d over the query-head axis), over the whole cache, for the
KV heads `heads` (int64 [n]): fp32 [B, n, S], -inf at or past each length. `block` > 1 pools the
scores per block of `block` slots by max (the block-level path; see hybrid_triton.py).

Dispatch: the torch references off CUDA; on CUDA the Triton kernels of kernels/hybrid_triton.py
(one grid for both head kinds, work split so that every program reads about the same number of
blocks, then one combine).
"""
from __future__ import annotations

import torch

from ._common import backend_for
from .attention import _live, _span, decode_attention_ref, sparse_decode_tokens_ref

# ----------------------------------------------------------------------------- torch references

def retrieval_scores_ref(q, k, lengths, heads, max_length=None, block: int = 1):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    S = _span(lengths, max_length)
    qbar = q.float().view(B, Hkv, Hq // Hkv, D).mean(2).index_select(1, heads)
    ks = k[:, :, :S].index_select(1, heads).float()
    live = _live(lengths, S)
    s = torch.where(live, torch.einsum("bhd,bhsd->bhs", qbar, torch.where(live.unsqueeze(-1), ks, 0.0)),
                    float("-inf"))
    if block > 1:
        pad = (-S) % block
        s = torch.nn.functional.pad(s, (0, pad), value=float("-inf")).view(B, -1, (S + pad) // block, block).amax(-1)
    return s


def force_scores_ref(scores, lengths, sink: int, recent: int, only: bool = False):
    """Token scores [B, n, S] with the first `sink` and last `recent` slots below each length at +inf
    (LycheeDecode's forced tokens); `only`: every other slot -inf."""
    pos = torch.arange(scores.shape[-1], device=scores.device).view(1, 1, -1)
    n = lengths.to(scores.device).view(-1, 1, 1)
    forced = ((pos < sink) | (pos >= n - recent)) & (pos < n)
    base = torch.full_like(scores, float("-inf")) if only else scores
    return base.masked_fill(forced, float("inf"))


def hybrid_decode_ref(q, k, v, lengths, retrieval, index, counts, scale, max_length=None):
    Hq = q.shape[1]
    G = Hq // k.shape[1]
    dense = decode_attention_ref(q, k, v, lengths, scale, max_length)
    if index is None:
        return dense
    sparse = sparse_decode_tokens_ref(q, k, v, index, counts, scale)
    rq = retrieval.repeat_interleave(G).view(1, Hq, 1)
    return torch.where(rq, dense, sparse)


# ----------------------------------------------------------------------------- public ops

def retrieval_scores(q, k, lengths, heads, *, max_length=None, block: int = 1):
    """q̄·K (unscaled, group-averaged query) over the whole cache for the KV heads `heads` (int64
    [n], device), fp32 [B, n, S] (S = max_length on CUDA, the longest length on the CPU; -inf at or
    past each length), or per block of `block` slots (max over the block) [B, n, ceil(S / block)]."""
    if backend_for(q) == "torch":
        return retrieval_scores_ref(q, k, lengths, heads, max_length, block)
    from .hybrid_triton import retrieval_scores_triton

    return retrieval_scores_triton(q, k, lengths, heads, max_length, block)


def hybrid_decode(q, k, v, lengths, retrieval, index, counts, scale, *, max_length=None, page: int = 1,
                  roles=None, config=None, chunk=None, score_heads=None, score_block: int = 1, score_force=None):
    """Decode attention where the query heads of retrieval KV heads (`retrieval` bool [Hkv]) read
    every slot below their length and the others read their KV head's index set (`page` > 1: the
    index holds block numbers of `page` slots each, tokens at or past the length masked). `index`
    may be None only when every head is a retrieval head. `roles`: the same flags as a host tuple
    (the kernel's work layout is planned on the host; without it the Triton path reads `retrieval`
    back, one device sync, which a CUDA graph capture cannot do).

    `score_heads` (int64 [n], device: the layer's retrieval KV heads in ascending order) asks for their
    selection scores too, as `retrieval_scores(..., heads=score_heads, block=score_block)` gives them:
    returns (out, scores). On CUDA the attention kernel writes them while it reads those keys (one read
    of the retrieval heads' K instead of two). `score_force` = (sink, recent, only), token scores only:
    the scores as `force_scores_ref` leaves them (LycheeDecode's boost written by the kernel, no
    separate mask and fill per layer)."""
    if backend_for(q) == "torch":
        if page > 1 and index is not None:
            from .attention import sparse_decode_pages_ref

            dense = decode_attention_ref(q, k, v, lengths, scale, max_length)
            sparse = sparse_decode_pages_ref(q, k, v, index, counts, page, lengths, scale)
            rq = retrieval.repeat_interleave(q.shape[1] // k.shape[1]).view(1, -1, 1)
            out = torch.where(rq, dense, sparse)
        else:
            out = hybrid_decode_ref(q, k, v, lengths, retrieval, index, counts, scale, max_length)
        if score_heads is None:
            return out
        scores = retrieval_scores_ref(q, k, lengths, score_heads, max_length, score_block)
        if score_force is not None:
            assert score_block == 1, "forced slots are token scores (score_block 1)"
            scores = force_scores_ref(scores, lengths, *score_force)
        return out, scores
    from .hybrid_triton import hybrid_decode_triton

    if score_heads is not None and roles is not None:
        assert score_heads.numel() == sum(roles), "score_heads must be the layer's retrieval heads"
    return hybrid_decode_triton(q, k, v, lengths, retrieval, index, counts, scale, max_length=max_length,
                                page=page, roles=roles, config=config, chunk=chunk,
                                score_block=score_block if score_heads is not None else None,
                                score_force=score_force if score_heads is not None else None)


def streaming_prefill_attention(q, k, v, scale, retrieval, sink: int, recent: int, *, block: int = 1024):
    """Multi-token attention (new tokens are the last T of the L keys) where the query heads of
    retrieval KV heads (`retrieval` bool [Hkv], host or device) attend causally and the others see
    only the first `sink` keys, the `recent` keys before their own position and it (DuoAttention's
    Λ-shaped streaming pattern, at token granularity). Streaming heads run per block of `block`
    queries over only the keys the block can see (the sinks and the span from its first query's
    window to its last query), masked: O(T (sink + recent + block)) rather than the O(T L) of a
    [T, L] mask over every key, which made DuoAttention's prefill 2x full attention's at 128K.
    -> [B, T, Hq * D]."""
    from .prefill import prefill_attention

    B, Hq, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    ret = torch.as_tensor(retrieval, device="cpu").bool().tolist()
    out = torch.empty(B, T, Hq, D, device=q.device, dtype=q.dtype)
    rkv = [h for h in range(Hkv) if ret[h]]
    skv = [h for h in range(Hkv) if not ret[h]]
    qidx = lambda kvs: [kv * G + g for kv in kvs for g in range(G)]
    if rkv:
        o = prefill_attention(q[:, qidx(rkv)], k[:, rkv], v[:, rkv], scale)
        out[:, :, qidx(rkv)] = o.view(B, T, len(rkv) * G, D)
    if skv:
        qs, ks, vs = q[:, qidx(skv)], k[:, skv], v[:, skv]
        for t0 in range(0, T, block):
            t1 = min(T, t0 + block)
            first, last = L - T + t0, L - T + t1 - 1             # the block's query positions
            lo = max(sink, first - recent)                       # oldest non-sink key any of them sees
            if lo > sink:   # sinks, then the window span: keys in between are seen by no query here
                kb, vb = (torch.cat([x[:, :, :sink], x[:, :, lo:last + 1]], 2) for x in (ks, vs))
                kpos = torch.cat([torch.arange(sink, device=q.device), torch.arange(lo, last + 1, device=q.device)])
            else:
                kb, vb = ks[:, :, :last + 1], vs[:, :, :last + 1]
                kpos = torch.arange(last + 1, device=q.device)
            qpos = torch.arange(first, last + 1, device=q.device).view(-1, 1)
            mask = (kpos <= qpos) & ((kpos < sink) | (kpos >= qpos - recent))
            o = torch.nn.functional.scaled_dot_product_attention(
                qs[:, :, t0:t1], kb, vb, attn_mask=mask, scale=scale, enable_gqa=G > 1)
            out[:, t0:t1, qidx(skv)] = o.transpose(1, 2)
    return out.view(B, T, Hq * D)
