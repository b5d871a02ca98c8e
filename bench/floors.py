"""One floor model for every registered method: the bytes a decode step must read or move at least,
from the method's typed config and the model's shape (issue 33).

    floor(name, cfg, info, context, batch, weight_bytes, elt) -> Floor(weights, kv, selection, moves)
    Floor.ms(bandwidth)                                -> the time floor: all bytes over the rate

What counts, per decode step and sequence (summed over layers; a "row" is one head's K and V
vectors, 2 x D values):
  weights    every weight matrix once (the input embedding table is not read, one row of it is;
             a head tied to the embedding is read once, as the output projection);
  kv         the KV rows the method attends: all of them in dense layers and dense heads, its budget
             per head (query head or KV head, as its config says) elsewhere;
  selection  what its selection must read besides those rows: Quest's page bounds (min and max key:
             one row per page), Tactic's centroid keys, InfLLM's block representatives, Ltri-LLM's
             index vectors (at least `min_vectors` per block: a lower bound), and the persistent score
             state an eviction rule reads and rewrites every step (H2O's and Cascade's fp32 scores).
             Scores computed and consumed inside one step are not counted (a fused top-k need not
             write them);
  moves      host-to-device bytes. InfLLM/Ltri-LLM with offload move a retrieved block only when it is new
             to its staging slot (methods/parts/infllm_stage.py); how many is data-dependent, so the
             benchmark passes the bytes it measured per step (the method's `staged_bytes`), as it passes
             Tactic's attended tokens; without a measurement the floor counts none (all hits).
The time floor divides reads by a measured copy rate (bench.engine.copy_bandwidth) or 3.0 TB/s, and moves by
a measured host-to-device rate (bench.every_method.h2d_bandwidth) or 50 GB/s (PCIe 5.0 x16's ~64 less overhead).

Every registered method must have an entry in ROWS (the tests fail otherwise), and one in
BUDGET_KNOB: the option that sets its token budget (tokens per head), used by the every-method
benchmark and the accuracy-vs-speed item so that all methods run at one budget ratio.
Data-dependent budgets (Tactic's fit mode) take the tokens the step attended, measured (`attended`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from methods import ModelInfo
from methods.parts.budget import BUDGET_KNOB, KNOB_NOTE  # noqa: F401 (re-exported: one place, below analysis)

H100_BANDWIDTH = 3.0e12          # bytes/s, when none was measured in the same run
H2D_BANDWIDTH = 50e9             # bytes/s host to device, when none was measured


@dataclass(frozen=True)
class Rows:
    """Per sequence and decode step, summed over layers: KV rows attended, selection bytes, moved bytes."""
    kv: float
    selection_rows: float = 0.0        # in KV-row units (one K row = half a KV row)
    selection_fp32: float = 0.0        # fp32 values read and written back (persistent scores)
    moves: float = 0.0
    note: str = ""


@dataclass(frozen=True)
class Floor:
    weights: float
    kv: float
    selection: float
    moves: float
    note: str = ""

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.selection + self.moves

    def ms(self, bandwidth: float = H100_BANDWIDTH, h2d: float = H2D_BANDWIDTH) -> float:
        """Reads at the memory rate, moves at the host-to-device rate (one after the other: a lower bound
        only if they could not overlap; the decode step's moves feed its attention, so they do not)."""
        return 1e3 * ((self.weights + self.kv + self.selection) / bandwidth + self.moves / h2d)

    def as_dict(self, bandwidth: float, h2d: float = H2D_BANDWIDTH) -> dict:
        return {"weights_gb": self.weights / 1e9, "kv_gb": self.kv / 1e9, "selection_gb": self.selection / 1e9,
                "moves_gb": self.moves / 1e9, "floor_gb": self.total / 1e9, "floor_ms": self.ms(bandwidth, h2d),
                "floor_note": self.note}


def _dense(info: ModelInfo, c: int) -> float:
    return info.num_layers * info.num_kv_heads * c


def _bounded(n: int):
    """A store of `n` tokens per KV head in every layer (sinks, windows, evicting caches)."""
    return lambda cfg, info, c, att: Rows(info.num_layers * info.num_kv_heads * min(n(cfg), c))


def _full(cfg, info, c, att):
    return Rows(_dense(info, c), note="dense decode")


def _truncate(cfg, info, c, att):
    return Rows(_dense(info, min(cfg.budget, c)))


def _streaming(cfg, info, c, att):
    keep = cfg.budget if cfg.budget is not None else cfg.sink + cfg.window
    return Rows(_dense(info, min(keep + 1, c)))


def _cascade(cfg, info, c, att):
    n = min(cfg.sink + cfg.cache_size, c)
    return Rows(_dense(info, n), selection_fp32=_dense(info, n), note="EMA scores read and rewritten")


def _h2o(cfg, info, c, att):
    if cfg.eviction != "real":
        return Rows(_dense(info, c), note="simulated eviction: the full store under a mask")
    n = min(cfg.budget + 1, c)
    return Rows(_dense(info, n), selection_fp32=_dense(info, n), note="accumulated scores read and rewritten")


def _snap(cfg, info, c, att):
    heads = info.num_heads if cfg.heads == "query" else info.num_kv_heads
    note = "one kept set per query head" if cfg.heads == "query" else ""
    if hasattr(cfg, "beta"):                                   # PyramidKV: per-layer budgets
        note = (note + "; " if note else "") + "layer budgets average the budget"
    return Rows(info.num_layers * heads * min(cfg.budget, c), note=note)


def _bigbird(cfg, info, c, att):
    if cfg.budget >= c:
        return _full(cfg, info, c, att)
    shared = info.num_kv_heads * (cfg.sink + cfg.window)    # sinks and window: one read per KV group
    return Rows(info.num_layers * (shared + info.num_heads * cfg.n_random), note="random picks per query head")


def _head_set(cfg, info, c, stream: int):
    hs = cfg.head_set(info)
    n_ret = hs.count
    return Rows(n_ret * c + (info.num_layers * info.num_kv_heads - n_ret) * min(stream, c),
                note=f"{n_ret} dense KV heads ({hs.source})")


def _duo(cfg, info, c, att):
    return _head_set(cfg, info, c, cfg.sink + cfg.window + 1)


def _lychee(cfg, info, c, att):
    return _head_set(cfg, info, c, cfg.budget)


def _quest(cfg, info, c, att):
    L, Hq, Hkv = info.num_layers, info.num_heads, info.num_kv_heads
    dense = min(cfg.dense_layers, L)
    per = Hq if cfg.pool == "query_head" else Hkv
    pages = -(-c // cfg.page_size)
    return Rows(dense * Hkv * c + (L - dense) * per * min(cfg.budget, c),
                selection_rows=(L - dense) * Hkv * pages, note="page bounds: min+max key = one row per page")


def _tidal(cfg, info, c, att):
    L, Hq, Hkv = info.num_layers, info.num_heads, info.num_kv_heads
    dense = min(cfg.dense_layers + 1 + (cfg.reselect_layer is not None), L)   # + the selecting layers
    per = Hq if cfg.select == "query_head" else Hkv
    return Rows(dense * Hkv * c + (L - dense) * per * min(cfg.budget, c), note="selection layers dense")


def _tactic(cfg, info, c, att):
    L, Hq, Hkv = info.num_layers, info.num_heads, info.num_kv_heads
    dense = min(cfg.dense_layers, L)
    per = Hq if cfg.select == "query_head" else Hkv
    if cfg.mode == "topk":
        tokens, note = min(cfg.budget, c), "top-k mode"
    elif att is not None:
        tokens, note = min(att, c), f"{cfg.mode} mode: the measured tokens attended per head"
    else:
        tokens, note = c, f"{cfg.mode} mode: no measured budget, every token assumed"
    centroids = (L - dense) * Hkv * -(-c // cfg.cluster_size) / 2          # keys only: half a row each
    return Rows(dense * Hkv * c + (L - dense) * per * tokens, selection_rows=centroids,
                note=note + "; centroid keys read")


def _memory(cfg, info, c, att):
    """InfLLM / Ltri-LLM: sinks + local window + topk retrieved blocks per KV head, plus the blocks'
    representatives (InfLLM: repr_topk keys per block; Ltri-LLM: at least min_vectors index vectors)."""
    L, Hkv = info.num_layers, info.num_kv_heads
    attended = min(cfg.n_init + cfg.n_local + cfg.topk * cfg.block_size, c)
    blocks = max(0, c - cfg.n_init - cfg.n_local) // cfg.block_size
    per_block = cfg.repr_topk if hasattr(cfg, "repr_topk") else max(1, cfg.min_vectors)
    note = "representative keys per block" if hasattr(cfg, "repr_topk") else "index vectors: >= min_vectors per block"
    if cfg.offload:
        note += "; offloaded blocks: moves as measured (none without a measurement)"
    return Rows(L * Hkv * attended, selection_rows=L * Hkv * blocks * per_block / 2, note=note)


def _lm_infinite(cfg, info, c, att):
    return Rows(_dense(info, min(cfg.local_branch + cfg.global_branch, c)))


ROWS: dict[str, Callable[..., Rows]] = {
    "full": _full, "minference": _full, "truncate": _truncate, "streaming_llm": _streaming,
    "lm_infinite": _lm_infinite, "cascade": _cascade, "minference_cascade": _cascade, "h2o": _h2o,
    "tova": _bounded(lambda cfg: cfg.budget + 1), "snapkv": _snap, "pyramidkv": _snap, "bigbird": _bigbird,
    "duo": _duo, "lychee": _lychee, "quest": _quest, "tidal": _tidal, "tactic": _tactic, "infllm": _memory,
    "ltri": _memory,
}

# The option(s) that set a method's token budget K (tokens per head); {} = dense decode, no budget.


def kv_rows(name: str, cfg, info: ModelInfo, context: int, attended: float | None = None) -> float:
    """KV rows a decode step reads per sequence, summed over layers, page bounds included (the
    quantity bench.tpot and bench.lychee_tpot report as kv_gb_read)."""
    r = ROWS[name](cfg, info, context, attended)
    return r.kv + r.selection_rows


def floor(name: str, cfg, info: ModelInfo, context: int, batch: int, weight_bytes: float, elt: int,
          attended: float | None = None, moved: float | None = None) -> Floor:
    """The bytes one decode step of `batch` sequences at `context` tokens must read or move; `moved`: the
    host-to-device bytes a step of the whole batch was measured to move (offloaded memories)."""
    if name not in ROWS:
        raise KeyError(f"no floor model for method {name!r}: add it to bench/floors.py ROWS")
    r = ROWS[name](cfg, info, context, attended)
    row = 2 * info.head_dim * elt
    return Floor(weights=weight_bytes, kv=batch * r.kv * row,
                 selection=batch * (r.selection_rows * row + r.selection_fp32 * 2 * 4),
                 moves=moved if moved is not None else batch * r.moves, note=r.note)


def weight_bytes(model, elt: int) -> float:
    """Bytes of the weights a decode step reads: every parameter but the input embedding table,
    unless the output projection is that same table (tied)."""
    total = sum(p.numel() for p in model.parameters())
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (out is None or out.weight is not emb.weight):
        total -= emb.weight.numel()
    return total * elt
