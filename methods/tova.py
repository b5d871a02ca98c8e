"""TOVA (schwartz-lab-NLP/TOVA, "Transformers are Multi-State RNNs"): a bounded cache that keeps, at
every step, the tokens the current query attends to most, averaged over the heads.

Reference behaviour (src/tova_cache.py `TOVACache.reduce`, called after every attention forward):
the new tokens are appended; when the layer then holds more than `cache_size` tokens, the last query
row's post-softmax attention, averaged over all query heads (`mean(attn[:, :, -1, :], dim=1)`), ranks
them and the top `cache_size` stay, the same set for every head of the layer. Nothing is protected:
the incoming token itself may leave. After a prompt the cache is cut to the budget by the prompt's
last query; each decode step attends budget + 1 tokens and evicts one. Keys keep their original
positions (the repository's default; its log-compressed positions option is not implemented here,
so TOVA reads no further than the model's positions). kvpress's TOVAPress scores the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.parts.stores import BoundedStore


@dataclass(frozen=True)
class TOVAConfig(ChunkedPrefill):
    """TOVA (schwartz-lab-NLP/TOVA): keep the `budget` tokens with the highest attention from the current
    query, averaged over heads; evict one per decode step (the incoming token may be the one). Budget =
    tokens kept per layer, the incoming token on top."""

    budget: int = option(512, "tokens kept per layer (TOVA's cache_size, the multi-state size)", min=1)
    heads: str = option("shared", "shared: one score averaged over all query heads, one kept set per layer "
                        "(TOVACache, kvpress); kv_group: averaged over each KV head's query group, a set per KV head",
                        choices=("shared", "kv_group"))

    def describe(self):
        return {"budget_unit": "tokens kept per layer (the incoming token on top, and it may be evicted)",
                "score": "post-softmax attention of the current query only (no accumulation), mean over "
                         + ("all query heads" if self.heads == "shared" else "each KV head's query group"),
                "positions": "original (keys rotated once)", "eviction": "real (bounded store)",
                "prefill": "dense, then cut to the budget by the prompt's last query"}

    @classmethod
    def variants(cls):
        return [{"budget": 12}, {"budget": 10, "heads": "kv_group", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context)}


@register
class TOVA(Method):
    name = "tova"
    Config = TOVAConfig
    graph_safe = True  # decode: device lengths, victim slots chosen on the device

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        self.cap = self.cfg.budget + 1
        self.store = getattr(self, "store", None) or BoundedStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, self.cap, info.head_dim, device, dtype)
        self.free = torch.zeros(info.num_layers, batch, info.num_kv_heads, dtype=torch.long, device=device)

    def buffers(self):
        return {**self.store.buffers(), "free": self.free}

    def begin(self, step):
        super().begin(step)
        self.lengths = torch.clamp(step.positions[-1:] + 1, max=self.cap).to(torch.int32).expand(self.batch).contiguous()

    def score(self, probs: torch.Tensor) -> torch.Tensor:
        """Attention of one query [B, Hq, N] -> the eviction score per KV head [B, Hkv, N]."""
        B, Hq, N = probs.shape
        Hkv = self.info.num_kv_heads
        if self.cfg.heads == "shared":
            return probs.mean(1, keepdim=True).expand(B, Hkv, N)
        return probs.view(B, Hkv, Hq // Hkv, N).mean(2)

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        S, B = self.store, q.shape[0]
        if step.phase == "decode":
            S.put(layer, self.free[layer], k, v, step.positions)
            out, probs = kernels.decode_attention_mass(q[:, :, 0].contiguous(), S.k[layer], S.v[layer], self.lengths,
                                                       self.info.scaling, max_length=self.cap)
            self.record(layer, self.lengths)
            # Full (budget + 1 tokens): the lowest-scored slot leaves and takes the next token.
            victim = self.score(probs).argmin(-1)
            full = (self.lengths == self.cap).view(B, 1)
            self.free[layer] = torch.where(full, victim, self.lengths.view(B, 1).long())
            return out.view(B, 1, -1)
        return self._prefill(layer, q, k, v, step.positions, step.start)

    def _prefill(self, layer, q, k, v, positions, start):
        S, Hkv, T = self.store, self.info.num_kv_heads, positions.numel()
        B = q.shape[0]
        n_old = min(start, self.cfg.budget)          # what the previous chunks left (host int: never graphed)
        keys = torch.cat([S.k[layer, :, :, :n_old], k], 2)
        values = torch.cat([S.v[layer, :, :, :n_old], v], 2)
        k_pos = torch.cat([torch.zeros(n_old, dtype=torch.long, device=q.device), positions])  # old: all visible
        out = kernels.prefill_attention(q, keys, values, self.info.scaling)  # [kept | chunk]: plain causal
        # The chunk's last query ranks every candidate (TOVACache.reduce on attn[:, :, -1, :]).
        probs = kernels.attention_mass(q[:, :, -1:], keys, self.info.scaling, q_pos=positions[-1:], k_pos=k_pos)
        pos = torch.cat([S.pos[layer, :, :, :n_old], positions.view(1, 1, T).expand(B, Hkv, T)], 2)
        score = self.score(probs)
        n = min(score.shape[-1], self.cfg.budget)
        index = score.topk(n, dim=-1).indices
        index = index.gather(-1, pos.gather(-1, index).argsort(-1))  # kept in position order
        S.keep(layer, index, keys, values, pos, torch.zeros_like(score))
        self.free[layer] = n
        return out
