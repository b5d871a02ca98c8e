"""Tactic (arXiv 2502.12216; no public code: built from the paper, decisions below).

Stages (paper sec. 3): (1) after the prefill, per layer and KV head, k-means over the rotated keys (dot-product
assignment, random initial keys, at most 10 iterations, one run, `cluster_size` tokens per cluster on average: 32);
(2) per decode step, clusters ranked by q.centroid, unpacked in that order into a sorted token list; (3) Algorithm
1: the first `exact_head` list tokens (N = 128, "the initial 128 tokens ... computed directly") are scored exactly,
the rest of the exp-score curve exp(q.k/sqrt(d)) over the list is modelled as y = a/x + b (x = 1-based list rank),
fitted through the means of two windows of `fit_window` exactly scored list tokens centred at the fractions `fit_lo`
and `fit_hi` of the list; the estimated total mass is exact head + fitted tail + the exact set, and the budget is
the smallest list prefix K whose estimated mass reaches the target fraction P. Exact attention then runs over list
ranks 0..K-1 plus the exact set (sparse decode over token sets).

Decisions the paper leaves open (methods.md sec. 3.2), all options:
  * the exact set E: positional `sink` tokens and the recent tokens not yet clustered (the prefill's last `window`
    tokens and every decoded token). The paper has neither; its "initial 128 tokens" are read as Algorithm 1's N
    (the head of the sorted list), not as positional sinks (sink = 0).
  * decoded tokens: the paper clusters once, after the prefill, and decodes at most 128 tokens, so by default
    decoded tokens stay in E (recluster_every = null). With R set, every R decode steps the tokens that left the
    window are clustered too: appended as new clusters ("new") or by re-running k-means over everything ("all").
    Needed where nothing is prefilled (the PG-19 token-by-token protocol of Fig. 6: otherwise every token stays
    exact and the method is full).
  * GPU budgets: one set per query head (Algorithm 1's query Q; default) or per KV head shared by its group
    (`select: kv_head`: clusters ranked by the group's summed centroid probabilities, each query head fits its own
    curve, the set takes the group's largest K).
  * `mode`: fit (the method), topk (the fixed budget of Fig. 6: list tokens up to `budget` - |E|), oracle_global
    (Figs. 3-4: exact top-p by true weight over all tokens, no forced set) and oracle_cluster (Fig. 8's "clustering
    optimal": exact top-p along the cluster-sorted list).
Prefill is dense. The current token is always in E. Keys are cached rotated. On CUDA the set comes from one kernel
without the sort (kernels/tactic_select.py: the sorted list's first K; fit and the cluster oracle still sort);
fit's budget from the sampled scores (shift, sums, curve, tail, bisection) is one kernel (kernels/tactic_fit.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError
from kernels.tactic_fit import fit_budget, sample_positions
from kernels.tactic_select import list_positions, rank, select_cluster_tokens
from methods.base import Method, register
from methods.config import ChunkedPrefill, layer_range, option
from methods.parts import selection
from methods.parts.cluster_keys import METRICS
from methods.parts.stores import FullStore
from methods.parts.stores_clusters import ClusterIndex
from methods.parts.tactic_probe import Probe, diagnose, global_optimal, reach, report
from methods.parts.tactic_rules import harmonic, per_row, rows_gather_vec

MODES = ("fit", "topk", "oracle_global", "oracle_cluster")
SELECT = ("query_head", "kv_head")


@dataclass(frozen=True)
class TacticConfig(ChunkedPrefill):
    """Tactic (arXiv 2502.12216, no public code): k-means clusters of keys after the prefill, clusters
    ranked by q.centroid, budget = smallest prefix of the cluster-sorted tokens whose estimated
    attention mass (exact head + fitted y = a/x + b tail) reaches the target fraction."""

    mode: str = option("fit", "fit: Tactic; topk: fixed budget (Fig. 6); oracle_global: exact top-p over all "
                       "tokens (Figs. 3-4); oracle_cluster: exact top-p along the cluster order (Fig. 8)",
                       choices=MODES)
    target: float = option(0.9, "weight percentage P (paper: 0.5/0.7/0.9; 0.99 for token match); 1 = all tokens",
                           min=0.0, max=1.0)
    budget: int = option(1024, "topk mode: tokens per set, the exact set included (Fig. 6: 1024)", min=1)
    cluster_size: int = option(32, "average tokens per cluster: ceil(tokens / cluster_size) clusters (paper 32)",
                               min=1)
    kmeans_iters: int = option(10, "k-means iterations at most (stops early when no assignment changes)", min=1)
    metric: str = option("dot", "k-means assignment: dot (paper) or cosine (normalised keys)", choices=METRICS)
    seed: int = option(0, "seed of the random initial centroids (CPU generator: same picks on every device)", min=0)
    select: str = option("query_head", "query_head: one set per query head; kv_head: one set per KV head, "
                         "shared by its group", choices=SELECT)
    exact_head: int = option(128, "Algorithm 1's N: the first N tokens of the sorted list are scored exactly",
                             min=0)
    fit_lo: float = option(0.02, "centre of the first fit window, as a fraction of the sorted list "
                           "(clamped into the tail after the exact head)", min=0.0, max=1.0)
    fit_hi: float = option(0.5, "centre of the second fit window (fraction of the sorted list)", min=0.0, max=1.0)
    fit_window: int = option(16, "list tokens scored exactly and averaged per fit window", min=1)
    tail: str = option("clip", "the fitted tail's sum: clip (y = a/x + b counted while positive) or literal "
                       "(Algorithm 1's sum of w_i = a/i + b as is, negative past a/-b)", choices=("clip", "literal"))
    rising_fit: str = option("flat", "a fit that would rise (a < 0; the paper leaves it open): flat = a = 0 at the "
                             "windows' mean (this harness's choice); fit = as fitted (tail literal)", choices=("flat", "fit"))
    sink: int = option(0, "first tokens always attended and scored exactly (not clustered)", min=0)
    window: int = option(0, "last prefill tokens kept exact, out of the clusters (decoded tokens always are "
                         "until clustered)", min=0)
    recluster_every: int | None = option(None, "cluster the tokens that left the window every R decode steps "
                                         "(null = never: the paper clusters once, after the prefill)", min=1)
    recluster: str = option("new", "new: the new tokens become new clusters; all: k-means again over "
                            "every clusterable token", choices=("new", "all"))
    dense_layers: int = option(0, "layers 0..dense_layers-1 dense (paper: none, every layer is sparse)", min=0)
    diagnostics: bool = option(False, "record exact-attention statistics per step (mass obtained, oracle "
                               "budgets, CDFs; one more dense pass per layer, no CUDA graph)")
    probe_layer: int | None = option(None, "diagnostics: the layer of the recorded CDFs (null = all)", min=0)
    probe_head: int | None = option(None, "diagnostics: the query head of the recorded CDFs (null = all)", min=0)

    def check(self, info):
        layer_range("dense_layers", self.dense_layers, info)
        layer_range("probe_layer", self.probe_layer, info)
        if self.probe_head is not None and self.probe_head >= info.num_heads:
            raise ConfigError(f"method.probe_head={self.probe_head} is outside [0, {info.num_heads}) for this "
                              f"{info.num_heads}-head model")
        if self.mode != "topk" and self.target <= 0:
            raise ConfigError(f"method.target={self.target} asks for no attention mass: give one in (0, 1]")
        if self.rising_fit == "fit" and self.tail == "clip":
            raise ConfigError("method.rising_fit=fit needs method.tail=literal (clip sums a falling curve only)")
        if self.fit_lo >= self.fit_hi:
            raise ConfigError(f"method.fit_lo={self.fit_lo} must be below method.fit_hi={self.fit_hi}")

    def describe(self):
        per = "query head" if self.select == "query_head" else "KV head (shared by its group)"
        what = {"fit": f"smallest cluster-sorted prefix with estimated mass >= {self.target}",
                "topk": f"{self.budget} tokens (exact set included) in cluster order",
                "oracle_global": f"exact top-p {self.target} by attention weight over all tokens",
                "oracle_cluster": f"exact top-p {self.target} along the cluster order"}[self.mode]
        return {"budget_unit": f"tokens per {per}", "selection": what,
                "exact_set": f"{self.sink} sinks + the last {self.window} prefill tokens + every decoded token "
                             f"not yet clustered; always attended, counted in the budget",
                "fit": (f"exact head {self.exact_head} list tokens; y=a/x+b on exp(q.k/sqrt(d)), x = 1-based list "
                        f"rank, through the means of {self.fit_window} tokens at {self.fit_lo}/{self.fit_hi} of the "
                        f"list, tail {self.tail}, a rising fit {self.rising_fit}") if self.mode == "fit" else None,
                "clustering": f"k-means ({self.metric}) after the prefill, {self.cluster_size} tokens per cluster, "
                              f"<= {self.kmeans_iters} iterations" + (
                                  f", again every {self.recluster_every} steps ({self.recluster})"
                                  if self.recluster_every else ", decoded tokens never clustered"),
                "dense_layers": self.dense_layers, "prefill": "dense"}

    @classmethod
    def variants(cls):
        small = {"cluster_size": 4, "exact_head": 4, "fit_window": 2}  # 2nd seed 1: seed 0 ties 2 clusters (fp32)
        return [{**small, "target": 0.7, "tail": "literal", "rising_fit": "fit"},
                {**small, "mode": "topk", "budget": 16, "select": "kv_head", "sink": 2, "window": 3, "seed": 1, "recluster_every": 6},
                {"mode": "oracle_global", "target": 0.8, "select": "kv_head"},
                {**small, "mode": "oracle_cluster", "target": 0.8, "cluster_size": 5, "recluster": "all", "recluster_every": 7,
                 "prefill_chunk": 16, "dense_layers": 1},
                {**small, "target": 0.9, "exact_head": 2, "select": "kv_head", "metric": "cosine", "diagnostics": True}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context)} if self.mode == "topk" else {"target": 1.0}


@register
class Tactic(Method):
    name = "tactic"
    Config = TacticConfig
    graph_safe = True   # static shapes between clustering events; each event moves `epoch` (re-capture)
    # a step writes its own position only (KV, attended counts; clustering is outside it): the graph warm-up
    # then saves no copy of the buffers (a second KV cache: 16 GiB at 128K on Llama-3-8B, issue 34)
    decode_idempotent = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.graph_safe = not self.cfg.diagnostics   # diagnostics sum on the host every layer
        self.probe = Probe(self.cfg.target, self.cfg.probe_layer, self.cfg.probe_head) if self.cfg.diagnostics else None

    # --- storage and clustering --------------------------------------------------------------------
    def setup(self, info, batch, max_len, device, dtype):
        c = self.cfg
        self.info, self.batch, self.cap = info, batch, max_len
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)
        events = 1 + (max_len // c.recluster_every if c.recluster_every else 0)
        cmax = max_len // c.cluster_size + events + 1
        self.index = getattr(self, "index", None) or ClusterIndex()
        self.index.allocate(info.num_layers, batch, info.num_kv_heads, cmax, max_len, info.head_dim, device, dtype)
        self.harm = harmonic(max_len, device)
        # attended tokens per layer and decode position, summed over rows: written at the step's position
        self._att = torch.zeros(info.num_layers, max_len, dtype=torch.long, device=device)
        # A graph replays host ints (cluster counts, spans) as constants: every clustering event (and
        # every new sequence) declares a new slice of `epochs`, so the engine re-captures.
        if getattr(self, "epochs", None) is None or self.epochs.device != torch.device(device):
            self.epochs = torch.zeros(2, device=device)
        self._epoch = getattr(self, "_epoch", 0) + 1
        self.rows = info.num_heads if c.select == "query_head" else info.num_kv_heads
        self.ce, self.n_clu, self.n_tok = c.sink, 0, 0           # positions [sink, ce) are clustered
        self._fresh = False
        self.events: list[dict] = []
        self._heads: dict[int, torch.Tensor] = {}
        if self.probe is not None:
            self.probe.reset()

    def buffers(self):
        return {**self.store.buffers(), **self.index.buffers(), "harm": self.harm, "att": self._att,
                "epoch": self.epochs[self._epoch % 2:self._epoch % 2 + 1]}

    def _cluster(self, limit: int) -> None:
        """Cluster positions [ce, limit) as new clusters ("new"), or [sink, limit) afresh ("all")."""
        c = self.cfg
        first, c0, t0 = (c.sink, 0, 0) if c.recluster == "all" else (self.ce, self.n_clu, self.n_tok)
        m = limit - first
        if limit <= self.ce or m <= 0 or c.mode == "oracle_global":   # the global oracle ranks tokens, not clusters
            return
        cuda = self.store.k.is_cuda
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        layers = range(c.dense_layers, self.info.num_layers)
        made, iters = self.index.add_layers(layers, lambda layer: self.store.k[layer, :, :, first:limit], first, c0,
                                            t0, math.ceil(m / c.cluster_size), c.kmeans_iters, c.metric,
                                            seeds=[c.seed * 1_000_003 + layer * 1009 + first for layer in layers])
        if cuda:
            torch.cuda.synchronize()
        self.n_clu, self.n_tok, self.ce = c0 + made, t0 + m, limit
        self._epoch += 1
        self.events.append({"tokens": m, "clusters": made, "iterations_max": max(iters, default=0),
                            "seconds": time.perf_counter() - t})

    def before_decode(self, seq_len):
        """Cluster what the prefill added before the first decode step, outside the captured step (inside
        it, the graph warm-up's buffer restore undid the clustering: an out-of-bounds gather on the H100)."""
        if self._fresh:
            self._fresh = False
            self._cluster(seq_len - self.cfg.window)

    def correction_span(self, seq_len):
        """The engine's host hook after every decode step (also under CUDA graphs): re-clustering."""
        R = self.cfg.recluster_every
        if R and seq_len - self.cfg.window - self.ce >= R:
            self._cluster(seq_len - self.cfg.window)

    # --- one step --------------------------------------------------------------------------------
    def begin(self, step):
        super().begin(step)
        c, self.lengths = self.cfg, self.device_lengths(step, self.batch)
        if step.phase != "decode":
            self._fresh = True          # cluster what this prefill added, before the next decode step
            return
        if self._fresh:   # callers that drive begin/attend without the engine (test drivers) cluster here
            self.before_decode(step.start)
        if self.probe is not None:
            self.probe.new_step()
        self.selected = {}
        if not self.n_tok:
            return
        self._exact_set()
        self.e_valid = self.e_pos.view(1, -1) < self.lengths.view(-1, 1)                # [B, Emax]
        self.n_e = self.e_valid.sum(-1)                                                # [B]
        if c.mode == "topk":   # the list length of each row, the same in every layer of the step
            self.k_topk = (c.budget - self.n_e).clamp(0, self.n_tok).view(self.batch, 1).expand(self.batch, self.rows)

    def _exact_set(self) -> None:
        """The exact set E as slots, and fit mode's exactly scored list ranks (only there: issue 33, each
        tensor built here is a launch per step)."""
        c, dev = self.cfg, self.lengths.device
        # The exact set E as slots: sinks [0, sink) then [ce, cap); valid (written) ones form a prefix.
        self.e_max = c.sink + self.cap - self.ce
        if c.sink:
            j = torch.arange(self.e_max, device=dev)
            self.e_pos = torch.where(j < c.sink, j, j + (self.ce - c.sink))
        else:   # no sinks (the default): one launch
            self.e_pos = torch.arange(self.ce, self.cap, device=dev)
        self.samp = self.m_len = self.u = None
        self.w = 0
        if c.mode != "fit":   # fit: Algorithm 1's exactly scored list ranks, the head then two windows (host ints)
            return
        self.n_head = min(c.exact_head, self.n_tok)
        ranks = [torch.arange(self.n_head, device=dev)]
        if self.n_tok > self.n_head:
            w = min(c.fit_window, self.n_tok - self.n_head)
            starts = [min(max(int(f * self.n_tok) - w // 2, self.n_head), self.n_tok - w) for f in (c.fit_lo, c.fit_hi)]
            self.u = [sum(1.0 / (r + 1) for r in range(s, s + w)) / w for s in starts]
            self.w = w
            ranks += [torch.arange(s, s + w, device=dev) for s in starts]
        self.samp = torch.cat(ranks)
        self.m_len = torch.full((self.batch,), self.e_max + self.samp.numel(), dtype=torch.int32, device=dev)

    def attend(self, layer, q, k, v, rope):
        step, c, scale = self.step, self.cfg, self.info.scaling
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.positions, k, v)
        if step.phase != "decode":
            keys, values = self.store.view(layer, step.end)
            return kernels.prefill_attention(q, keys, values, scale)
        B = q.shape[0]
        q1, keys, values = q[:, :, 0].contiguous(), self.store.k[layer], self.store.v[layer]
        if layer < c.dense_layers or (not self.n_tok and c.mode != "oracle_global"):
            self._count(layer, self.lengths.view(B, 1).expand(B, self.rows))
            return kernels.decode_attention(q1, keys, values, self.lengths, scale,
                                            max_length=self.store.capacity).view(B, 1, -1)
        index, counts = self.select(layer, q1)
        self._count(layer, counts)
        return kernels.sparse_decode_tokens(q1, keys, values, index, counts, scale).view(B, 1, -1)

    def _count(self, layer, counts):
        self.record(layer, counts)
        self._heads[layer] = counts
        self._att[layer].index_copy_(0, self.step.positions, counts.sum().view(1))

    @property
    def tally(self) -> torch.Tensor:
        """(sum over layer-steps of the mean attended tokens, layer-steps: the nonzero entries, >= 1 token each)."""
        att = self._att.double()
        return torch.stack([att.sum() / (self.batch * self.rows), (self._att > 0).sum().double()])

    # --- selection ---------------------------------------------------------------------------------
    def select(self, layer: int, q1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token sets (int32 [B, H, Kmax], counts [B, H]) for the rotated decode query q1 [B, Hq, D]."""
        c = self.cfg
        if c.mode == "oracle_global":
            return global_optimal(self, layer, q1)   # exact top-p by true weight over all tokens
        s, csize = self._scores(layer, q1)
        # the full sort only where list ranks are read: fit's samples, the cluster oracle, diagnostics
        need_r = (c.mode != "topk" and c.target < 1.0) or self.probe is not None
        r = rank(s, csize) if need_r else None
        B, H = q1.shape[0], self.rows
        est = None
        if c.target >= 1.0 and c.mode != "topk":
            k_row = torch.full((B, H), self.n_tok, dtype=torch.long, device=q1.device)
        elif c.mode == "topk":
            k_row = self.k_topk
        elif c.mode == "fit":
            k_heads, est = self._fit(layer, q1, r)
            k_row = per_row(k_heads, H)
        else:
            probs, _ = self._exact(layer, q1)
            k_row = per_row(self._cluster_k(layer, r, probs)[0], H)
        # list ranks 0..K-1 then the valid exact set; only selectable ranks are unpacked (topk: K <= budget)
        kmax = min(self.n_tok, c.budget) if c.mode == "topk" else self.n_tok
        index, counts = select_cluster_tokens(s, csize, self.index.cstart[layer], self.index.order[layer],
                                              k_row, self.e_pos, self.e_valid, kmax, ranking=r,
                                              nt=getattr(self, "select_nt", None),   # timing switches
                                              span=getattr(self, "select_span", None))
        self.selected[layer] = (index, counts)
        if self.probe is not None:
            diagnose(self, layer, q1, r, index, counts, est)
        return index, counts

    def _scores(self, layer, q1):
        """Cluster scores per row [B, H, n] by q.centroid (per query head, or the group's summed
        probabilities; empty clusters -inf, except for the top-k kernel alone: it takes nothing from an
        empty cluster whatever its score) and the sizes [B, Hkv, n] that rank them."""
        c, n = self.cfg, self.n_clu
        cent = self.index.cent[layer]
        s = kernels.cluster_scores(q1, cent, n, self.info.scaling)   # the scores alone: no attention over them
        B, Hq, _ = s.shape
        Hkv = self.info.num_kv_heads
        csize = self.index.csize[layer][..., :n]
        if not (c.mode == "topk" and c.select == "query_head" and self.probe is None):   # the kernel alone takes
            s = s.view(B, Hkv, Hq // Hkv, n).masked_fill((csize == 0).unsqueeze(2), float("-inf")).view(B, Hq, n)
        if c.select == "kv_head":
            s = selection.group_reduce(s, Hkv, "softmax_sum", self.info.scaling)
        return s, csize

    def _fit(self, layer, q1, r):
        """Algorithm 1 per query head: (K [B, Hq] list tokens, (estimated total, shift) for diagnostics).
        The sampled tokens' positions by one kernel, their scores by one attention pass, the budget by one
        kernel (kernels/tactic_fit.py)."""
        c = self.cfg
        idx = sample_positions(self.samp, r, self.index.cstart[layer], self.index.order[layer], self.e_pos,
                               self.e_valid)   # [E's positions | the list at the sampled ranks], one launch
        kg = rows_gather_vec(self.store.k[layer], idx)
        _, s = kernels.selection_attention(q1, kg, kg, self.m_len, self.info.scaling, max_length=kg.shape[2])
        k, total, shift = fit_budget(s, self.e_valid, self.info.scaling, self.harm, self.n_tok, self.n_head,
                                     self.w, self.u, c.target, c.tail, c.rising_fit)
        return k, (total, shift)

    def _exact(self, layer, q1):
        """Exact attention probabilities over the whole cache [B, Hq, S] and log-sum-exp of scaled scores."""
        scale = self.info.scaling
        _, s = kernels.selection_attention(q1, self.store.k[layer], self.store.v[layer], self.lengths, scale,
                                           max_length=self.store.capacity)
        z = s * scale
        lse = torch.logsumexp(z, -1)
        return torch.exp(z - lse.unsqueeze(-1)), lse

    def _cluster_k(self, layer, r, probs):
        """Clustering optimal per query head: fewest list tokens reaching the target with E (exact
        probabilities); also (the list's probabilities [B, Hq, n], E's mass [B, Hq])."""
        B, Hq, _ = probs.shape
        pos = list_positions(torch.arange(self.n_tok, device=probs.device), r, self.index.cstart[layer],
                             self.index.order[layer]).repeat_interleave(Hq // self.rows, 1)
        lp = probs.gather(-1, pos)
        e_mass = (probs.gather(-1, self.e_pos.view(1, 1, -1).expand(B, Hq, -1)) * self.e_valid.view(B, 1, -1)).sum(-1)
        return reach(e_mass, lp.cumsum(-1), self.cfg.target, self.n_tok), lp, e_mass

    def stats(self):
        return report(self, super().stats())
