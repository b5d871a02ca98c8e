"""Triton kernels for the decode hot paths, each with a torch reference and a dispatcher.

Dispatch: Triton on CUDA tensors, the torch reference elsewhere; `HARNESS_KERNELS=torch|triton`
forces one (Triton on CPU tensors needs `TRITON_INTERPRET=1` before triton is imported).
Methods call only these dispatchers, on every device: the method code is the same on the CPU and
the GPU. Decode conventions (kernels/attention.py): q [B, Hq, D], k/v [B, Hkv, S_cap, D], lengths
int32 [B]; multi-token conventions (kernels/prefill.py): q [B, Hq, T, D], k/v [B, Hkv, L, D].
"""
from ._common import HAVE_TRITON, backend_for, interpreter_active
from .attention import (
    decode_attention,
    decode_attention_mass,
    decode_attention_ref,
    selection_attention,
    selection_attention_ref,
    sparse_decode_pages,
    sparse_decode_pages_ref,
    sparse_decode_tokens,
    sparse_decode_tokens_ref,
    topk_positions,
)
from .centroid_scores import cluster_scores
from .eviction_step import bounded_put, eviction_decode
from .mass_prefill import causal_attention_mass, causal_attention_mass_ref
from .prefill import attention_mass, attention_mass_ref, prefill_attention
from .quest_pages import (
    quest_page_scores,
    quest_page_scores_ref,
    quest_topk_pages,
    quest_update_pages,
    quest_update_pages_ref,
)

__all__ = [
    "HAVE_TRITON",
    "attention_mass",
    "attention_mass_ref",
    "backend_for",
    "bounded_put",
    "causal_attention_mass",
    "causal_attention_mass_ref",
    "cluster_scores",
    "decode_attention",
    "decode_attention_mass",
    "decode_attention_ref",
    "eviction_decode",
    "interpreter_active",
    "prefill_attention",
    "quest_page_scores",
    "quest_page_scores_ref",
    "quest_topk_pages",
    "quest_update_pages",
    "quest_update_pages_ref",
    "selection_attention",
    "selection_attention_ref",
    "sparse_decode_pages",
    "sparse_decode_pages_ref",
    "sparse_decode_tokens",
    "sparse_decode_tokens_ref",
    "topk_positions",
]
