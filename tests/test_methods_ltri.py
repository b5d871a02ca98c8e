"""Ltri-LLM oracle: on random q, k, v (Driver) the method's outputs, retrieved blocks and span index
vectors equal a brute force written from the paper's equations on top of the InfLLM simulation
(tests/infllm_sim.py, whose per-(query, key) probabilities give the attention map):

- a block's map = the joint-softmax probabilities among its tokens, summed over heads (Eq. 4); its spans
  = tests/test_ltri_spans.py's brute force (Eq. 5 cell by cell, anti-diagonal best, plain NMS);
- r_a from cell sums, counts from Eq. 7 under the per-block cap, tokens = the span's most attended
  (in the index head, or all heads), vectors = their keys in that space;
- query spans from the chunk's causal self-attention, Eq. 8 with sums of the query span's memory
  queries, Eq. 9 block score = best span x query span;
- retrieval heads, score-weighted top-k voting of the retrieval layers up to a layer, persistence of
  the last prefill chunk's retrieval in decoding, and the last prefill chunk of size Q."""
from __future__ import annotations

import math

import pytest
import torch
from infllm_sim import Sim
from test_ltri_spans import brute_spans, grid
from test_methods_common import Driver, make, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


def brute_ratio(A, spans, mode, density):
    n = len(A)
    out = []
    for x, y in spans:
        tri = [A[i][j] for i in range(x, y + 1) for j in range(x, i + 1)]
        row = [A[i][j] for i in range(x, y + 1) for j in range(0, x)]
        col = [A[i][j] for i in range(y + 1, n) for j in range(x, y + 1)]
        f = (lambda v: sum(v) / len(v) if v else 0.0) if density else sum
        nbr = {"row": f(row), "col": f(col), "rowcol": f(row) + f(col)}[mode]
        out.append(1.0 if f(tri) + nbr <= 0 else f(tri) / (f(tri) + nbr))
    return out


def brute_counts(lengths, r_a, lam, vmin, M, static):
    if static:
        counts = [min(L, max(vmin, M // len(lengths))) for L in lengths]
    else:
        counts = [min(L, max(vmin, math.ceil(L * math.exp(-lam * (1 - r)) - 1e-9))) for L, r in zip(lengths, r_a)]
    while sum(counts) > M:
        movable = [i for i in range(len(counts)) if counts[i] > min(vmin, lengths[i])]
        if not movable:
            break
        top = max(counts[i] for i in movable)
        counts[max(i for i in movable if counts[i] == top)] -= 1
    return counts


class LtriSim(Sim):
    def __init__(self, cfg, info, rope, B):
        super().__init__(cfg, info, rope, B)
        self.rh = {}
        for layer, head, score in cfg.get("retrieval_heads", []):
            if layer not in self.rh or score > self.rh[layer][1]:
                self.rh[layer] = (head, score)
        first = min(self.rh) if self.rh else info.num_layers
        self.own = {l: self.rh[l][0] if l in self.rh else None for l in range(info.num_layers) if l in self.rh or l < first}
        self.index = [[[] for _ in range(B)] for _ in range(info.num_layers)]   # per block: list of span vector lists
        self.persist = [None] * info.num_layers
        self.own_scores = {}
        self.own_top = {}

    def space(self, layer, vecs_by_head):
        """{head: [D] tensor} -> the layer's index-space vector."""
        h = self.own[layer]
        return vecs_by_head[h] if h is not None else torch.cat([vecs_by_head[x] for x in range(self.info.num_heads)])

    def on_block(self, layer, pos, K):
        if layer not in self.own:
            return
        c, g, s0, n = self.c, self.info.group, pos[0], len(pos)
        for b in range(self.B):
            A = [[self.map[layer][b].get((s0 + i, s0 + j), 0.0) if j <= i else 0.0 for j in range(n)] for i in range(n)]
            th = c.get("theta_quantile", [0.9])
            io = c.get("iou", [0.1])
            spans = brute_spans(torch.tensor(A, dtype=torch.float64), th[layer % len(th)] if len(th) > 1 else th[0],
                                io[0] if len(io) == 1 else io[layer], c["spans_per_block"], c.get("fill_gaps", True))
            r_a = brute_ratio(A, spans, c.get("ratio_mode", "row"), c.get("ratio_area", "mass") == "density")
            lam = c.get("lam_first", 20.0) if layer < c.get("first_layers", 4) else c.get("lam", 3.0)
            counts = brute_counts([y - x + 1 for x, y in spans], r_a, lam, c.get("min_vectors", 1),
                                  c["max_vectors"], c.get("index") == "static")
            h = self.own[layer]
            vote = [float(self.score[layer][p][b, h]) if h is not None else float(self.score[layer][p][b].sum())
                    for p in pos]
            block = []
            for (x, y), k in zip(spans, counts):
                tv = dict(zip(range(x, y + 1), grid(vote[x:y + 1])))
                toks = sorted(range(x, y + 1), key=lambda t: -tv[t])[:k]
                block.append([self.space(layer, {hh: K[b, hh // g, pos[t]].double() for hh in range(self.info.num_heads)})
                              for t in toks])
            self.index[layer][b].append(block)

    def query_spans(self, layer, a, T, q, K, b):
        c, g = self.c, self.info.group
        if T == 1:
            return [(0, 0)]
        A = torch.zeros(T, T, dtype=torch.float64)
        for h in range(self.info.num_heads):
            qs = [self.rot(q[b:b + 1, h:h + 1, t], a + t)[0, 0] for t in range(T)]
            ks = [self.rot(K[b:b + 1, h // g:h // g + 1, a + u], a + u)[0, 0] for u in range(T)]
            for t in range(T):
                logit = torch.tensor([float(qs[t] @ ks[u]) for u in range(t + 1)]) * self.info.scaling
                A[t, :t + 1] += torch.softmax(logit.double(), 0)
        th, io = c.get("theta_quantile", [0.9]), c.get("iou", [0.1])
        return brute_spans(A, th[0] if len(th) == 1 else th[layer], io[0] if len(io) == 1 else io[layer],
                           max(1, math.ceil(c["spans_per_block"] * T / c["block_size"])), c.get("fill_gaps", True))

    def choose(self, layer, a, T, q, K, nb, units, phase):
        c, B = self.c, self.B
        if phase == "decode" and c.get("persistent", True):
            return self.persist[layer] if self.persist[layer] is not None else [[[]] for _ in range(B)]
        if layer in self.own:
            scores = torch.full((B, nb), float("-inf"), dtype=torch.float64)
            for b in range(B):
                qm = [self.space(layer, {h: self.rot(q[b:b + 1, h:h + 1, t], self.dist)[0, 0]
                                         for h in range(self.info.num_heads)}) for t in range(T)]
                qsums = [sum(qm[x:y + 1]) for x, y in self.query_spans(layer, a, T, q, K, b)]
                for i in range(nb):
                    scores[b, i] = max(float(sum(span) @ qs) for span in self.index[layer][b][i] for qs in qsums)
                scores[b] = torch.tensor(grid(scores[b].tolist()), dtype=torch.float64)
            self.own_scores[layer] = scores
            self.own_top[layer] = [sorted(range(nb), key=lambda i: -scores[b, i])[:min(c["topk"], nb)] for b in range(B)]
        if nb <= c["topk"]:
            sel = [[list(range(nb))] for _ in range(B)]
        else:
            sel = [[sorted(sorted(range(nb), key=lambda i: tuple(-x for x in self.key(layer, b, i)))[:c["topk"]])]
                   for b in range(B)]
        if phase != "decode":
            self.persist[layer] = sel
        return sel

    def key(self, layer, b, i):
        """Ranking key of block i (higher first): own similarity, or (weighted votes, latest voter's similarity)."""
        c = self.c
        voting = c.get("voting", True)
        if layer in self.own and (not voting or (self.rh and layer not in self.rh)):
            return (float(self.own_scores[layer][b, i]),)
        voters = [(l, s) for l, (_, s) in sorted(self.rh.items()) if l <= layer] if self.rh else \
            [(l, 1.0) for l in range(layer + 1)]
        latest = float(self.own_scores[voters[-1][0]][b, i])
        if not voting:
            return (latest,)
        votes = 0.0
        for l, w in voters:
            if i in self.own_top[l][b]:
                votes += w
        return (votes, latest)


BASE = {"name": "ltri", "n_init": 3, "n_local": 6, "block_size": 4, "topk": 2, "exc_block_size": 5,
        "max_cached_block": 3, "spans_per_block": 2, "max_vectors": 5, "theta_quantile": [0.5], "iou": [0.3],
        "last_chunk": 3, "first_layers": 1}


@pytest.mark.parametrize("extra", [
    {},
    {"retrieval_heads": [[1, 2, 0.5], [2, 0, 0.2], [2, 1, 0.4]], "persistent": False, "ratio_mode": "rowcol"},
    {"retrieval_heads": [[2, 1, 0.3]], "voting": False, "index": "static", "ratio_mode": "col",
     "ratio_area": "density", "offload": False},
    {"voting": False, "fill_gaps": False, "spans_per_block": 1, "max_vectors": 2, "lam": 1.0},
])
def test_outputs_retrieval_and_index_vectors_match_brute_force(extra):
    cfg = {**BASE, **extra}
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make(cfg, model)
    assert method.prefill_bounds(27) == [0, 5, 10, 15, 20, 24]             # the last Q=3 tokens alone
    d = Driver(method, info, rope, max_len=60, batch=2, seed=4)
    sim = LtriSim(cfg, info, rope, d.B)
    steps = [(5, "prefill")] * 4 + [(4, "prefill"), (3, "prefill")] + [(1, "decode")] * 14
    saw_ranking = False
    for T, phase in steps:
        a = d.seen
        qs, outs = d.step(T, phase)
        for layer in range(info.num_layers):
            want = sim.step(layer, a, T, qs[layer], d.k[layer], d.v[layer], phase)
            sel = sim.selected[layer]
            if sel is not None:
                got = [[sorted(u) for u in per] for per in method.selected[layer]]
                assert got == sel, (a, phase, layer)
                saw_ranking |= len(sim.blocks[layer]) > cfg["topk"] and phase == "prefill"
            assert (outs[layer].double() - want).abs().max().item() <= 1e-5, (a, phase, layer)
    assert saw_ranking
    for layer in range(info.num_layers):
        for b in range(d.B):
            vec, span_of, span_block = method.index.view(layer, b) if layer in method.own else (None, None, None)
            blocks = sim.index[layer][b]
            if vec is None:
                assert not blocks
                continue
            assert len(blocks) == method.formed_blocks >= 4
            for i, block in enumerate(blocks):
                spans = torch.nonzero(span_block == i).flatten()
                got = [sorted(vec[span_of == s].double().tolist()) for s in spans]
                want = [sorted(v.tolist() for v in span) for span in block]
                assert len(got) == len(want), (layer, b, i)
                for g_, w_ in zip(got, want):
                    assert torch.allclose(torch.tensor(g_), torch.tensor(w_), atol=1e-6), (layer, b, i)
