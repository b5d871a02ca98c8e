"""SnapKV (FasterDecoding/SnapKV, snapkv_utils.py `SnapKVCluster`): the prompt is compressed once, at
prefill, by what its last queries (the observation window) attend to; decoding is dense over what is
kept plus every generated token.

Reference behaviour: a prompt of fewer than `max_capacity_prompt` tokens is kept whole. Otherwise
the window's queries attend (softmax over the whole prompt, causal inside the window); each key
before the window gets its attention summed over the window's queries, smoothed along the sequence
by a 1-D pool (`avgpool`/`maxpool`, kernel 5, padding kernel // 2, stride 1, avg_pool1d counting
the padding), and the top `max_capacity_prompt - window` of those stay, with the window itself.
Defaults: init_snapkv's window 32, capacity 2048, kernel 5, avgpool. The reference repeats the KV
heads before compressing (`repeat_kv` "moved ahead"): one kept set per *query* head, a cache of Hq
heads (`heads=query`); kvpress's SnapKVPress averages the pooled scores over each KV group instead,
one set per KV head (`heads=kv_group`; its window default is 64).

Prompt in chunks (prefill_chunk): the rule is applied after every chunk to the cache plus the chunk,
with that chunk's last queries as the window (a generalisation; the reference sees one forward).
Keys keep their original positions. Storage is bounded by what the rule keeps (issue 34): per store
head, min(prompt, budget) + the tokens the run may still add, sized once the prompt is in; a first
chunk attends its own KV heads (GQA) and the kept rows are gathered through a stride-0 view, so a
long prompt is never copied per query head. Decode reads only the kept prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from common.errors import ConfigError
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.parts.eviction import kept_and_chunk
from methods.parts.selection import top_first
from methods.parts.stores_growing import GrowingStore


@dataclass(frozen=True)
class SnapKVConfig(ChunkedPrefill):
    """SnapKV (FasterDecoding/SnapKV): prefill-time selection by the observation window's pooled attention,
    then dense decode over the kept tokens and every generated one. Budget = prompt tokens kept per head
    (max_capacity_prompt, the window included). Defaults: the SnapKV code's (window 32, kernel 5, avgpool,
    a set per query head); kvpress: window=64 heads=kv_group."""

    budget: int = option(2048, "prompt tokens kept per head, the observation window included (max_capacity_prompt)",
                         min=2)
    window: int = option(32, "observation window: the last prompt queries that score, and are kept (kvpress: 64)",
                         min=1)
    kernel: int = option(5, "pooling kernel along the sequence (odd: padding kernel // 2 keeps the length)", min=1)
    pooling: str = option("avgpool", "1-D pooling of the window's summed attention", choices=("avgpool", "maxpool"))
    heads: str = option("query", "query: a kept set per query head, the KV repeated (SnapKV code); kv_group: pooled "
                        "scores averaged over the KV group, a set per KV head (kvpress)", choices=("query", "kv_group"))

    def check(self, info):
        if self.window >= self.budget:
            raise ConfigError(f"method.window={self.window} must be below method.budget={self.budget}")
        if self.kernel % 2 == 0:
            raise ConfigError(f"method.kernel={self.kernel} must be odd (the pooled scores keep the prompt's length)")

    def describe(self):
        return {"budget_unit": f"prompt tokens kept per {'query' if self.heads == 'query' else 'KV'} head "
                               "(window included); generated tokens all kept on top",
                "score": f"attention of the last {self.window} prompt queries summed, {self.pooling} k={self.kernel}"
                         + (", averaged over the KV group" if self.heads == "kv_group" else ""),
                "selection": "once, after the prefill (after each chunk when chunked); dense decode",
                "positions": "original", "prefill": "dense"}

    @classmethod
    def variants(cls):
        return [{"budget": 16, "window": 4},
                {"budget": 12, "window": 3, "kernel": 3, "pooling": "maxpool", "heads": "kv_group", "prefill_chunk": 16}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context + 1)}


def gather_heads(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` [B, H, n] of x [B, Hx, N, D], H a multiple of Hx (query head h reads KV head
    h // (H / Hx)): the repeat is a stride-0 view, so a long prompt's KV is never copied per query head."""
    B, Hx, N, D = x.shape
    H, n = index.shape[1], index.shape[2]
    g = H // Hx
    rows = index.view(B, Hx, g, n, 1).expand(B, Hx, g, n, D)
    return x.unsqueeze(2).expand(B, Hx, g, N, D).gather(3, rows).reshape(B, H, n, D)


@register
class SnapKV(Method):
    name = "snapkv"
    Config = SnapKVConfig
    graph_safe = True  # decode: the slot comes from the device position minus a device offset
    decode_idempotent = True  # a decode step writes only its own slot (the offset moves in prefill only)

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch, self.max_len = info, batch, max_len
        self.H = info.num_heads if self.cfg.heads == "query" else info.num_kv_heads
        self.store = getattr(self, "store", None) or GrowingStore()
        # bounded by what the rule keeps: sized per prompt (`reserve`), never for the run per head
        self.store.allocate(info.num_layers, batch, self.H, min(max_len, self.keep_bound()), info.head_dim,
                            device, dtype)
        self.prompt = 0
        # per layer: position - slot of the tokens written after the prompt (what compression removed)
        if getattr(self, "offset", None) is None or self.offset.device != torch.device(device):
            self.offset = torch.zeros(info.num_layers, dtype=torch.long, device=device)
        self.offset.zero_()

    def buffers(self):
        return {**self.store.buffers(), "offset": self.offset}

    def keep_bound(self) -> int:
        """Most prompt tokens any layer keeps once the prompt exceeds it (PyramidKV's lowest layer keeps more)."""
        return self.cfg.budget

    def reserve(self, prompt: int) -> None:
        """Storage for a prompt of `prompt` tokens and every token the run may add after it: at most
        min(prompt, keep_bound) + (max_len - prompt) slots per head (host ints, outside any graph)."""
        self.store.grow(min(prompt, self.keep_bound()) + self.max_len - prompt)

    def before_decode(self, seq_len):
        self.reserve(self.prompt or seq_len)

    def begin(self, step):
        super().begin(step)
        if step.phase != "decode":
            self.prompt = step.end
            self.store.grow(min(step.end, self.keep_bound()))  # this chunk's survivors
        elif not step.graphed:                                  # driven without the engine's before_decode
            self.reserve(self.prompt or step.start)

    def per_head(self, x: torch.Tensor) -> torch.Tensor:
        """KV heads -> the store's heads (repeated per query head for heads=query)."""
        return x.repeat_interleave(self.H // x.shape[1], 1) if self.H != x.shape[1] else x

    def attend(self, layer, q, k, v, rope):
        step, S = self.step, self.store
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        if step.phase == "decode":
            slot = step.positions - self.offset[layer]
            S.write(layer, slot, self.per_head(k), self.per_head(v))
            lengths = (slot + 1).to(torch.int32).expand(q.shape[0]).contiguous()
            self.record(layer, lengths)
            out = kernels.decode_attention(q[:, :, 0].contiguous(), S.k[layer], S.v[layer], lengths,
                                           self.info.scaling, max_length=S.capacity)
            return out.view(q.shape[0], 1, -1)
        n_old = step.start - int(self.offset[layer])    # kept so far (host int: a prefill is never graphed)
        if n_old == 0:  # the first chunk attends its own KV heads (GQA): no copy per query head
            keys, values, k_pos = kept_and_chunk(S.k[layer, :, :, :0], S.v[layer, :, :, :0], k, v, step.positions)
        else:
            keys, values, k_pos = kept_and_chunk(S.k[layer, :, :, :n_old], S.v[layer, :, :, :n_old],
                                                 self.per_head(k), self.per_head(v), step.positions)
        out = kernels.prefill_attention(q, keys, values, self.info.scaling)  # [kept | chunk]: plain causal
        N = keys.shape[2]
        if N < self.cfg.budget:                         # SnapKV: a short prompt is kept whole
            S.k[layer, :, :, n_old:N], S.v[layer, :, :, n_old:N] = self.per_head(k), self.per_head(v)
            return out
        index = self.select(layer, q, keys, step.positions, k_pos)
        n = index.shape[-1]
        S.k[layer, :, :, :n], S.v[layer, :, :, :n] = gather_heads(keys, index), gather_heads(values, index)
        self.offset[layer] = step.end - n
        return out

    def prefix_keep(self, layer: int, n_prefix: int) -> int:
        """How many tokens before the window stay (PyramidKV overrides it per layer)."""
        return self.cfg.budget - self.cfg.window

    def select(self, layer, q, keys, q_positions, k_pos) -> torch.Tensor:
        """Indices [B, H, n] into the N candidates: the top pooled scores before the window, sorted,
        then the window. The window is the chunk's last `window` queries (all of them if shorter)."""
        c, N = self.cfg, keys.shape[2]
        w = min(c.window, q.shape[2])
        mass = kernels.attention_mass(q[:, :, -w:], keys, self.info.scaling, q_pos=q_positions[-w:], k_pos=k_pos)
        pool = F.avg_pool1d if c.pooling == "avgpool" else F.max_pool1d
        scores = pool(mass[:, :, :N - w], kernel_size=c.kernel, padding=c.kernel // 2, stride=1)
        if self.H != scores.shape[1]:                   # kv_group: average the pooled scores over the group
            scores = scores.view(scores.shape[0], self.H, -1, N - w).mean(2)
        top = top_first(scores, min(self.prefix_keep(layer, N - w), N - w)).sort(-1).values  # ties: lower position
        window = torch.arange(N - w, N, device=q.device).expand(*top.shape[:2], w)
        return torch.cat([top, window], -1)
