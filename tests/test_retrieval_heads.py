"""The retrieval-score procedure (offline/retrieval_heads.py, Wu et al. 2024): on a tiny random model,
the top-1 attended position per (layer, head) at every decode step equals the argmax of HF's own eager
attention weights (output_attentions), and the copy-paste score follows from them: 1 / needle length
each time the top-1 position lies in the needle on the token just generated."""
from __future__ import annotations

import torch
from test_methods_common import one_thread  # noqa: F401
from tiny_models import tiny

from offline.retrieval_heads import TopAttention, score_sample
from runners.engine import Engine
from tasks.base import Sample


def test_scores_follow_hf_attention_argmax():
    model = tiny("llama")
    scored = 0.0
    for seed in range(12):
        scored += _check(model, seed)
        if scored > 0:
            break
    assert scored > 0          # some case really scored something


def _check(model, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (24,), generator=g).tolist()
    with torch.no_grad():   # put the model's own continuation inside the needle: copies become likely
        first = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, 24:].tolist()
    ids[8:8 + len(first)] = first
    sample = Sample(id="x", input_ids=ids, params={"needle_token": 4, "needle_end": 20}, max_new_tokens=8)
    eng = Engine(model, TopAttention({"name": "full"}), use_graphs=False)
    got, out = score_sample(eng, sample, stop_ids=set())
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    want = torch.zeros(L, H)
    seq = list(ids)
    with torch.no_grad():
        for t in out:
            res = model(torch.tensor([seq]), output_attentions=True)
            assert int(res.logits[0, -1].argmax()) == t
            for layer, att in enumerate(res.attentions):
                for h in range(H):
                    pos = int(att[0, h, -1].argmax())
                    if 4 <= pos < 20 and ids[pos] == t:
                        want[layer, h] += 1 / 16
            seq.append(t)
    assert torch.allclose(got, want)
    return float(want.sum())
