"""A differentiable teacher/student forward over the HF modules for head identification training
(the engine runs under inference_mode and cannot carry gradients).

Reference (src/llama/modeling_llama_train.py, train_kuma.py): the context is prefilled densely
without gradients (in chunks); the answer segment (`labels`) then runs twice from that cache: the
teacher fully dense, the student with, in every layer l > 0 and query head h of KV head g,
    out = z[l, g] * dense + (1 - z[l, g]) * sparse
where `sparse` attends the token mask computed in the PREVIOUS layer. Layer 0 has no mask: dense.

Mask of a layer for the next (`mask`):
  reference  the code's training mask: per QUERY head, from the full pre-softmax scores q.K of this
             layer (future positions of the answer segment included in the ranking), ratio rule
             (keep int((1 - ratio) * L) of the L keys: the first `sink` and the last `recent` columns
             forced), then ANDed with the causal mask; renewed in every layer.
  inference  what decoding does: per KV head from the group-averaged query (q̄·K, each row ranked
             over its causally visible keys, the recent window relative to the row), the same ratio
             rule; renewed only where the sampled gate is a retrieval head (z > 0.5), otherwise the
             KV head keeps the mask of the latest earlier layer that renewed it.
The train/inference mismatch of the reference is the default and `mask: inference` removes it.
`student: duo` replaces the sparse branch by DuoAttention's streaming pattern (sink + recent).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from methods.parts.rope import Rope
from runners.layer_ops import ModuleOps


class Student:
    def __init__(self, model, info, *, mask: str = "reference", student: str = "lychee", ratio: float = 0.7,
                 sink: int = 128, recent: int = 256, duo_sink: int = 64, duo_recent: int = 256):
        self.model, self.info = model, info
        self.ops = ModuleOps(model, info)
        self.rope = Rope(model.model.rotary_emb)
        self.mask_mode, self.student = mask, student
        self.ratio, self.sink, self.recent = ratio, sink, recent
        self.duo_sink, self.duo_recent = duo_sink, duo_recent

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, chunk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Dense prefill of the context in chunks: per layer (rotated keys, values) [B, Hkv, C, D]."""
        B, C = ids.shape
        L = self.info.num_layers
        cache = [(None, None)] * L
        for s in range(0, C, chunk):
            part = ids[:, s:s + chunk]
            pos = torch.arange(s, s + part.shape[1], device=ids.device)
            self.rope.new_step()
            h = self.model.model.embed_tokens(part)
            for i in range(L):
                x = self.ops.norm_in(i, h)
                q, k, v = self.ops.qkv(i, x)
                q, k = self.rope.apply(q, pos), self.rope.apply(k, pos)
                pk, pv = cache[i]
                K = k if pk is None else torch.cat([pk, k], 2)
                V = v if pv is None else torch.cat([pv, v], 2)
                cache[i] = (K, V)
                a = _attend(q, K, V, self.info.scaling, _causal(part.shape[1], K.shape[2], q.device))
                h = h + self.ops.o_proj(i, a)
                h = h + self.ops.mlp(i, self.model.model.layers[i].post_attention_layernorm(h))
        return cache

    def forward(self, labels: torch.Tensor, cache, z: torch.Tensor | None, out: str = "hidden") -> torch.Tensor:
        """Answer tokens [B, T] after the cached context: the final hidden states (normed) [B, T, H]
        or logits [B, T, V]. z None = the teacher (dense); z [layers, Hkv] = the student."""
        B, T = labels.shape
        C = cache[0][0].shape[2]
        info, G = self.info, self.info.group
        pos = torch.arange(C, C + T, device=labels.device)
        self.rope.new_step()
        causal = _causal(T, C + T, labels.device)
        h = self.model.model.embed_tokens(labels)
        prev = None            # the mask the next layer's sparse branch reads, [B, Hq, T, L] bool
        kv_mask = None         # inference mode: per KV head [B, Hkv, T, L]
        for i in range(info.num_layers):
            x = self.ops.norm_in(i, h)
            q, k, v = self.ops.qkv(i, x)
            q, k = self.rope.apply(q, pos), self.rope.apply(k, pos)
            K, V = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            a = _attend(q, K, V, info.scaling, causal)
            if z is not None:
                sparse_mask = self._duo_mask(C, T, labels.device) if self.student == "duo" else prev
                if sparse_mask is not None:
                    s = _attend(q, K, V, info.scaling, sparse_mask)
                    alpha = z[i].repeat_interleave(G).view(1, 1, -1, 1).to(a.dtype)
                    a = (alpha * a.view(B, T, -1, info.head_dim) + (1 - alpha) * s.view(B, T, -1, info.head_dim)
                         ).view(B, T, -1)
                if self.student == "lychee":
                    with torch.no_grad():
                        if self.mask_mode == "reference":
                            prev = self._reference_mask(q, K, causal)
                        else:
                            kv_mask = self._inference_mask(q, K, causal, kv_mask, z[i] > 0.5)
                            prev = kv_mask.repeat_interleave(G, 1)
            h = h + self.ops.o_proj(i, a)
            h = h + self.ops.mlp(i, self.model.model.layers[i].post_attention_layernorm(h))
        h = self.model.model.norm(h)
        return h if out == "hidden" else self.model.lm_head(h).float()

    # --- masks -------------------------------------------------------------------------------------
    def _keep_count(self, L: torch.Tensor | int) -> int:
        return int((1 - self.ratio) * L)

    def _reference_mask(self, q, K, causal):
        """get_sparse_attn_mask_from_radio on the full q.K of every query head, then & causal."""
        G = self.info.group
        s = torch.matmul(q.float(), K.float().repeat_interleave(G, 1).transpose(-1, -2))   # [B, Hq, T, L]
        L = s.shape[-1]
        pos = torch.arange(L, device=s.device)
        must = (pos < self.sink) | (pos >= L - self.recent)
        mask = must.expand_as(s).clone()
        extra = self._keep_count(L) - self.sink - self.recent
        if extra > 0:
            idx = s.masked_fill(must, torch.finfo(s.dtype).min).topk(extra, -1).indices
            mask.scatter_(-1, idx, True)
        return mask & causal

    def _inference_mask(self, q, K, causal, old, retrieval):
        """Per KV head, group-averaged query, each row over its visible keys (ratio rule with the
        sinks and the row's own recent window forced); rows of sparse heads keep `old`."""
        B, Hq, T, D = q.shape
        Hkv = K.shape[1]
        qbar = q.float().view(B, Hkv, Hq // Hkv, T, D).mean(2)
        s = torch.matmul(qbar, K.float().transpose(-1, -2))                                 # [B, Hkv, T, L]
        L = s.shape[-1]
        pos = torch.arange(L, device=s.device).view(1, -1)
        n = (torch.arange(T, device=s.device) + (L - T) + 1).view(-1, 1)                   # visible keys per row
        must = ((pos < self.sink) | (pos >= n - self.recent)) & causal
        keep = torch.maximum(torch.floor((1 - self.ratio) * n.double()).long(), must.sum(-1, keepdim=True))
        boosted = torch.where(must, float("inf"), torch.where(causal, s, float("-inf")))
        order = boosted.sort(dim=-1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, pos.expand_as(order).contiguous())
        new = (rank < keep) & causal
        if old is None:
            return new
        return torch.where(retrieval.view(1, -1, 1, 1), new, old)

    def _duo_mask(self, C, T, device):
        L = C + T
        kp = torch.arange(L, device=device).view(1, -1)
        qp = torch.arange(C, L, device=device).view(-1, 1)
        return (kp <= qp) & ((kp < self.duo_sink) | (kp >= qp - self.duo_recent))


def _causal(T: int, L: int, device) -> torch.Tensor:
    return torch.ones(T, L, dtype=torch.bool, device=device).tril(diagonal=L - T)


def _attend(q, K, V, scale, mask) -> torch.Tensor:
    """SDPA with a boolean mask ([T, L] or [B, Hq, T, L]); -> [B, T, Hq * D]. A row with nothing
    visible gives zeros (masked_fill of NaN), as the sparse decode kernels do."""
    B, Hq, T, D = q.shape
    G = Hq // K.shape[1]
    o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=scale, enable_gqa=G > 1)
    return o.nan_to_num(0.0).transpose(1, 2).reshape(B, T, Hq * D)
