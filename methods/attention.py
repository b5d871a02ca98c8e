"""Attention math shared by methods (torch reference path; `kernels/` dispatches fast versions).

Keys and values are stored per KV head; query heads of a group share them (GQA). Everything here
is exact arithmetic so that method oracle tests can rely on it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor | None = None,
          k_pos: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention of q [B, Hq, T, D] over k, v [B, Hkv, L, D]; returns [B, T, Hq*D].

    Causality is by position: query at position p sees keys with position <= p. `q_pos` [T] and
    `k_pos` [L] default to the usual layout (keys 0..L-1, queries the last T of them). A single
    query (decode) needs no mask.
    """
    B, Hq, T, D = q.shape
    L = k.shape[2]
    if T == 1 and q.is_cuda and q_pos is None and k_pos is None:
        # Decode on the GPU: our split-K kernel. SDPA would pick cuDNN there, which rebuilds its
        # plan for every new KV length (~1.4 ms of host time per layer per step on the H100).
        lengths = torch.full((B,), L, dtype=torch.int32, device=q.device)
        return decode_kernel(q, k, v, lengths, D ** -0.5 if scale is None else scale, L)
    mask = None
    if q_pos is None and k_pos is None and T > 1:
        # Default layout (the chunk is the last T keys): a lower-right causal bias keeps SDPA on
        # its fused kernels; an explicit [T, L] mask would be quadratic memory at long prefill.
        mask = causal_lower_right(T, L)
    elif q_pos is not None or k_pos is not None:
        if q_pos is None:
            q_pos = torch.arange(L - T, L, device=q.device)
        if k_pos is None:
            k_pos = torch.arange(L, device=q.device)
        mask = k_pos.unsqueeze(-2) <= q_pos.unsqueeze(-1)  # [T, L], or [B, T, L] for batched positions
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=k.shape[1] != Hq)
    return out.transpose(1, 2).reshape(B, T, Hq * D)


def decode_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, scale: float,
                  max_length: int) -> torch.Tensor:
    """Decode (T = 1) attention through `kernels.decode_attention` (Triton on CUDA, torch reference
    elsewhere): q [B, Hq, 1, D], k/v the full-capacity store [B, Hkv, cap, D], `lengths` int32 [B]
    on the device, `max_length` a host bound (the capacity) so no sync is needed. -> [B, 1, Hq*D]."""
    import kernels

    B, Hq, _, D = q.shape
    out = kernels.decode_attention(q[:, :, 0].contiguous(), k, v, lengths, scale, max_length=max_length)
    return out.reshape(B, 1, Hq * D)


def gathered(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor,
             valid: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Decode attention of q [B, Hq, 1, D] over per-head key subsets.

    `index` [B, H, K] holds key indices into k, v [B, Hkv, L, D]; H is Hq (per-query-head sets) or
    Hkv (per-KV-head sets shared by the group). `valid` [B, H, K] masks padding entries (their
    index must still point inside k, e.g. clamped). Returns [B, 1, Hq*D].

    The gather runs per KV head on k itself (no [B, Hq, L, D] copy of the cache per call): query
    head h belongs to KV head h // group, the HF `repeat_kv` convention.
    """
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    H, K = index.shape[1], index.shape[2]
    idx = index.long()
    qg = q.float().view(B, Hkv, g, D)
    scale = D ** -0.5 if scale is None else scale
    # Row indexing (k[b, h, idx]) copies whole D-rows: about 2x faster than torch.gather on CPU.
    bi = torch.arange(B, device=q.device).view(B, 1, 1)
    hi = torch.arange(Hkv, device=q.device).view(1, Hkv, 1)
    if H == Hkv:  # one set per KV head, shared by its query heads: gather once
        ks = k[bi, hi, idx].float()  # [B, Hkv, K, D]
        vs = v[bi, hi, idx].float()
        scores = torch.einsum("bhgd,bhkd->bhgk", qg, ks) * scale
        mask = None if valid is None else valid.unsqueeze(2)
    else:  # one set per query head: gather the group's sets from their KV head
        flat = idx.view(B, Hkv, g * K)
        ks = k[bi, hi, flat].float().view(B, Hkv, g, K, D)
        vs = v[bi, hi, flat].float().view(B, Hkv, g, K, D)
        scores = torch.einsum("bhgd,bhgkd->bhgk", qg, ks) * scale
        mask = None if valid is None else valid.view(B, Hkv, g, K)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    eq = "bhgk,bhkd->bhgd" if H == Hkv else "bhgk,bhgkd->bhgd"
    out = torch.einsum(eq, probs, vs).to(q.dtype)
    return out.reshape(B, T, Hq * D)


def logits(q: torch.Tensor, k: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Pre-softmax scores q [B, Hq, T, D] . k [B, Hkv, L, D] -> [B, Hq, T, L] (fp32, GQA-aware)."""
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    qg = q.float().view(B, Hkv, Hq // Hkv, T, D)
    s = torch.einsum("bgqtd,bgld->bgqtl", qg, k.float()) * scale
    return s.reshape(B, Hq, T, k.shape[2])


def selection(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Full decode attention of q [B, Hq, 1, D] over k, v [B, Hkv, L, D] that also returns the
    UNSCALED pre-softmax scores q.k, fp32 [B, Hq, L] (TidalDecode's token-selection layers: one
    pass gives both the layer output and the ranking). Returns ([B, 1, Hq*D], scores)."""
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    s = logits(q, k)  # [B, Hq, 1, L]
    probs = torch.softmax(s * scale, dim=-1).view(B, Hkv, Hq // Hkv, k.shape[2])
    out = torch.einsum("bhgl,bhld->bhgd", probs, v.float()).to(q.dtype)
    return out.reshape(B, T, Hq * D), s[:, :, 0]


def paged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, page_index: torch.Tensor, page_size: int,
          length: int, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over whole pages: page p = tokens p*page_size .. +page_size-1 (aligned to
    position 0); tokens at or past `length` (the partial current page) are masked. `page_index`
    [B, H, P] as in `gathered`. Returns ([B, 1, Hq*D], tokens attended per head [B, H])."""
    j = torch.arange(page_index.shape[-1] * page_size, device=q.device)
    pos = page_index.long()[..., j // page_size] * page_size + j % page_size  # [B, H, P*page_size]
    valid = pos < length
    out = gathered(q, k, v, pos.clamp(max=length - 1), valid, scale)  # clamp: never read stale slots
    return out, valid.sum(-1)


def quest_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Quest page upper bounds, fp32, unscaled: q [B, Hq, 1, D] x page bounds kmin/kmax
    [B, Hkv, P, D] -> [B, Hq, P], score = sum_d max(q_d*kmin_d, q_d*kmax_d).

    Written as q+ . kmax + q- . kmin (kmax >= kmin, so the max picks kmax where q_d > 0 and kmin
    where q_d < 0): the same sum term by term, as two matrix products per GQA group."""
    B, Hq, _, D = q.shape
    Hkv = kmin.shape[1]
    qg = q.float().view(B, Hkv, Hq // Hkv, D)
    s = torch.einsum("bhgd,bhpd->bhgp", qg.clamp(min=0), kmax.float())
    s = s + torch.einsum("bhgd,bhpd->bhgp", qg.clamp(max=0), kmin.float())
    return s.reshape(B, Hq, kmin.shape[2])
