"""Ltri-LLM (Tang, Xiu et al., arXiv 2412.04757; no public code): InfLLM's context memory (sinks, local
window, 128-token blocks offloaded to pinned host memory, memory at a fixed distance) with blocks indexed
by the semantic spans their attention map shows as triangles.

- The layer keeps a band of its attention map: for each recent token, the joint-softmax probability it
  gave to each of the previous block_size tokens, summed over query heads (Eq. 4).
- When a block leaves the window its map is cut into spans (methods/parts/ltri_spans.py, the rules; batched over a
  chunk's leaving blocks on the maps' GPU by ltri_device.py, on the host by ltri_batch.py, the same bits: triangle
  scores with a baseline theta via prefix sums, one candidate per anti-diagonal, 1-D NMS with IoU phi), and each
  span keeps ceil(len * exp(-lambda (1 - r_a))) index vectors (Eq. 7): the keys of its tokens that
  received the most local attention, r_a comparing the span's triangle with its neighbours (Omega).
- A chunk's queries are cut into spans the same way (its causal self-attention among its own tokens:
  the memory is not known before retrieval); a query span's index is the sum of its queries, and a
  memory span's similarity to it is Eq. 8 (the sum of all pairwise products of index vectors). A block
  scores the best similarity of its spans over the query spans (Eq. 9); top-k blocks are retrieved.
- Retrieval heads (appendix C, or offline.retrieval_heads): a layer with one indexes and retrieves in
  its best head's space (query head h, its KV head's keys); without any, every layer uses all heads.
- Collaborative voting: a layer ranks blocks by the votes of the retrieval layers up to it (each votes
  for its own top-k with its head's score as weight; ties by the latest voter's similarity). Layers
  before the first retrieval layer index with all heads and retrieve alone.
- Persistent: decoding reuses each layer's retrieval of the last prefill chunk, whose size is Q.
- Ties: span scores, block scores and the attention votes that pick index vectors are rounded to
  2^-12 of their largest value before any ranking (selection.tie_round), ties going to the lower index:
  repeated tokens give equal un-rotated keys, whose scores then differ only by reduction-order noise,
  and the GPU would otherwise choose differently from the CPU (tests/test_methods_precision.py).
Every choice the paper leaves open is an option below (see also reference/methods.md section 5.2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from common.errors import ConfigError
from methods.base import register
from methods.config import option
from methods.infllm import InfLLM, MemoryConfig, _reuse
from methods.parts import ltri_batch as LB
from methods.parts import ltri_device as LD
from methods.parts.ltri_index import Indexing
from methods.parts.ltri_select import Voting
from methods.parts.selection import tie_round
from methods.parts.stores_blocks import IndexVectors


@dataclass(frozen=True)
class LtriConfig(MemoryConfig):
    """Ltri-LLM (arXiv 2412.04757): InfLLM's memory with blocks indexed by their attention map's triangles
    (spans, dynamic index vectors), retrieval heads, collaborative voting, persistent retrieval.
    Defaults: section 4 and table 5 (NIAH row); theta/phi the 'typical' 90th percentile / 0.1."""

    spans_per_block: int = option(4, "spans NMS keeps per block ('Span' of table 5; 6 for RULER)", min=1)
    max_vectors: int = option(12, "index vectors per block at most (M of table 5; 24 for RULER)", min=1)
    min_vectors: int = option(1, "index vectors per span at least (the paper sets one, not its value)", min=1)
    lam: float = option(3.0, "lambda of Eq. 7 (larger: fewer index vectors)", min=0)
    lam_first: float = option(20.0, "lambda of the first `first_layers` layers (section 4: 20 for four)", min=0)
    first_layers: int = option(4, "layers that use lam_first", min=0)
    ratio_mode: str = option("row", "Omega: r_a compares a span's triangle with its row neighbours (its queries' "
                             "attention to earlier tokens of the block), col (later queries' attention to it) "
                             "or rowcol", choices=("row", "col", "rowcol"))
    ratio_area: str = option("mass", "a region's area: its attention mass, or its density (mass per cell)",
                             choices=("mass", "density"))
    theta_quantile: tuple[float, ...] = option((0.9,), "theta as a quantile of the map's lower-triangle entries: "
                                               "one value, or one per layer (table 6)")
    iou: tuple[float, ...] = option((0.1,), "NMS IoU threshold phi: one value, or one per layer (table 7; RULER "
                                    "0.01)")
    fill_gaps: bool = option(True, "tokens outside every kept span form spans of their own, so spans partition "
                             "the block ('divide L_pre into C spans')")
    index: str = option("dynamic", "dynamic: Eq. 7 counts per span; static: max_vectors // spans each (3.3.1)",
                        choices=("dynamic", "static"))
    retrieval_heads: tuple[tuple[float, ...], ...] = option(
        (), "(layer, head, score) triples (appendix C; offline.retrieval_heads finds them); a layer's best head "
        "indexes and retrieves; empty: every layer uses all its heads (the ablation without retrieval heads)")
    voting: bool = option(True, "rank blocks by the score-weighted top-k votes of the retrieval layers up to this "
                          "one (without retrieval heads: all layers up to it, weight 1)")
    persistent: bool = option(True, "decoding reuses each layer's retrieval of the last prefill chunk")
    last_chunk: int | None = option(32, "Q: the prompt's last tokens form their own prefill chunk (table 5: 32 for "
                                    "NIAH); null: plain chunks", min=1)

    @classmethod
    def defaults(cls):
        return {k: _lists(v) for k, v in super().defaults().items()}

    def per_layer(self, values, layer: int) -> float:
        return float(values[0] if len(values) == 1 else values[layer])

    def lam_of(self, layer: int) -> float:
        return self.lam_first if layer < self.first_layers else self.lam

    def heads(self) -> dict[int, tuple[int, float]]:
        """layer -> (query head, score): the best retrieval head of each layer that has one."""
        best: dict[int, tuple[int, float]] = {}
        for entry in self.retrieval_heads:
            layer, head, score = int(entry[0]), int(entry[1]), float(entry[2])
            if layer not in best or score > best[layer][1]:
                best[layer] = (head, score)
        return best

    def check(self, info):
        super().check(info)
        if self.per_head:
            raise ConfigError("method.per_head is an InfLLM option; Ltri-LLM retrieves per layer (retrieval heads)")
        for key in ("theta_quantile", "iou"):
            v = getattr(self, key)
            if len(v) not in (1, info.num_layers) or not all(0 <= x <= 1 for x in v):
                raise ConfigError(f"method.{key} needs one value or {info.num_layers} (one per layer), each in [0, 1]")
        for entry in self.retrieval_heads:
            if len(entry) != 3 or not 0 <= entry[0] < info.num_layers or not 0 <= entry[1] < info.num_heads:
                raise ConfigError(f"method.retrieval_heads entry {list(entry)} is not (layer < {info.num_layers}, "
                                  f"head < {info.num_heads}, score)")
        if self.last_chunk is not None and self.last_chunk > self.n_local:
            raise ConfigError(f"method.last_chunk={self.last_chunk} exceeds method.n_local={self.n_local}")
        if self.min_vectors * (2 * self.spans_per_block + 1) > self.max_vectors and self.fill_gaps:
            raise ConfigError(f"method.max_vectors={self.max_vectors} cannot hold min_vectors={self.min_vectors} "
                              f"for up to {2 * self.spans_per_block + 1} spans (spans_per_block with gaps filled)")

    def describe(self):
        rh = self.heads()
        return {**super().describe(), "index": f"{self.index} span index vectors, <= {self.max_vectors} per block",
                "retrieval": ("retrieval heads of layers " + ",".join(map(str, sorted(rh)))) if rh else "all heads",
                "voting": self.voting, "persistent": self.persistent,
                "prefill": f"streamed in chunks of {self.exc_block_size}, last chunk {self.last_chunk}",
                "prefill_extra_work": self.span_cost()}

    def span_cost(self) -> str:
        """The work the span rule adds to a prefill chunk of T queries, per indexing layer (every layer without
        retrieval heads), beyond InfLLM's, and where it runs: stated from the options, not timed (measured:
        notes/perf_bench.md, bench/ltri_device_parity.py)."""
        T, bs, Q = self.exc_block_size, self.block_size, -(-self.spans_per_block * self.exc_block_size // self.block_size)
        cells = (T + 1) ** 2 + T // bs * (bs + 1) ** 2          # the query map's and the leaving blocks' cells
        window = self.n_local + self.n_init + self.topk * bs
        share = 25 * cells / (4 * T * window * 4096)
        return (f"per chunk of T={T} and indexing layer, batch row B: the chunk's causal T x T map (O(T^2 Hq D)), the "
                f"band of each token's attention to its previous {bs} (O(T (T+{bs}) Hq D)), the T/{bs} leaving blocks' "
                f"{bs} x {bs} maps in one gather; then the spans: ~25 fp64 passes over the {cells} map cells per row "
                f"(prefix sums, scores, anti-diagonal argmax, theta's order statistics), {self.spans_per_block} "
                f"(blocks) and {Q} (queries) greedy NMS steps, one stable sort of the blocks' votes: <= 25 x {cells} "
                f"x B element operations, {share:.3%} of the chunk's attention FLOPs (4 T x {window} x Hq D) at Hq D "
                f"= 4096. CUDA maps: on the device (methods/parts/ltri_device.py, one CUDA graph replay per call: the "
                f"prefix sums as sequential scans of {T} and {bs} steps, the NMS one program per map), the picks and "
                f"the retrieval staying there; the host's bits (0 of 2,816 maps differed on an H100, notes/perf_bench.md;"
                f" ~1.4 ms a chunk-layer). Host work per chunk and indexing layer: {self.prefill_host_bound()}. CPU: "
                f"on the host (ltri_batch's numpy for the blocks, ltri_spans per query map). A prompt of n: "
                f"O(n (T + {bs}) B) span work per layer")

    def prefill_host_bound(self, batch: int = 1) -> str:
        """What the host does per prefill chunk and indexing layer beyond InfLLM's device path (CUDA maps), as
        bench/ltri_host_work counts it on the CPU (notes/ltri_prefill_host.md): device-to-host copies, host-to-device
        copies, torch ops issued (each a kernel launch on a GPU; a graph replay counts its input copies + 1). The
        ops: ~100 fixed (the map band, the query map, the two span graphs, the index store, votes and ranking), per
        sequence one sum per query span (<= 2 Q + 1 with gaps filled) and ~20 more; measured at B = 1 with 32 layers:
        +98 over InfLLM's ops (Ltri's own functions 121, InfLLM's retrieval and index it replaces 22)."""
        Q = -(-self.spans_per_block * self.exc_block_size // self.block_size)
        spans = 2 * Q + 1 if self.fill_gaps else Q
        return (f"<= 1 device-to-host copy (the query spans' slots, carrying the previous chunk's block-cut sizes), "
                f"0 host-to-device copies, <= {100 + batch * (spans + 20)} torch ops at B = {batch} (<= 100 + B x "
                f"({spans} query spans + 20)); extra prefill time <= chunk-layers x (one host round trip + those ops' "
                f"launches + the span graphs' device time)")

    @classmethod
    def variants(cls):
        return [{"n_init": 4, "n_local": 8, "block_size": 4, "topk": 2, "exc_block_size": 8, "max_cached_block": 3,
                 "spans_per_block": 1, "max_vectors": 3, "last_chunk": 3},
                {"n_init": 2, "n_local": 10, "block_size": 5, "topk": 2, "exc_block_size": 6, "offload": False,
                 "spans_per_block": 2, "max_vectors": 5, "retrieval_heads": [[1, 2, 0.5], [3, 0, 0.2], [3, 1, 0.4]],
                 "persistent": False, "ratio_mode": "rowcol", "ratio_area": "density", "last_chunk": None},
                {"n_init": 2, "n_local": 9, "block_size": 4, "topk": 1, "exc_block_size": 5, "max_cached_block": 2,
                 "spans_per_block": 1, "max_vectors": 3, "voting": False, "index": "static",
                 "retrieval_heads": [[2, 1, 0.3]], "theta_quantile": [0.5], "iou": [0.3], "last_chunk": 7},
                {"n_init": 3, "n_local": 8, "block_size": 4, "topk": 2, "exc_block_size": 6, "offload": False,
                 "spans_per_block": 1, "max_vectors": 3, "last_chunk": 4}]


def _lists(v):
    return [_lists(x) for x in v] if isinstance(v, (tuple, list)) else v


@register
class Ltri(Indexing, Voting, InfLLM):
    name = "ltri"
    Config = LtriConfig
    reference_spans = False   # True: the spans map by map (ltri_spans, the reference), for parity tests and benches
    host_spans = False        # True: the span work on the host (ltri_batch) even for CUDA maps: the bench's before

    def __init__(self, cfg):
        super().__init__(cfg)
        # the device path (evidence none; offload either way): decode reads the persisted retrieval from the
        # device; a fresh retrieval per decode step (persistent=false) scores spans on the host: eager
        self.graph_safe = self.device_path and self.cfg.persistent

    def begin(self, step):
        super().begin(step)
        self.begin_votes()
        if step.phase == "decode":   # no prefill tensor lives into decode steps (graph_safe: declared ones only)
            self.flush_all()
            self._band_cache.clear()
        if step.phase == "decode" and self.cfg.persistent:   # a persistent decode step ranks nothing:
            self.own_scores = [None] * self.info.num_layers    # no prefill tensor kept across graphed steps
            self.own_top = [None] * self.info.num_layers

    def largest_chunk(self) -> int:
        return max(self.cfg.exc_block_size, self.cfg.last_chunk or 0)

    def prefill_bounds(self, n: int) -> list[int]:
        """Chunk starts: exc_block_size chunks, then the last Q tokens as a chunk of their own."""
        c = self.cfg
        if c.last_chunk is None or n <= c.last_chunk:
            return list(range(0, n, c.exc_block_size))
        return list(range(0, n - c.last_chunk, c.exc_block_size)) + [n - c.last_chunk]

    # --- storage -----------------------------------------------------------------------------------
    def setup_index(self, info, batch, device, dtype):
        c = self.cfg
        self.rh = c.heads()
        first = min(self.rh) if self.rh else info.num_layers
        # layers with an index of their own: retrieval layers, and (all heads) every layer before the first
        self.own = {layer: (self.rh[layer][0] if layer in self.rh else None)
                    for layer in range(info.num_layers) if layer in self.rh or layer < first}
        dims = {layer: info.head_dim if h is not None else info.num_heads * info.head_dim for layer, h in self.own.items()}
        self.index = getattr(self, "index", None) or IndexVectors()
        self.index.allocate(dims, batch, device, dtype)
        self.band = _reuse(getattr(self, "band", None), (info.num_layers, batch, self.ring_size, c.block_size),
                           torch.float32, device)
        self.persist = [None] * info.num_layers
        # the same retrieval on the device, for the resident decode: ids [L, B, 1, topk], counts [L, B, 1]
        self.persist_ids = _reuse(getattr(self, "persist_ids", None), (info.num_layers, batch, 1, c.topk),
                                  torch.int32, device)
        self.persist_counts = _reuse(getattr(self, "persist_counts", None), (info.num_layers, batch, 1),
                                     torch.int32, device)
        self.persist_ids.zero_()
        self.persist_counts.zero_()
        self.own_scores = [None] * info.num_layers      # this step's block similarities of indexing layers
        self.own_top = [None] * info.num_layers
        self.vectors_per_block = {}
        self._pending = {}          # layer -> a block cut launched on the device, stored at the next read
        self._band_cache = {}       # (T, offset) -> observe's / the query map's index tensors

    def index_buffers(self):
        self.flush_all()
        return {**self.index.buffers(), "band": self.band, "persist_ids": self.persist_ids,
                "persist_counts": self.persist_counts}

    def _space(self, layer: int, x: torch.Tensor, kv: bool) -> torch.Tensor:
        """[B, H, n, D] -> [B, n, dim] in the layer's index space: its retrieval head, or all heads
        (keys repeated to the query heads, so a product sums the per-head logits)."""
        h = self.own[layer]
        if h is not None:
            return x[:, h // self.info.group if kv else h]
        if kv:
            x = x.repeat_interleave(self.info.group, 1)
        return x.permute(0, 2, 1, 3).flatten(2)

    # --- the attention map band ----------------------------------------------------------------------
    def observe(self, layer, q_rot, lse, raw_local):
        """Rows of the band for this step's tokens: probability given to each of the previous block_size
        tokens (local window only), summed over query heads."""
        W, T = self.cfg.block_size, q_rot.shape[2]
        a, scale = self.step.start, self.info.scaling
        lo = max(0, a - W + 1)
        keys = torch.arange(lo, a + T, device=q_rot.device)
        if raw_local is not None and self.device_path:   # decode: the held local mass, column j = distance j
            w = min(W, raw_local.shape[-1])
            p = raw_local[..., :w].sum(1)
            rows = (torch.nn.functional.pad(p, (0, W - w)) if w < W else p).unsqueeze(1)
        elif raw_local is not None:   # decode: logits of the window's slots are at hand
            n = self.local_pos.numel()
            raw = raw_local[..., max(0, n - W):]
            kp = self.local_pos[max(0, n - W):]
            p = torch.exp(raw * scale - lse).sum(1)                             # [B, n']
            rows = torch.zeros(self.batch, 1, W, device=q_rot.device)
            rows[:, 0, (a - kp)] = p
        else:
            k = self.ring.k_rot[layer].index_select(2, keys % self.ring_size).repeat_interleave(self.info.group, 1)
            s = torch.einsum("bhtd,bhld->bhtl", q_rot.float(), k.float()) * scale
            vis, col_ok, col = self._band_index(T, a - lo, q_rot.device)
            p = torch.where(vis, torch.exp(s - lse.unsqueeze(-1)), 0.0).sum(1)  # [B, T, L]
            rows = torch.where(col_ok, p.gather(-1, col.unsqueeze(0).expand(self.batch, -1, -1)), 0.0)
        self.band[layer].index_copy_(1, self.new_slots, rows)

    def _band_index(self, T: int, off: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """observe's index tensors for T queries whose first key is `off` before the first query: (visible
        [T, T + off]: distance in [0, min(bs, n_local)), the band column's key valid [T, bs] and index). They
        depend on (T, off) only (off = bs - 1 for every chunk after the first): made once, not per layer."""
        key = (T, off, str(device))
        if key not in self._band_cache:
            W = self.cfg.block_size
            d = torch.arange(T, device=device).view(-1, 1) + off - torch.arange(T + off, device=device).view(1, -1)
            col = torch.arange(T, device=device).view(-1, 1) + off - torch.arange(W, device=device)
            self._band_cache[key] = ((d >= 0) & (d < min(W, self.cfg.n_local)), col >= 0, col.clamp(min=0))
        return self._band_cache[key]

    def _causal(self, T: int, device) -> torch.Tensor:
        """[T, T] True above the diagonal (the query map's masked cells), made once per T."""
        key = (T, -1, str(device))
        if key not in self._band_cache:
            self._band_cache[key] = ~torch.ones(T, T, dtype=torch.bool, device=device).tril()
        return self._band_cache[key]

    # --- indexing a block that leaves the window: methods/parts/ltri_index.py ----------------------------
    def _span_args(self, layer: int) -> tuple:
        c = self.cfg
        return (c.per_layer(c.theta_quantile, layer), c.per_layer(c.iou, layer), c.spans_per_block, c.fill_gaps,
                c.ratio_mode, c.ratio_area == "density", c.lam_of(layer), c.min_vectors, c.max_vectors,
                c.index == "static")

    def _span_work(self, A: torch.Tensor) -> str:
        """Where the span work runs: CUDA maps on their device (methods/parts/ltri_device.py), others (or
        host_spans) on the host; reference_spans: map by map (ltri_spans)."""
        if self.reference_spans:
            return "reference"
        return "device" if A.is_cuda and not self.host_spans else "host"

    # --- retrieval -------------------------------------------------------------------------------------
    def query_spans(self, layer: int) -> list[list[tuple[int, int]]]:
        """Spans of this step's queries from their causal self-attention among themselves."""
        c, T = self.cfg, self.q_rot.shape[2]
        if T == 1:
            return [[(0, 0)]] * self.batch
        k = self.ring.k_rot[layer].index_select(2, self.new_slots).repeat_interleave(self.info.group, 1)
        s = torch.einsum("bhtd,bhld->bhtl", self.q_rot.float(), k.float()) * self.info.scaling
        A = torch.softmax(s.masked_fill(self._causal(T, s.device), float("-inf")), -1).sum(1)
        n_spans = max(1, math.ceil(c.spans_per_block * T / c.block_size))
        args = (c.per_layer(c.theta_quantile, layer), c.per_layer(c.iou, layer), n_spans, c.fill_gaps)
        # on the device: one copy of the slots to the host, which brings the layer's pending block cut's sizes too
        # (methods/parts/ltri_index.py). On the host map by map (ltri_spans): on a 512 x 512 map twice as fast as
        # ltri_batch's stack on one core, as fast for a few rows (notes/perf_bench.md)
        if self._span_work(A) != "device":
            return LB.detect_spans_reference(A, *args)
        meta = self.take_pending(layer)
        if meta is None:
            return LD.detect_spans(A, *args)
        spans, meta = LD.detect_spans(A, *args, carry=meta)
        self.flush_index(layer, meta)
        return spans

    def block_scores(self, layer: int, q_mem: torch.Tensor) -> torch.Tensor:
        """[B, n_blocks] fp32: Eq. 9 (best Eq. 8 similarity of a block's spans over the query spans)."""
        qv = self._space(layer, q_mem, kv=False).float()                          # [B, T, dim]
        out = torch.full((self.batch, self.n_blocks), float("-inf"), device=q_mem.device)
        spans_of = self.query_spans(layer)
        self.flush_index(layer)     # the pending block cut stored (query_spans' copy brought its sizes, if any)
        for b, spans in enumerate(spans_of):
            qsum = torch.stack([qv[b, x:y + 1].sum(0) for x, y in spans])          # [nq, dim]
            vec, span_of, span_block = self.index.view(layer, b)
            if vec.shape[0] == 0:
                continue
            sims = vec.float() @ qsum.T                                            # [n_vec, nq]
            per_span = torch.zeros(span_block.shape[0], sims.shape[1], device=sims.device).index_add_(0, span_of, sims)
            best = per_span.amax(1)
            ok = span_block < self.n_blocks
            out[b].scatter_reduce_(0, span_block[ok], best[ok], "amax")
        return tie_round(out)   # repeated tokens' equal un-rotated keys tie on every device (selection.tie_round)

    def stats(self):
        self.flush_all()
        out = super().stats()
        out["index_vectors"] = sum(sum(v) for v in self.index.count.values())
        out["index_device_bytes"] = self.index.device_bytes()
        out["vectors_per_block"] = {l: sum(v) / len(v) for l, v in sorted(self.vectors_per_block.items()) if v}
        return out
