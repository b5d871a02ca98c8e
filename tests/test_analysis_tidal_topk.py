"""TidalDecode Figs. 1 and 3 (bench/tidal_topk.py, analysis/papers/tidal_topk.py): the probe's per-layer
top-k sets are the top-k of HF's own eager attention at that step and, at the first selection layer, the
very sets our TidalDecode selects; overlap and recall equal set arithmetic done by hand; the items render
their tables from synthetic benchmark files."""
from __future__ import annotations

import json
import random

import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401

import analysis.papers  # noqa: F401
import methods
from analysis import catalogue
from analysis.__main__ import main
from analysis.papers.tidal_topk import head_overlap
from bench.tidal_topk import (
    TopK,
    first_step,
    pair_overlap,
    recall,
    reselect_choices,
    sources,
)
from methods import ModelInfo
from runners.engine import Engine


def _sets(L, H, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(H)]) for _ in range(L)])


def test_overlap_and_recall_equal_set_arithmetic():
    L, H, k, n = 7, 3, 5, 11
    top = _sets(L, H, k, n, 0)
    top[4, 1, -1] = -1                                   # an empty slot never counts
    pair = pair_overlap(top, n)
    as_set = [[{x for x in top[layer, h].tolist() if x >= 0} for h in range(H)] for layer in range(L)]
    for i in range(L):
        for j in range(L):
            for h in range(H):
                assert abs(float(pair[i, j, h]) - len(as_set[i][h] & as_set[j][h]) / k) < 1e-6
    for r in reselect_choices(L):
        src = {layer: (r if r is not None and layer > r else 2) for layer in range(3, L) if layer != r}
        want = sum(len(as_set[s][h] & as_set[layer][h]) / k for layer, s in src.items() for h in range(H)) / (len(src) * H)
        assert abs(recall(pair, 2, r) - want) < 1e-6
    assert sources(8, 2, 5) == {3: 2, 4: 2, 6: 5, 7: 5} and sources(6, 2, None) == {3: 2, 4: 2, 5: 2}


def _prompt(seed, n=40):
    rng = random.Random(seed)
    return torch.tensor([[rng.randrange(128) for _ in range(n)]])


def test_probe_sets_are_the_top_k_of_hf_attention():
    model, k = tiny_model(6), 6
    probe = TopK(k, kv_sets=True, keep_scores=True)
    eng = Engine(model, probe, use_graphs=False)
    ids = _prompt(1)
    out = first_step(eng, ids, 3, stop_ids=set())
    with torch.no_grad():
        res = model(torch.cat([ids, torch.tensor([[out[0]]])], 1), output_attentions=True)
    assert int(res.logits[0, -2].argmax()) == out[0]
    H = model.config.num_attention_heads
    for layer, att in enumerate(res.attentions):
        probs = att[0, :, -1]                                                     # [Hq, S] the decoded token
        for h in range(H):
            assert set(probe.top[layer][h].tolist()) == set(probs[h].topk(k).indices.tolist())
        grouped = probs.view(model.config.num_key_value_heads, -1, probs.shape[-1]).sum(1)
        for g in range(grouped.shape[0]):                                          # select=kv_head: summed probs
            assert set(probe.top_kv[layer][g].tolist()) == set(grouped[g].topk(k).indices.tolist())
    assert len(probe.top) == model.config.num_hidden_layers                      # recorded at the first step only


def test_probe_sets_at_the_first_selection_layer_are_tidaldecodes():
    model, k = tiny_model(6), 5
    info = ModelInfo.from_hf_config(model.config)
    tidal = methods.build(OmegaConf.create({"name": "tidal", "budget": k, "reselect_layer": 4}), info)
    for seed in range(3):
        ids = _prompt(seed)
        probe = TopK(k)
        token = first_step(Engine(model, probe, use_graphs=False), ids, 1, stop_ids=set())[0]
        eng = Engine(model, tidal, use_graphs=False)
        eng.reset(1, ids.shape[1] + 1)
        eng.prefill(ids)
        eng.decode(torch.tensor([token]))
        # layers 0-1 dense and layer 2 full attention in both: same hidden states, same sets
        got = tidal.selected[2][0]
        assert [set(r) for r in got.tolist()] == [set(r) for r in probe.top[2].tolist()]


def _fig1_json(f):
    toks = ["a", "\n", " b", "c", " "]
    return {"command": f.command, "commit": "abc1234", "device": "cpu", "model": "smollm2", "figure": "fig1", "k": 2,
            "layers": 3, "query_heads": 2, "kv_heads": 1, "rows": [], "prompt": "p", "tokens": toks, "prompt_tokens": 4,
            "query_token": " ", "model_answer": "15213", "head": 0, "top": [[0, 1], [0, 1], [2, 4]],
            "head_probs": [[0.2] * 5] * 3, "head_share": [[0.5] * 5] * 3, "adjacent": [[1.0, 0.5], [0.0, 0.5]]}


def _fig3_json(f):
    samples = [{"id": f"s{i}", "tokens": 9, "answered": float(i % 2), "recall_query_head": [0.2 + 0.1 * i, 0.5, 0.4],
                "recall_kv_head": [0.3, 0.3, 0.3]} for i in range(3)]
    ov = [[1.0 if i == j else 0.25 for j in range(5)] for i in range(5)]
    return {"command": f.command, "commit": "abc1234", "device": "cpu", "model": "smollm2", "figure": "fig3", "k": 2,
            "layers": 5, "query_heads": 2, "kv_heads": 1, "rows": [], "first_layer": 2, "reselect": ["none", 3, 4],
            "haystack": "noise", "length": 9, "samples": samples, "overlap_mean": ov, "overlap_sd": ov}


def test_fig1_and_fig3_render_from_benchmark_files(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    for key, make in (("tidal.fig1", _fig1_json), ("tidal.fig3", _fig3_json)):
        f = catalogue.get(key).impl.bench.files[0]
        (bench / f.name).write_text(json.dumps(make(f)))
        assert main(["render", key, "--bench", str(bench), "--out", str(tmp_path / "out")]) == 0
    md1 = (tmp_path / "out" / "tables" / "tidal.fig1.md").read_text()
    assert "| adjacent layers (l, l+1), mean | 50.0% | 50.0% | 40.0% | 2 |" in md1    # head 0, all heads, k/N
    assert head_overlap([[0, 1], [0, 1], [2, 4]], 1, 1) == 0.5                       # = the bench's adjacent, head 0
    assert head_overlap([[0, 1], [0, 1], [2, 4]], 2) == 0.0
    assert "- L2: 2: ' b', 4: ' '" in md1 and "tidal_topk_fig1_llama3.json`: **missing**" in md1
    md3 = (tmp_path / "out" / "tables" / "tidal.fig3.md").read_text()
    assert "| none | 30.0% [18.7–41.3] | 30.0% [30.0–30.0] | 3 |" in md3                     # mean of 0.2/0.3/0.4, normal interval
    assert "| L3 | 50.0% [50.0–50.0] | 30.0% [30.0–30.0] | 3 |" in md3
    assert "full attention answers 1 of them" in md3 and "best re-selection layer L3: 50.0%" in md3
    assert "(a) Mean overlap of layer pairs (i, i+d) from the first selection layer (L2) on, by distance d: 1: 25.0%, " \
           "2: 25.0%." in md3
    assert "python -m bench.tidal_topk fig3 --model llama3" in md3                # the paper profile's command
