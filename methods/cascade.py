"""Cascading KV Cache (Willette et al., ICLR 2025; jeffwillette/cascading_kv_cache, cascading_cache_2).

A bounded cache per layer and KV head: `sink` first tokens kept forever plus `cascades` sub-caches of
cache_size / cascades slots, each a ring buffer. Cascade 0 takes every token; a token a full cascade
pushes out goes on to the next cascade, which takes every 2^i-th token (after the cache has filled
"eagerly", as a plain window); when it does not, the token competes with that cascade's newest entry
and the one with the higher score stays (token selection). Scores are an EMA (beta) of the
post-softmax attention each entry receives, reduced over the query heads of a KV group (max by
default: every reference script passes --head_reduction max). Keys are cached before RoPE and
re-rotated each step at contiguous positions in cache order (sinks 0..S-1, then the deepest cascade
first, cascade 0's newest last; queries right after), as StreamingLLM does. The prompt streams
through the cache in strides (`stride`): each chunk attends [sinks | cache | itself, causally] and
its tokens then enter the cache one by one (methods/parts/stores_cascade.py: the update rule and plans;
kernels/cascade_update.py: the update kernel; kernels/cascade_attention.py: attention + EMA mass).

Differences from the reference, on purpose: scores are kept in fp32 (the reference keeps them in the
model dtype, fp16, where (1 - beta) * p with beta = 0.9999999 mostly rounds to 0 and most comparisons
are ties, won by the incoming token), and the chunk's EMA mass is exact (the reference's flash kernel
approximates the softmax normaliser while it streams). Batched sequences must have equal lengths (the
engine's rule): the counters are shared by the batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from common.errors import ConfigError, HarnessError
from kernels.cascade_attention import rotated_decode_mass, strided_attention
from kernels.cascade_update import cascade_apply
from kernels.fused import rope as rotate
from methods.base import Method, register
from methods.config import MethodConfig, option
from methods.parts.stores_cascade import CascadeLayout, CascadeStore

REDUCTIONS = ("max", "mean", "median")


@dataclass(frozen=True)
class CascadeConfig(MethodConfig):
    """Cascading KV Cache (jeffwillette/cascading_kv_cache): sinks + cascading sub-caches that keep the
    tokens with the highest EMA attention score, prefilled in strides through the bounded cache.
    Defaults: the reference scripts (64 sinks, 4 cascades, head_reduction max, beta 0.9999999)."""

    sink: int = option(64, "first tokens kept forever, on top of cache_size (the paper's 64)", min=0)
    cache_size: int = option(4096, "cascade slots |C| per KV head, sinks excluded (the paper's 'total cache size'; "
                             "the reference's max_seq_len)", min=1)
    cascades: int = option(4, "sub-caches N of cache_size / N slots each; cascade i takes every 2^i-th token "
                           "(1 = StreamingLLM with the strided prefill)", min=1)
    beta: float = option(0.9999999, "EMA factor of the attention scores (the code's 0.9999999; the paper states "
                         "0.9999)", min=0.0, max=1.0)
    head_reduction: str = option("max", "how the query heads of a KV group pool their attention into one score",
                                 choices=REDUCTIONS)
    homogeneous_heads: bool = option(False, "one score per token shared by all heads (reduced over every query "
                                     "head): every head keeps the same tokens")
    selection: bool = option(True, "token selection: keep the higher-scored of the incoming token and the newest "
                             "entry of a cascade that does not accept it; false (the paper's ablation, the reference "
                             "without scores): the incoming token always replaces it")
    cache_rule: str = option("fixed", "fixed: cache_size slots; quarter | half: 2^floor(log2(L/4)) | 2^floor(log2(L/2)) "
                             "slots for a sequence of L tokens (prompt + new tokens), at most cache_size: the "
                             "reference's LongBench | Booksum rules", choices=("fixed", "quarter", "half"))
    stride: int | None = option(1024, "prefill stride: the prompt streams through the cache in chunks of this many "
                                "tokens (reference: 1024 PG-19, 4096 passkey, 512 LongBench); null = one dense chunk",
                                min=1)

    @property
    def window(self) -> int:
        return self.cache_size // self.cascades

    def cache_for(self, length: int) -> int:
        """Cache slots for a sequence of `length` tokens under `cache_rule` (a multiple of cascades)."""
        if self.cache_rule == "fixed":
            return self.cache_size
        share = length // (4 if self.cache_rule == "quarter" else 2)
        size = 1 << max(0, share.bit_length() - 1) if share > 0 else 1
        return max(self.cascades, min(size, self.cache_size) // self.cascades * self.cascades)

    def check(self, info):
        if self.cache_size % self.cascades:
            raise ConfigError(f"method.cache_size={self.cache_size} must be a multiple of method.cascades="
                              f"{self.cascades}")
        need = self.sink + self.cache_size + (self.stride or 1)
        if need > info.max_position:
            raise ConfigError(f"method.sink + method.cache_size + method.stride = {need} exceeds the model's "
                              f"{info.max_position} positions (in-cache positions reach that far)")

    def max_context(self, info) -> int | None:
        """Any length when strided (positions stay below sink + cache_size + stride); a dense prefill
        puts the whole prompt in one chunk, so it must fit the model's positions."""
        return None if self.stride is not None else info.max_position

    def span(self) -> int:
        """Token span of the full cache (Eq. 4: |C|/N * sum 2^(i-1)), sinks excluded."""
        return self.window * ((1 << self.cascades) - 1)

    def describe(self):
        return {"budget_unit": "tokens kept per KV head: sink + cache_size (plus the step's own tokens)",
                "budget_total": self.sink + self.cache_size if self.cache_rule == "fixed" else
                f"sink + {self.cache_rule} rule (at most {self.cache_size})",
                "window_per_cascade": self.window if self.cache_rule == "fixed" else "by the rule",
                "token_span": self.span(),
                "acceptance": "cascade i takes every 2^i-th token after an eager fill (pow2)",
                "score": f"EMA (beta={self.beta}) of post-softmax attention, {self.head_reduction} over "
                         f"{'all query heads' if self.homogeneous_heads else 'the KV group'}, fp32",
                "selection": "on" if self.selection else "off (incoming token always replaces the newest)",
                "positions": "in-cache, contiguous in cache order (keys stored un-rotated, re-rotated each step)",
                "prefill": f"strided ({self.stride})" if self.stride else "dense (one chunk)",
                "eviction": "real (bounded store)", "dense_layers": 0}

    @classmethod
    def variants(cls):
        return [{"sink": 4, "cache_size": 16, "cascades": 4, "stride": 8},
                {"sink": 2, "cache_size": 12, "cascades": 2, "stride": None, "head_reduction": "mean"},
                {"sink": 0, "cache_size": 8, "cascades": 2, "stride": 5, "selection": False,
                 "homogeneous_heads": True},
                {"sink": 3, "cache_size": 9, "cascades": 1, "stride": 7, "beta": 0.9, "head_reduction": "median"}]

    def full_equivalent(self, context):
        return {"cache_size": self.cascades * math.ceil(context / self.cascades)}


@register
class Cascade(Method):
    name = "cascade"
    Config = CascadeConfig
    # decode: plan, positions and counters derived on the device from the counters and the step's
    # position. Not idempotent (a step moves the rings and the EMA scores): the engine's graph warm-up
    # saves and restores buffers(), which hold every piece of state a decode step changes.
    graph_safe = True
    decode_idempotent = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.layout = None

    @property
    def prefill_chunk(self):
        return self.cfg.stride

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        c = self.cfg
        cache = c.cache_for(max_len)
        if c.sink + cache + (c.stride or 1) > info.max_position:
            raise HarnessError(f"cascade: {c.cache_rule} cache of {cache} for {max_len} tokens + sink {c.sink} + stride "
                               f"{c.stride} exceeds the model's {info.max_position} positions; lower cache_size")
        if self.layout is None or self.layout.cache != cache:
            self.layout = CascadeLayout(c.sink, c.cascades, cache // c.cascades)
        L = self.layout
        L.reset()
        L.prepare(device)
        self.store = getattr(self, "store", None) or CascadeStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, L.slots, info.head_dim, L.N, device, dtype)
        self.host_stale = False

    def buffers(self):
        stage, group = self.layout.offsets()
        return {**self.store.buffers(), "stage_off": stage, "group_off": group}

    # --- per step ----------------------------------------------------------------------------------
    def begin(self, step):
        super().begin(step)
        self._cs = None
        if step.phase == "decode":
            self._begin_decode(step)
        elif step.phase == "prefill":
            self._begin_prefill(step)
        else:
            raise HarnessError(f"method cascade has no {step.phase!r} step (it keeps no full cache to re-run)")

    def _begin_decode(self, step):
        self.weights = None                                    # prefill-only state does not outlive its step
        L, S = self.layout, self.store
        plan, icp, n_filled, new = L.device_step(S.ctr, step.positions[:1], self.cfg.selection)
        self.plan, self.slot_icp, self.q_pos, self.stage_slot = plan, icp, n_filled.view(1), n_filled.view(1)
        self.lengths = (n_filled + 1).to(torch.int32).expand(self.batch).contiguous()
        S.ctr.copy_(new)
        self.host_stale = True

    def _begin_prefill(self, step):
        L, T, dev = self.layout, step.length, step.positions.device
        if self.host_stale:                                    # decode steps advanced the device counters
            L.sync_from(self.store.ctr, step.start)
            self.host_stale = False
        n = L.n_filled
        if n + T > self.info.max_position:
            raise HarnessError(f"cascade: a chunk of {T} tokens after {n} cached ones reaches position {n + T - 1}, "
                               f"beyond the model's {self.info.max_position}; lower the stride")
        self.n_old = n
        self.slot_icp = torch.tensor(L.positions()[:n], dtype=torch.long, device=dev)
        self.q_pos = torch.arange(n, n + T, device=dev)
        beta = self.cfg.beta
        self.weights = ((1 - beta) * beta ** torch.arange(T - 1, -1, -1, dtype=torch.float64)).float().to(dev)
        self.plan = L.chunk_plan(T, self.cfg.selection, dev)
        self.store.ctr.copy_(torch.tensor([L.stored, L.start], dtype=torch.long))

    def _rotations(self, rope, like):
        """cos/sin of the slots and of the queries, once per step for every layer."""
        if self._cs is None:
            self._cs = rope.cos_sin(self.slot_icp, like) + rope.cos_sin(self.q_pos, like)
        return self._cs

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Per query head [B, Hq, L] -> per KV head [B, Hkv, L] (homogeneous: one row, expanded)."""
        B, Hq, n = x.shape
        Hkv = self.info.num_kv_heads
        g = x.view(B, 1, Hq, n) if self.cfg.homogeneous_heads else x.view(B, Hkv, Hq // Hkv, n)
        how = self.cfg.head_reduction
        out = g.amax(2) if how == "max" else g.mean(2) if how == "mean" else g.median(2).values
        return out.expand(B, Hkv, n) if self.cfg.homogeneous_heads else out

    def attend(self, layer, q, k, v, rope):
        if self.step.phase == "decode":
            return self._decode(layer, q, k, v, rope)
        return self._prefill(layer, q, k, v, rope)

    def _decode(self, layer, q, k, v, rope):
        S, L, beta = self.store, self.layout, self.cfg.beta
        cs, ss, cq, sq = self._rotations(rope, q)
        X = self.stage_slot
        S.k[layer].index_copy_(2, X, k)                      # write, then attend: the token sees itself
        S.v[layer].index_copy_(2, X, v)
        # keys rotated inside the attention kernel (a rotated copy of the cache cost more than attending)
        out, probs = rotated_decode_mass(rotate(q, cq, sq)[:, :, 0].contiguous(), S.k[layer], S.v[layer], cs, ss,
                                         self.lengths, self.info.scaling, max_length=L.slots)
        self.record(layer, self.lengths)
        red = self._reduce(probs)
        sc = S.score[layer]
        lo, hi = L.S, L.S + L.cache
        sc[:, :, lo:hi] = beta * sc[:, :, lo:hi] + (1 - beta) * red[:, :, lo:hi]
        new_score = (1 - beta) * red.index_select(2, X)
        cascade_apply(S.k[layer], S.v[layer], sc, S.tok[layer], k, v, new_score, self.step.positions[:1],
                      self.plan)
        return out.view(q.shape[0], 1, -1)

    def _prefill(self, layer, q, k, v, rope):
        S, L, n = self.store, self.layout, self.n_old
        cs, ss, cq, sq = self._rotations(rope, q)
        kr = rotate(k, cq, sq)
        if n:
            keys = torch.cat([rotate(S.k[layer, :, :, :n], cs, ss), kr], 2)
            values = torch.cat([S.v[layer, :, :, :n], v], 2)
        else:
            keys, values = kr, v
        out, mass = strided_attention(rotate(q, cq, sq), keys, values, self.info.scaling, self.weights)
        red = self._reduce(mass)
        sc = S.score[layer]
        lo, hi = L.S, L.S + L.cache
        sc[:, :, lo:hi] *= self.cfg.beta ** q.shape[2]
        if n > lo:
            sc[:, :, lo:n] += red[:, :, lo:n]
        cascade_apply(S.k[layer], S.v[layer], sc, S.tok[layer], k, v, red[:, :, n:], self.step.positions, self.plan)
        return out
