"""CUDA paths of kernels/hybrid.py (work in progress: composed from the existing decode kernels)."""
from __future__ import annotations

import torch

from .attention import decode_attention, sparse_decode_pages, sparse_decode_tokens
from .hybrid import retrieval_scores_ref


def retrieval_scores_triton(q, k, lengths, heads, max_length, block):
    return retrieval_scores_ref(q, k, lengths, heads, max_length, block)


def hybrid_decode_triton(q, k, v, lengths, retrieval, index, counts, scale, *, max_length=None, page=1, config=None):
    dense = decode_attention(q, k, v, lengths, scale, max_length=max_length)
    if index is None:
        return dense
    if page > 1:
        sparse = sparse_decode_pages(q, k, v, index, counts, page, lengths, scale)
    else:
        sparse = sparse_decode_tokens(q, k, v, index, counts, scale)
    rq = retrieval.repeat_interleave(q.shape[1] // k.shape[1]).view(1, -1, 1)
    return torch.where(rq, dense, sparse)
