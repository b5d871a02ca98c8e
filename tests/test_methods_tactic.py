"""Tactic oracles.

1. Brute force on random inputs: per decode step, layer and head, plain Python re-derives from the
   method's clusters (checked to be a partition whose centroids are the means of their keys) what
   Algorithm 1 must select (cluster ranking by q.centroid, the sorted list, the exact head and fit
   windows, a and b, the smallest K whose estimated mass reaches P, the exact set) and the output
   must be exact attention over that set (<= 1e-5); the same for the top-K and the two oracles.
2. Planted clusters (the reviewer's check): keys in tight clusters whose exp-scores along the
   cluster order follow a/x + b (the paper's model). With the planted clusters in the index, the
   estimated softmax denominator is within 1% of the exact one and the attended mass reaches the
   target within 0.005, for P = 0.5/0.9/0.99; through k-means (which merges some planted clusters)
   within 12% and 0.02. P = 1 equals full attention.
Its building blocks (the closed forms, k-means) are tested in test_methods_tactic_parts.py.
"""
from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from methods import ModelInfo, Step, build
from methods.parts.rope import Rope


def _clusters(method, layer, b, h):
    """[(cluster id, centroid, [positions])] of one KV head, checked: a partition of [sink, ce)."""
    ix, out = method.index, []
    for cid in range(method.n_clu):
        size, start = int(ix.csize[layer, b, h, cid]), int(ix.cstart[layer, b, h, cid])
        out.append((cid, ix.cent[layer, b, h, cid], ix.order[layer, b, h, start:start + size].tolist()))
    allpos = sorted(p for _, _, ps in out for p in ps)
    assert allpos == list(range(method.cfg.sink, method.ce)), "clusters are not a partition of [sink, ce)"
    return out


def _brute(method, info, q, k, L, layer, b):
    """Per row: (selected positions, its query heads) as Algorithm 1 defines them (plain Python)."""
    c, scale = method.cfg, info.scaling
    g = info.group
    rows = info.num_heads if c.select == "query_head" else info.num_kv_heads
    per = info.num_heads // rows
    E = list(range(min(c.sink, L))) + list(range(method.ce, L))
    out = []
    for row in range(rows):
        heads = list(range(row * per, (row + 1) * per))
        kv = heads[0] // g
        cl = [x for x in _clusters(method, layer, b, kv) if x[2]]
        for _, cent, ps in cl:           # centroid = mean of its rotated keys
            assert torch.allclose(cent, k[b, kv, ps].mean(0), atol=1e-5)
        logits = {h: [float(q[b, h] @ cent) for _, cent, _ in cl] for h in heads}
        if c.select == "query_head":
            score = logits[heads[0]]
        else:                             # the group's summed softmax of centroid logits
            score = [sum(math.exp(scale * logits[h][i]) / sum(math.exp(scale * x) for x in logits[h]) for h in heads)
                     for i in range(len(cl))]
        order = sorted(range(len(cl)), key=lambda i: -score[i])
        lst = [p for i in order for p in cl[i][2]]
        n = len(lst)
        if c.mode == "topk":
            K = max(0, min(c.budget - len(E), n))
        elif c.target >= 1:
            K = n
        else:
            K = max(_fit_k(method, q[b, h], k[b, kv], lst, E, scale) for h in heads)
        out.append((set(lst[:K]) | set(E), heads))
    return out


def _fit_k(method, qh, kh, lst, E, scale):
    c, n = method.cfg, len(lst)
    ex = {p: scale * float(qh @ kh[p]) for p in set(E) | set(lst[:c.exact_head])}
    nh = min(c.exact_head, n)
    wins = []
    if n > nh:
        w = min(c.fit_window, n - nh)
        for f in (c.fit_lo, c.fit_hi):
            s = min(max(int(f * n) - w // 2, nh), n - w)
            wins.append(list(range(s, s + w)))
            ex.update({lst[r]: scale * float(qh @ kh[lst[r]]) for r in wins[-1]})
    m = max(ex.values())
    e = {p: math.exp(v - m) for p, v in ex.items()}
    curve = lambda x: 0.0
    if wins:
        u = [sum(1 / (r + 1) for r in wn) / len(wn) for wn in wins]
        mu = [sum(e[lst[r]] for r in wn) / len(wn) for wn in wins]
        a, b = (mu[0] - mu[1]) / (u[0] - u[1]), None
        a, b = (a, mu[0] - a * u[0]) if a > 0 else (0.0, (mu[0] + mu[1]) / 2)
        curve = lambda x: max(a / x + b, 0.0)
    w = [e[lst[i]] if i < nh else curve(i + 1) for i in range(n)]
    base = sum(e[p] for p in E)
    total = base + sum(w)
    acc = base
    for K in range(n + 1):
        if acc >= c.target * total * (1 - 1e-6):
            return K
        acc += w[K] if K < n else 0.0
    return n


CASES = [
    {"target": 0.7, "cluster_size": 4, "exact_head": 6, "fit_window": 3},
    {"target": 0.5, "cluster_size": 3, "exact_head": 2, "fit_window": 2, "select": "kv_head", "sink": 2,
     "window": 4, "recluster_every": 5},
    {"target": 0.9, "cluster_size": 5, "exact_head": 4, "fit_window": 4, "recluster": "all", "recluster_every": 4,
     "metric": "cosine"},
    {"mode": "topk", "budget": 20, "cluster_size": 4, "sink": 1, "window": 2},
    {"target": 1.0, "cluster_size": 4, "select": "kv_head"},
]


@pytest.mark.parametrize("cfg", CASES)
def test_selection_and_output_match_brute_force(cfg):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "tactic", **cfg}, model)
    d = Driver(method, info, rope, max_len=80)
    d.step(25, "prefill")
    d.step(23, "prefill")
    for _ in range(12):
        L = d.seen + 1
        pos = torch.tensor([L - 1])
        # the engine's hook after the previous step (re-clustering), then the step itself
        method.correction_span(d.seen)
        qs, outs = d.step(1, "decode")
        assert method.n_tok > 0
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L))
            q = rope.apply(qs[layer], pos)[:, :, 0]
            mask = torch.zeros(d.B, info.num_heads, 1, L, dtype=torch.bool)
            index, counts = method.selected[layer]
            for b in range(d.B):
                for r, (want, heads) in enumerate(_brute(method, info, q, k, L, layer, b)):
                    got = set(index[b, r, :counts[b, r]].tolist())
                    assert got == want, (L, layer, b, r, sorted(got ^ want))
                    for h in heads:
                        mask[b, h, 0, sorted(want)] = True
            ref = masked_attention(q.unsqueeze(2), k, d.v[layer], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("mode,select", [("oracle_global", "query_head"), ("oracle_global", "kv_head"),
                                         ("oracle_cluster", "query_head"), ("oracle_cluster", "kv_head")])
def test_oracles_reach_the_target_with_the_fewest_tokens(mode, select):
    """Global optimal: per head, the fewest tokens by true weight reaching P; clustering optimal: the
    fewest list tokens (plus the exact set) in cluster order. A shared (kv_head) set takes the
    group's largest count, in the group's order."""
    model = tiny("llama")
    rope = rope_for(model)
    P = 0.8
    method, info = make({"name": "tactic", "mode": mode, "target": P, "select": select, "cluster_size": 4}, model)
    d = Driver(method, info, rope, max_len=60)
    d.step(40, "prefill")
    for _ in range(3):
        qs, _ = d.step(1, "decode")
        L = d.seen
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L)).repeat_interleave(info.group, 1)
            q = rope.apply(qs[layer], torch.tensor([L - 1]))[:, :, 0]
            probs = torch.softmax(torch.einsum("bhd,bhld->bhl", q, k) * info.scaling, -1)
            index, counts = method.selected[layer]
            rows = index.shape[1]
            per = info.num_heads // rows
            for b in range(d.B):
                for r in range(rows):
                    got = index[b, r, :counts[b, r]].tolist()
                    heads = range(r * per, (r + 1) * per)
                    for h in heads:
                        assert probs[b, h, got].sum() >= P - 1e-6            # every head reaches P
                    # the fewest: without the last ranked token some head falls short
                    n_e = 0 if mode == "oracle_global" else L - method.ce     # exact set after the list
                    K = len(got) - n_e
                    if K > 0:
                        fewer = got[:K - 1] + got[K:]
                        assert any(probs[b, h, fewer].sum() < P for h in heads)
                    if mode == "oracle_global" and per == 1:
                        need = int((probs[b, r].sort(descending=True).values.cumsum(0) < P).sum()) + 1
                        assert len(got) == need


# --- planted clusters ----------------------------------------------------------------------------

class _NoRotary(torch.nn.Module):
    """cos = 1, sin = 0: keys and queries are used as given (the planted geometry is the rotated one)."""

    def forward(self, x, pos):
        shape = (*pos.shape, x.shape[-1])
        return torch.ones(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype)


def _planted(target: float, inject: bool, n_clusters=128, size=32, D=64, a=40.0, b=0.002, seed=0, **cfg):
    """One layer, 2 query heads on 1 KV head; tight clusters at nearly orthogonal directions e_i, each
    token with a component t along the query u such that exp(scale * t) = a / x + b at its list rank x
    (cluster i holds ranks i*size+1.., in position order): the exp-scores along the cluster order follow
    the paper's curve. `inject`: the index holds the planted clusters (k-means skipped); otherwise
    k-means finds its own. Returns (method, output, (q, k, v, info))."""
    g = torch.Generator().manual_seed(seed)
    info = ModelInfo(arch="llama", num_layers=1, num_heads=2, num_kv_heads=1, head_dim=D, hidden_size=2 * D,
                     max_position=1 << 20)
    m = build(OmegaConf.create({"name": "tactic", "diagnostics": True, "target": target, "cluster_size": size,
                                **cfg}), info)
    rope = Rope(_NoRotary())
    n = n_clusters * size
    m.setup(info, 1, n + 1, torch.device("cpu"), torch.float32)
    u = torch.nn.functional.normalize(torch.randn(D, generator=g), dim=0)
    e = torch.randn(n_clusters, D, generator=g)
    e = torch.nn.functional.normalize(e - (e @ u).unsqueeze(-1) * u, dim=-1)   # orthogonal to the query
    members = torch.randperm(n, generator=g) % n_clusters                      # interleaved positions
    # list rank of a token: its cluster's place, then its place among the cluster's positions
    within = torch.zeros(n, dtype=torch.long)
    for i in range(n_clusters):
        ps = (members == i).nonzero().squeeze(-1)
        within[ps] = torch.arange(ps.numel())
    x = members * size + within + 1                                            # 1-based list rank
    t = torch.log(a / x + b) / info.scaling
    keys = 30.0 * e[members] + t.unsqueeze(-1) * u + 0.01 * torch.randn(n, D, generator=g)
    k = keys.view(1, 1, n, D)
    v = torch.randn(1, 1, n, D, generator=g)
    m.begin(Step("prefill", 0, n, torch.arange(n)))
    m.attend(0, torch.randn(1, 2, n, D, generator=g), k, v, rope)
    if inject:
        ix = m.index
        for i in range(n_clusters):
            ps = (members == i).nonzero().squeeze(-1)
            ix.cent[0, 0, 0, i] = keys[ps].mean(0)
            ix.csize[0, 0, 0, i], ix.cstart[0, 0, 0, i] = ps.numel(), i * size
            ix.order[0, 0, 0, i * size:(i + 1) * size] = ps.int()
        m.n_clu, m.n_tok, m.ce, m._fresh = n_clusters, n, n, False
    m.begin(Step("decode", n, 1, torch.tensor([n])))
    q = u.view(1, 1, 1, D).expand(1, 2, 1, D)
    out = m.attend(0, q, torch.zeros(1, 1, 1, D), torch.zeros(1, 1, 1, D), rope)
    return m, out, (q, torch.cat([k, torch.zeros(1, 1, 1, D)], 2), torch.cat([v, torch.zeros(1, 1, 1, D)], 2), info)


@pytest.mark.parametrize("target", [0.5, 0.9])
def test_diagnostics_only_record(target):
    """method.diagnostics adds statistics, not a different selection: the output is the same bit for bit
    (tactic.fig9 reads the runs of fig7, which record them)."""
    on = _planted(target, False)
    off = _planted(target, False, diagnostics=False)
    assert on[0].cfg.diagnostics and not off[0].cfg.diagnostics
    assert torch.equal(on[1], off[1])


@pytest.mark.parametrize("target", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_clusters_estimated_mass_and_budget(target, seed):
    """The planted clusters in the index: the estimate alone (measured: denominator within 0.02%, mass
    within 0.0003 of P, budget within 2 tokens of the clustering optimal)."""
    m, _, _ = _planted(target, inject=True, seed=seed)
    s = m.stats()["sample_metrics"]
    assert abs(s["z_ratio"] - 1) <= 0.01, s                            # estimated denominator within 1%
    assert s["mass_obtained"] >= target - 0.005, s                       # the budget reaches the target
    assert abs(s["budget_tactic"] - s["budget_cluster"]) <= 32, s      # within one cluster of the optimum


@pytest.mark.parametrize("target", [0.5, 0.9, 0.99])
def test_planted_keys_through_kmeans(target):
    """End to end: k-means (random initial keys, as the paper) finds its own clusters; some planted
    clusters merge, which moves list ranks, so the stated tolerance is wider (measured over seeds
    0-2: denominator within 10%, mass within 0.014 of P)."""
    for seed in (0, 1, 2):
        m, _, _ = _planted(target, inject=False, seed=seed)
        s = m.stats()["sample_metrics"]
        assert abs(s["z_ratio"] - 1) <= 0.12, s
        assert s["mass_obtained"] >= target - 0.02, s


def test_planted_clusters_full_target_equals_dense():
    m, out, (q, k, v, info) = _planted(1.0, inject=False)
    ref = masked_attention(q, k, v, torch.ones(1, 2, 1, k.shape[2], dtype=torch.bool), info.scaling)
    assert (out - ref).abs().max().item() <= 1e-5
    assert m.stats()["sample_metrics"]["mass_obtained"] >= 1 - 1e-5


@pytest.mark.parametrize("every", [None, 8])
def test_token_by_token_stays_in_budget_only_when_reclustering(every):
    """PG-19's token-by-token protocol (Fig. 6): one token prefilled, the rest decoded. Without
    re-clustering every decoded token stays in the exact set and top-K attends all L tokens (full
    attention); re-clustering every budget / 2 steps keeps every row at <= budget tokens."""
    budget, steps = 16, 60
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "tactic", "mode": "topk", "budget": budget, "cluster_size": 4,
                         "recluster_every": every}, model)
    d = Driver(method, info, rope, max_len=steps + 2)
    d.step(1, "prefill")
    for _ in range(steps):
        method.correction_span(d.seen)
        d.step(1, "decode")
    counts = torch.stack([method.selected[layer][1] for layer in range(info.num_layers)])
    if every is None:
        assert int(counts.min()) == d.seen - 1                 # every decoded token (E): no budget at all
    else:
        assert int(counts.max()) <= budget and method.n_clu > 0


@pytest.mark.parametrize("cfg", [CASES[0], CASES[3]])
def test_attended_tally_is_the_mean_over_layer_steps(cfg):
    """sample_metrics' `attended` (one in-place add a layer, issue 33) = the mean over decode steps and
    layers of each layer's mean attended tokens, as the per-layer stack + add it replaced computed it."""
    model = tiny("llama")
    method, info = make({"name": "tactic", **cfg}, model)
    d = Driver(method, info, rope_for(model), max_len=80)
    d.step(30, "prefill")
    means = []
    for _ in range(7):
        method.correction_span(d.seen)
        d.step(1, "decode")
        means += [float(method._heads[layer].float().mean()) for layer in range(info.num_layers)]
    got = method.stats()["sample_metrics"]["attended"]
    assert got == pytest.approx(sum(means) / len(means), rel=1e-9)
