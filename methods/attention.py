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


def gathered(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor,
             valid: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Decode attention of q [B, Hq, 1, D] over per-head key subsets.

    `index` [B, H, K] holds key indices into k, v [B, Hkv, L, D]; H is Hq (per-query-head sets) or
    Hkv (per-KV-head sets shared by the group). `valid` [B, H, K] masks padding entries.
    Returns [B, 1, Hq*D]. Pass k, v as the full-capacity store tensors (`store.k[layer]`, which are
    contiguous) rather than a `[:length]` slice: the flat gather then reads only the selected rows,
    where a slice would be copied whole by the reshape.
    """
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    H = index.shape[1]
    if H == Hkv and Hq != Hkv:  # expand KV-head sets to their query heads
        index = index.repeat_interleave(Hq // Hkv, dim=1)
        valid = None if valid is None else valid.repeat_interleave(Hq // Hkv, dim=1)
    L = k.shape[2]
    K = index.shape[-1]
    # Gather straight from the [B, Hkv*L, D] view with flat indices (kv head * L + token): no
    # per-query-head copy of the whole cache, only the K selected rows per head are read.
    kv_head = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    flat = (kv_head.view(1, Hq, 1) * L + index.long()).view(B, Hq * K, 1).expand(-1, -1, D)
    ks = torch.gather(k.reshape(B, Hkv * L, D), 1, flat).view(B, Hq, K, D)
    vs = torch.gather(v.reshape(B, Hkv * L, D), 1, flat).view(B, Hq, K, D)
    scale = D ** -0.5 if scale is None else scale
    scores = torch.einsum("bhtd,bhkd->bhtk", q.float(), ks.float()) * scale
    if valid is not None:
        scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhtk,bhkd->bhtd", probs, vs.float()).to(q.dtype)
    return out.transpose(1, 2).reshape(B, T, Hq * D)


def logits(q: torch.Tensor, k: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Pre-softmax scores q [B, Hq, T, D] . k [B, Hkv, L, D] -> [B, Hq, T, L] (fp32, GQA-aware)."""
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    qg = q.float().view(B, Hkv, Hq // Hkv, T, D)
    s = torch.einsum("bgqtd,bgld->bgqtl", qg, k.float()) * scale
    return s.reshape(B, Hq, T, k.shape[2])
