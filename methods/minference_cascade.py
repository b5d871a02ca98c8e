"""MInference + Cascade (Willette et al., ICLR 2025, appendix C.1-C.2, Tables 8-9): the Cascading KV cache
(methods/cascade.py) whose strided prefill computes each chunk's self-attention with MInference's sparse
patterns (methods/minference.py), so that the stride can grow to 100K tokens (the paper's setting).

Interpretation (the reference's attention module for "minference-cascade" is not public; the paper says
"the leading chunk (stride) of the attention matrix uses MInference instead of dense attention" and bounds
one head's attention matrix per step by 100K x (100K + |C|)): a chunk of T queries attends
  * the sinks and the cascades (n <= sink + cache_size keys) densely, as Cascade does, and
  * its own T keys, causally, under each query head's MInference pattern, the index estimated from the
    chunk alone as if it were MInference's whole prompt (chunk-local positions: the last `last_q` queries
    of the chunk over its keys; A-shape sinks are the chunk's first keys; the pattern sizes clamp to T),
with one softmax over both parts (merged exactly by log-sum-exp: kernels/block_sparse_chunk.py). Decode
is Cascade's, dense over the bounded cache. Layers below `dense_layers`, chunks shorter than
`dense_below` and layers whose heads are all `dense` take Cascade's dense chunk.

EMA scores stay Cascade's definition, exactly: every cached key gets the EMA-weighted post-softmax mass
the chunk's queries gave it under the merged normaliser; a chunk key gets its mass from the pairs the
pattern attended (a pair not attended has probability 0). With a pattern covering every pair (e.g.
vertical_slash:T:T) the method is Cascade, outputs and scores bit for bit on the torch path
(tests/test_methods_minference_cascade.py).

Options: Cascade's (defaults the reference scripts', but `stride` 100000, the paper's) and MInference's
pattern options (patterns, size_scale, last_q, block_size, ... as methods/minference.py documents them).
`slash_cover: token` (exact diagonals) has no block/column index and is refused; `query_chunk` bounds only
MInference's masked path and is not used here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from common.errors import ConfigError
from kernels import block_sparse_prefill as KM
from kernels.block_sparse_chunk import chunk_attention
from kernels.cascade_update import cascade_apply
from kernels.fused import rope as rotate
from methods.base import register
from methods.cascade import Cascade, CascadeConfig
from methods.config import option
from methods.minference import MInferenceConfig
from methods.parts import minference_patterns as P

SPARSE_PATH = "chunk: MInference index over its own keys, dense over the cache"
DENSE_PATH = "chunk: dense (Cascade's strided_attention)"


@dataclass(frozen=True)
class MInferenceCascadeConfig(CascadeConfig, MInferenceConfig):
    """MInference + Cascade (Cascading KV Cache appendix C): the Cascading cache's strided prefill with each
    chunk's self-attention sparse under MInference's per-head patterns (the cache part dense, one softmax);
    Cascade's decode. Defaults: Cascade's, a 100K stride (the paper's), MInference's pattern constants."""

    stride: int | None = option(100000, "prefill stride: the prompt streams through the cache in chunks of this many "
                                "tokens, each chunk's self-attention sparse (the paper's 100K); null = one chunk",
                                min=1)
    # MInference's options as they are, but these two docs: their meaning differs here
    dense_below: int = option(0, "chunks (their own keys) shorter than this take Cascade's dense chunk (0 = never)",
                              min=0)
    query_chunk: int = option(1024, "unused here (MInference's masked torch path only; inherited option)", min=1)

    def check(self, info):
        if self.slash_cover != "block":
            raise ConfigError("method.slash_cover=token is not supported by minference_cascade: its chunks run on the "
                              "block/column index (slash_cover block)")
        if info.head_dim < 16 or info.head_dim & (info.head_dim - 1):
            raise ConfigError(f"minference_cascade needs a power-of-two head_dim >= 16 (its kernels), the model has "
                              f"{info.head_dim}")
        CascadeConfig.check(self, info)
        MInferenceConfig.check(self, info)

    def describe(self):
        sparse = (f"strided ({self.stride}): each chunk's self-attention sparse (patterns {self.patterns}, index "
                  f"estimated per chunk), dense over sinks + cache, one softmax" if self.stride else
                  f"one chunk, sparse (patterns {self.patterns})")
        return {**CascadeConfig.describe(self), "prefill": sparse,
                "prefill_dense_layers": self.dense_layers, "slash_cover": self.slash_cover, "decode": "dense over the "
                "bounded cache (Cascade)", "chunk_scores": "EMA mass of the attended pairs only, merged normaliser"}

    @classmethod
    def variants(cls):
        small = {"last_q": 8, "block_size": 8, "init_columns": 2, "local_slashes": 4, "min_vertical": 2,
                 "min_slash": 3}
        return [{"sink": 4, "cache_size": 16, "cascades": 4, "stride": 16,
                 "patterns": "mix:vertical_slash:4:6,a_shape:2:8,block_sparse:2,vertical_slash:3:4", **small},
                {"sink": 2, "cache_size": 12, "cascades": 2, "stride": None, "head_reduction": "mean",
                 "patterns": "all:vertical_slash:3:5", "dense_layers": 2, **small},
                {"sink": 0, "cache_size": 8, "cascades": 2, "stride": 11, "selection": False, "homogeneous_heads": True,
                 "patterns": "all:block_sparse:2", "block_size": 4}]

    def full_equivalent(self, context):
        return {**CascadeConfig.full_equivalent(self, context), **MInferenceConfig.full_equivalent(self, context)}


@register
class MInferenceCascade(Cascade):
    """Cascade (store, plans, decode, graph safety) with the chunk attention of a prefill step replaced."""

    name = "minference_cascade"
    Config = MInferenceCascadeConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        self._patterns = None
        self._pairs: dict = {}          # layer -> [pairs attended (device int64), causal pairs] over the prompt
        self._density: dict[int, float] = {}
        self._paths: dict[int, str] = {}

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        if self._patterns is None:      # resolved once per method object (a file read), not per sample
            self._patterns = self.cfg.pattern_set(info)
            self._consts = self.cfg.consts()
        self._pairs, self._density, self._paths = {}, {}, {}

    def _prefill(self, layer, q, k, v, rope):
        c, T = self.cfg, q.shape[2]
        heads = self._patterns.heads[layer]
        if layer < c.dense_layers or T < c.dense_below or all(p.kind == "dense" for p in heads):
            self._paths[layer] = DENSE_PATH
            return super()._prefill(layer, q, k, v, rope)
        self._paths[layer] = SPARSE_PATH
        # Cascade._prefill with the chunk attention swapped (methods/cascade.py is left as it is: the committed
        # cascade benchmarks record its code)
        S, L, n = self.store, self.layout, self.n_old
        cs, ss, cq, sq = self._rotations(rope, q)
        kr, qr = rotate(k, cq, sq), rotate(q, cq, sq)
        if n:
            keys = torch.cat([rotate(S.k[layer, :, :, :n], cs, ss), kr], 2)
            values = torch.cat([S.v[layer, :, :, :n], v], 2)
        else:
            keys, values = kr, v
        idx = self._chunk_index(qr, kr, heads)
        out, mass, pairs = chunk_attention(qr, keys, values, n, idx, self.info.scaling, self.weights)
        acc = self._pairs.setdefault(layer, [0, 0])
        acc[0] = acc[0] + pairs
        acc[1] += q.shape[0] * q.shape[1] * T * (T + 1) // 2
        red = self._reduce(mass)
        sc = S.score[layer]
        lo, hi = L.S, L.S + L.cache
        sc[:, :, lo:hi] *= self.cfg.beta ** T
        if n > lo:
            sc[:, :, lo:n] += red[:, :, lo:n]
        cascade_apply(S.k[layer], S.v[layer], sc, S.tok[layer], k, v, red[:, :, n:], self.step.positions, self.plan)
        return out

    def _chunk_index(self, q, k, heads) -> KM.SparseIndex:
        """The chunk's block/column index: each query head's pattern estimated over the chunk's own (rotated)
        keys at chunk-local positions, as MInference does (methods/minference.py kernel_prefill: equal-pattern heads
        batched); a subclass may replace the estimate (bench/minference_cascade.py's nearest index)."""
        B, T = q.shape[0], q.shape[2]
        pos = torch.arange(T, device=q.device)
        index = P.layer_index(heads, q, k, pos, self._consts, self.info.scaling)
        return KM.build_index(heads, self._adjust_index(heads, index, T), 0, T, T, B, self._consts.block, q.device)

    def _adjust_index(self, heads, index, T: int):
        """The estimated index as the method uses it (unchanged); the benchmark's nearest-diagonal mode
        overrides this in a subclass, after the estimation has run (and been timed)."""
        return index

    def before_decode(self, seq_len):
        # the prefill's pair counts read once, here (host, outside any CUDA graph): no sync inside a step,
        # and no tensor kept across decode steps
        self._settle()

    def _settle(self):
        for layer, (pairs, causal) in self._pairs.items():
            self._density[layer] = float(pairs) / max(causal, 1)
        self._pairs = {}

    def stats(self):
        self._settle()
        out = super().stats()
        if self._density:
            out["chunk_density"] = {layer: round(d, 6) for layer, d in sorted(self._density.items())}
            out["chunk_density_mean"] = sum(self._density.values()) / len(self._density)
        if self._paths:
            paths = list(self._paths.values())
            out["prefill_path"] = {p: paths.count(p) for p in sorted(set(paths))}   # layers per path
        if self._patterns is not None:
            out["pattern_source"] = self._patterns.source
            out["pattern_counts"] = self._patterns.counts()
        return out
