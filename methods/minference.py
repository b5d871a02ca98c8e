"""MInference 1.0 (Jiang et al., 2024; microsoft/MInference): prefill-time dynamic sparse attention, one
of three patterns per query head chosen offline, the sparse index estimated online from the prompt;
decoding is dense over the full KV cache (`method=full` from the first generated token on).

Reference behaviour (minference/modules/minference_forward.py `minference_prefill_kernel`, the kernels
in minference/ops/, csrc/vertical_slash_index.cu); details in methods/minference_patterns.py:
  * vertical_slash (V, S) ("vertical_and_slash"): sizes clamped to [30, N] and [50, N]; the last 64
    queries' causal softmax attention summed -> top-V key columns (the first 30 forced) and, summed
    along each diagonal, top-S diagonals (the 100 nearest forced); the kernel attends each chosen
    diagonal as the 64-key range it crosses inside each 64-query block (`slash_cover: block`; `token`
    = the paper's exact diagonals), plus the chosen columns, causally.
  * a_shape (INIT, LOCAL) ("stream_llm", ops/streaming_kernel.py `streaming_forward`): the first INIT
    keys + a window of LOCAL keys ending at the query itself.
  * block_sparse (K) (ops/block_sparse_flash_attention.py, `block_sparse_kernel` topk=100): 64-token
    blocks, mean-pooled q . k, the top-K causal key blocks per query block (nothing forced).
A head missing from a reference config falls back to vertical_slash 1000/6096 (`best_pattern.get`);
a file here has every head. Layers below `dense_layers` prefill densely (reference `starting_layer`).
Short prompts: the reference has no length threshold in its HF path (only q_len == 1 is dense); its
size clamps make a head dense once its sizes cover the prompt (1000/6096 is dense up to 6096 tokens).
`dense_below` adds a threshold (vLLM's integration has one, `sparse_attention_threshold`); default off.

Per-model head patterns: methods/patterns/<model>.json, found by `python -m runners.minference_search`
(the reference's offline kernel-aware search, methods/patterns/README.md). `size_scale` multiplies
every size (the reference's `minference_ratio`), for reference-sized patterns at shorter prompts.

Not modelled: MInference's Triton/CUDA sparse kernels. The masked prefill here is torch SDPA with an
explicit [chunk x N] mask per query chunk: same attention, no prefill speed-up (decode is dense
anyway); `stats()["prefill_density"]` reports the fraction of causal pairs each layer attended.
A prompt in several prefill steps (chunked or strided NLL) applies the patterns to each step's
queries over every cached key, by absolute position (the reference sees one forward).
"""
from __future__ import annotations

from dataclasses import dataclass

import kernels
from methods import minference_patterns as P
from methods.base import register
from methods.config import MethodConfig, layer_range, option
from methods.full import Full


@dataclass(frozen=True)
class MInferenceConfig(MethodConfig):
    """MInference 1.0 (microsoft/MInference): sparse prefill with a per-head pattern (vertical-slash, A-shape,
    block-sparse) whose index is estimated from the prompt; dense decode over every token. Budget = the
    pattern sizes of each query head (methods/patterns/<model>.json); the reference's constants as defaults."""

    patterns: str = option("auto", "auto = methods/patterns/<model>.json (python -m runners.minference_search) | PATH "
                           "(ours or a reference minference/configs/*.json) | all:<p> | mix:<p>,<p>,... (cycled over "
                           "query heads); p = vertical_slash:V:S | a_shape:INIT:LOCAL | block_sparse:K | dense")
    pattern_model: str | None = option("${oc.select:model.name,null}", "model name of patterns=auto (Hydra fills it "
                                       "from model.name)")
    size_scale: float = option(1.0, "every pattern size x this, int() (reference minference_ratio)", min=0.0)
    last_q: int = option(64, "vertical-slash estimation: the last queries that score (reference last_q = 64)", min=1)
    block_size: int = option(64, "query/key block of the kernels: slash ranges and block_sparse blocks (64)", min=1)
    init_columns: int = option(30, "vertical-slash: first key columns always kept (reference vertical[..., :30])",
                               min=0)
    local_slashes: int = option(100, "vertical-slash: nearest diagonals always kept (minference_prefill_kernel: "
                                "slash[..., -100:]; the v1 search used 30)", min=1)
    min_vertical: int = option(30, "vertical-slash: vertical_size clamped up to this (max(v, 30))", min=1)
    min_slash: int = option(50, "vertical-slash: slash_size clamped up to this (max(s, 50))", min=1)
    slash_cover: str = option("block", "block: a diagonal covers its key range per query block (the kernel's "
                              "convert_vertical_slash_indexes); token: the exact diagonal (paper)",
                              choices=("block", "token"))
    dense_layers: int = option(0, "layers [0, dense_layers) prefill densely (reference starting_layer; 0 = none)",
                               min=0)
    dense_below: int = option(0, "prompts (keys) shorter than this prefill densely (0 = never, the reference HF "
                              "path)", min=0)
    query_chunk: int = option(1024, "queries per masked-prefill chunk (memory bound only; not a semantic)", min=1)

    def check(self, info):
        if self.dense_layers:
            layer_range("dense_layers", self.dense_layers - 1, info)
        self.pattern_set(info)

    def pattern_set(self, info) -> P.PatternSet:
        ps = P.resolve(self.patterns, model=self.pattern_model, num_layers=info.num_layers, num_heads=info.num_heads)
        if self.size_scale == 1.0:
            return ps
        heads = tuple(tuple(p.scaled(self.size_scale) for p in row) for row in ps.heads)
        return P.PatternSet(heads, f"{ps.source} x{self.size_scale:g}")

    def consts(self) -> P.Consts:
        return P.Consts(self.last_q, self.block_size, self.init_columns, self.local_slashes, self.min_vertical,
                        self.min_slash, self.slash_cover)

    def describe(self):
        return {"budget_unit": "per query head pattern sizes in prefill (vertical_slash V columns + S diagonals; "
                               "a_shape INIT + LOCAL; block_sparse K blocks); decode dense over every token",
                "prefill": f"sparse (patterns {self.patterns}), dense layers < {self.dense_layers}",
                "decode": "dense", "positions": "original",
                "slash_cover": self.slash_cover, "kernels": "torch masked SDPA (no Triton sparse kernel)"}

    @classmethod
    def variants(cls):
        small = {"last_q": 8, "block_size": 8, "init_columns": 2, "local_slashes": 4, "min_vertical": 2,
                 "min_slash": 3}
        return [{"patterns": "mix:vertical_slash:4:6,a_shape:2:8,block_sparse:2,vertical_slash:3:4", **small},
                {"patterns": "all:vertical_slash:3:5", "slash_cover": "token", "dense_layers": 2, **small},
                {"patterns": "all:block_sparse:2", "size_scale": 1.5, "block_size": 4}]

    def full_equivalent(self, context):
        return {"patterns": f"all:vertical_slash:{context}:{context}", "size_scale": 1.0}


@register
class MInference(Full):
    """Full attention (its store, decode and graph safety) with the prefill replaced."""

    name = "minference"
    Config = MInferenceConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        self._patterns = None
        self._density: dict[int, float] = {}

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        if self._patterns is None:  # resolved once per method object (a file read), not per sample
            self._patterns = self.cfg.pattern_set(info)
            self._consts = self.cfg.consts()
        self._density = {}

    def attend(self, layer, q, k, v, rope):
        step, c = self.step, self.cfg
        if step.phase == "decode":
            return super().attend(layer, q, k, v, rope)
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.positions, k, v)
        keys, values = self.store.view(layer, step.end)
        heads = self._patterns.heads[layer]
        if layer < c.dense_layers or step.end < c.dense_below or all(p.kind == "dense" for p in heads):
            self._density[layer] = 1.0
            return kernels.prefill_attention(q, keys, values, self.info.scaling)
        out, density = P.sparse_prefill(q, keys, values, step.positions, heads, self._consts, self.info.scaling,
                                        c.query_chunk)
        self._density[layer] = density
        return out

    def stats(self):
        out = super().stats()
        if self._density:
            out["prefill_density"] = {layer: round(d, 6) for layer, d in sorted(self._density.items())}
            out["prefill_density_mean"] = sum(self._density.values()) / len(self._density)
        if self._patterns is not None:  # resolved at setup: what `patterns` named (a file, its head counts)
            out["pattern_source"] = self._patterns.source
            out["pattern_counts"] = self._patterns.counts()
        return out
