"""MInference 1.0 (Jiang et al., 2024; microsoft/MInference): prefill-time dynamic sparse attention, one
of three patterns per query head chosen offline, the sparse index estimated online from the prompt;
decoding is dense over the full KV cache (`method=full` from the first generated token on).

Reference behaviour (minference/modules/minference_forward.py `minference_prefill_kernel`, the kernels
in minference/ops/, csrc/vertical_slash_index.cu); details in methods/parts/minference_patterns.py:
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

Per-model head patterns: methods/patterns/<model>.json, found by `python -m offline.minference_search`
(the reference's offline kernel-aware search, methods/patterns/README.md). `size_scale` multiplies
every size (the reference's `minference_ratio`), for reference-sized patterns at shorter prompts.

Kernels: on CUDA (kernels/_common.backend_for: HARNESS_KERNELS=torch|triton forces) the prefill is
our Triton take on the reference's block/column sparse flash-attention kernel (kernels/block_sparse_prefill.py):
per query block a list of key ranges plus single columns built from the same estimated index,
attending exactly the keys of the masked path with `slash_cover: block` (minference_patterns.rows_mask;
the reference builder's range merge, up to block - 1 extra keys, is not reproduced). Elsewhere, and
for `slash_cover: token` (no kernel: exact diagonals), it is torch SDPA with an explicit [chunk x N]
mask per query chunk: same attention, no speed-up. `stats()` says which ran (`prefill_path`: layers
per path) and `prefill_density` the fraction of causal pairs each layer attended (counted by the
kernel itself on its path). The index estimation is torch on every device, per head as in the reference
(on the kernel path heads of one pattern are estimated and listed as one batch: the same index, fewer
launches; issue 34: head by head it cost 0.62 s a layer at 128K on the H100, more than the kernel's 0.29).
Decode is dense.
A prompt in several prefill steps (chunked or strided NLL) applies the patterns to each step's
queries over every cached key, by absolute position (the reference sees one forward); the kernel
takes such a step too (its first query block may be partial).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels import block_sparse_prefill as KM
from methods.base import register
from methods.config import MethodConfig, layer_range, option
from methods.full import Full
from methods.parts import minference_patterns as P


@dataclass(frozen=True)
class MInferenceConfig(MethodConfig):
    """MInference 1.0 (microsoft/MInference): sparse prefill with a per-head pattern (vertical-slash, A-shape,
    block-sparse) whose index is estimated from the prompt; dense decode over every token. Budget = the
    pattern sizes of each query head (methods/patterns/<model>.json); the reference's constants as defaults."""

    patterns: str = option("auto", "auto = methods/patterns/<model>.json (python -m offline.minference_search) | PATH "
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
                "slash_cover": self.slash_cover,
                "kernels": "block/column sparse Triton kernel on CUDA (slash_cover block); torch masked SDPA on "
                           "the CPU and for slash_cover token"}

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
        self._density: dict = {}
        self._paths: dict[int, str] = {}

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        if self._patterns is None:  # resolved once per method object (a file read), not per sample
            self._patterns = self.cfg.pattern_set(info)
            self._consts = self.cfg.consts()
        self._density, self._paths = {}, {}

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
            self._note(layer, DENSE_PATH, 1.0)
            return kernels.prefill_attention(q, keys, values, self.info.scaling)
        path = prefill_path(q, c.slash_cover)
        if path == KERNEL_PATH:
            out, density = kernel_prefill(q, keys, values, step.positions, step.start, heads, self._consts,
                                          self.info.scaling)
        else:
            out, density = P.sparse_prefill(q, keys, values, step.positions, heads, self._consts, self.info.scaling,
                                            c.query_chunk)
        self._note(layer, path, density)
        return out

    def _note(self, layer, path, density):
        self._density[layer] = density       # a device scalar on the kernel path: read in stats(), no sync here
        self._paths[layer] = path

    def stats(self):
        out = super().stats()
        if self._density:
            dens = {layer: float(d) for layer, d in sorted(self._density.items())}
            out["prefill_density"] = {layer: round(d, 6) for layer, d in dens.items()}
            out["prefill_density_mean"] = sum(dens.values()) / len(dens)
            paths = list(self._paths.values())
            out["prefill_path"] = {p: paths.count(p) for p in sorted(set(paths))}   # layers per path
        if self._patterns is not None:  # resolved at setup: what `patterns` named (a file, its head counts)
            out["pattern_source"] = self._patterns.source
            out["pattern_counts"] = self._patterns.counts()
        return out


KERNEL_PATH = "triton block/column kernel"
DENSE_PATH = "dense (kernels.prefill_attention)"   # dense layers, short prompts, all-dense layers


def prefill_path(q, cover: str) -> str:
    """Which sparse prefill runs for q's device: the kernel where kernels dispatch to Triton and the slash
    cover is the kernel's (block); the masked torch reference otherwise, with the reason."""
    if kernels.backend_for(q) != "triton":
        return "torch masked SDPA (reference backend)"
    if cover != "block":
        return "torch masked SDPA (slash_cover token: no kernel)"
    return KERNEL_PATH


def kernel_prefill(q, k, v, q_pos, q_start: int, heads, c: P.Consts, scale: float):
    """P.sparse_prefill on the kernel: the same index estimation (torch, heads of one pattern batched, each query
    head over its own KV head), the block/column lists (batched per pattern), one launch for the layer. q_pos must be q_start + arange(T)
    (a prefill step's positions). -> ([B, T, Hq * D], density as a device scalar: pairs the kernel attended
    over the causal pairs)."""
    B, Hq, T, _ = q.shape
    N = k.shape[2]
    index = P.layer_index(heads, q, k, q_pos, c, scale)
    idx = KM.build_index(heads, index, q_start, T, N, B, c.block, q.device)
    out, pairs = KM.mixed_sparse_attention(q, k, v, idx, scale, count=True)
    causal = B * Hq * (T * q_start + T * (T + 1) // 2)
    return out, pairs.sum(dtype=torch.int64).double() / max(causal, 1)
