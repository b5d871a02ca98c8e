"""Truncated dense attention: the "vanilla (truncated)" / "Flash Attention 2 (truncated / strided)"
rows of the Cascading KV Cache paper. Dense attention over a bounded part of the text, positions
re-assigned from 0 as if the text had been cut before the model saw it.

  last    the prompt's last `budget` tokens (Cascading's Booksum vanilla: tokenizer truncation_side
          left, the end of the book kept), then dense decode over them and every generated token.
  middle  the prompt's first and last budget // 2 tokens (LongBench pred.py: `half = int(max_length
          / 2)`, at the token level here; Cascading's LongBench "Flash Attention 2 (truncated)"),
          then dense decode as above.
  block   consecutive blocks of `budget` tokens, each read on its own from position 0 (Cascading's
          PG-19 "Flash Attn. 2 (strided)": `model(chunk)` with no cache, stride = cache size); a
          decode step sees the earlier tokens of its own block.

The dropped prompt tokens still pass through the layers (the engine feeds every token) but no kept
token attends to them and their attention output is zero. last/middle cut one prompt, so the prompt
comes in one prefill; a sequence fed token by token has no prompt to cut and is read densely. The
store holds the kept prompt plus the generated tokens (last/middle) or one block (block): bounded by
the budget, positions in-cache, so truncation reads any length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError, HarnessError
from methods.base import Method, register
from methods.config import MethodConfig, option
from methods.parts.stores import FullStore


@dataclass(frozen=True)
class TruncateConfig(MethodConfig):
    """Truncated dense attention (the Cascading paper's vanilla/flash "truncated" and "strided" rows): keep
    the prompt's last or first+last `budget` tokens, or read the text in independent blocks of `budget`;
    positions re-assigned from 0 as if the text had been cut."""

    budget: int = option(4096, "tokens of context kept (block: the block length)", min=1)
    keep: str = option("last", "last: the prompt's last budget tokens; middle: its first and last budget // 2 "
                       "(LongBench); block: independent blocks of budget tokens (strided PG-19)",
                       choices=("last", "middle", "block"))

    def check(self, info):
        if self.budget > info.max_position:
            raise ConfigError(f"method.budget={self.budget} exceeds the model's {info.max_position} positions")
        if self.keep == "middle" and self.budget < 2:
            raise ConfigError("method.budget must be >= 2 with keep=middle")

    def max_context(self, info):
        return None  # bounded, positions re-assigned from 0

    def describe(self):
        return {"budget_unit": {"last": "last prompt tokens kept", "middle": "first + last prompt tokens kept "
                                "(budget // 2 each)", "block": "tokens per independent block"}[self.keep],
                "decode": "dense over the kept prompt and every generated token" if self.keep != "block" else
                          "dense over the earlier tokens of the current block",
                "positions": "re-assigned from 0 (as if the text were cut)", "prefill": "dense over the kept tokens"}

    @classmethod
    def variants(cls):
        return [{"budget": 16}, {"budget": 15, "keep": "middle"}, {"budget": 12, "keep": "block"}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context)}


@register
class Truncate(Method):
    name = "truncate"
    Config = TruncateConfig
    graph_safe = True  # decode: slot = position - offset (device) or position % budget
    decode_idempotent = True  # a decode step writes only its own slot

    @property
    def prefill_chunk(self):
        return self.cfg.budget if self.cfg.keep == "block" else None  # blocks stream; a cut needs the prompt

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch, self.max_len = info, batch, max_len
        self.device, self.dtype = torch.device(device), dtype
        self.store = getattr(self, "store", None) or FullStore()
        if self.cfg.keep == "block":
            self._allocate(self.cfg.budget)
        if getattr(self, "offset", None) is None or self.offset.device != self.device:
            self.offset = torch.zeros(1, dtype=torch.long, device=self.device)
        self.offset.zero_()  # position - slot of the tokens after the prompt

    def _allocate(self, capacity: int) -> None:
        # Outside inference mode: the store outlives the step and callers may reset it in place.
        with torch.inference_mode(False):
            self.store.allocate(self.info.num_layers, self.batch, self.info.num_kv_heads, capacity,
                                self.info.head_dim, self.device, self.dtype)

    def buffers(self):
        return {**self.store.buffers(), "offset": self.offset}

    def begin(self, step):
        super().begin(step)
        c = self.cfg
        if c.keep == "block":
            self.slot = step.positions % c.budget
            self.lengths = (self.slot[-1:] + 1).to(torch.int32).expand(self.batch).contiguous()
            return
        self.kept = None  # the cut's token indices live for the prompt's step only
        if step.phase != "decode" and step.start > 0:
            raise HarnessError(f"truncate keep={c.keep} cuts one prompt; a second prefill chunk came (use keep=block "
                               f"for streamed text)")
        if step.start == 0:  # the cut, decided by the prompt's length (host ints: a prefill is never graphed)
            T = step.length if step.phase != "decode" else 0
            half = c.budget // 2
            if T <= c.budget:
                kept = torch.arange(T)
            elif c.keep == "last":
                kept = torch.arange(T - c.budget, T)
            else:
                kept = torch.cat([torch.arange(half), torch.arange(T - half, T)])
            self.kept = kept.to(self.device)
            self._allocate(kept.numel() + self.max_len - T)
            self.offset.fill_(T - kept.numel())
        self.slot = step.positions - self.offset
        self.lengths = (self.slot[-1:] + 1).to(torch.int32).expand(self.batch).contiguous()

    def attend(self, layer, q, k, v, rope):
        step, S, c = self.step, self.store, self.cfg
        B = q.shape[0]
        if step.phase == "decode":
            q, k = rope.apply(q, self.slot), rope.apply(k, self.slot)
            S.write(layer, self.slot, k, v)
            self.record(layer, self.lengths)
            out = kernels.decode_attention(q[:, :, 0].contiguous(), S.k[layer], S.v[layer], self.lengths,
                                           self.info.scaling, max_length=S.capacity)
            return out.view(B, 1, -1)
        if c.keep == "block":
            return self._blocks(layer, q, k, v, rope)
        kept = self.kept
        n = kept.numel()
        icp = torch.arange(n, device=q.device)
        qk, kk = rope.apply(q[:, :, kept], icp), rope.apply(k[:, :, kept], icp)
        S.write(layer, icp, kk, v[:, :, kept])
        out = torch.zeros(B, q.shape[2], q.shape[1] * q.shape[3], device=q.device, dtype=q.dtype)
        if n:
            out[:, kept] = kernels.prefill_attention(qk, kk, v[:, :, kept], self.info.scaling)
        return out

    def _blocks(self, layer, q, k, v, rope):
        """A prefill chunk in independent blocks: each segment of the chunk inside one block attends to
        the block's earlier tokens (already in the store) and to itself, causally."""
        step, S, N = self.step, self.store, self.cfg.budget
        outs, s = [], step.start
        while s < step.end:
            e = min(step.end, (s // N + 1) * N)
            a, b = s - step.start, e - step.start
            r0 = s % N
            icp = torch.arange(r0, r0 + (e - s), device=q.device)
            qs, ks = rope.apply(q[:, :, a:b], icp), rope.apply(k[:, :, a:b], icp)
            keys = torch.cat([S.k[layer, :, :, :r0], ks], 2)
            values = torch.cat([S.v[layer, :, :, :r0], v[:, :, a:b]], 2)
            outs.append(kernels.prefill_attention(qs, keys, values, self.info.scaling))
            S.write(layer, icp, ks, v[:, :, a:b])
            s = e
        return torch.cat(outs, 1)
