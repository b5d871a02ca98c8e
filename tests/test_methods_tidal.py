"""TidalDecode oracle: on random q, k, v each selection layer runs full attention and its set is the
top-k of the exact q.k (per query head, or per KV head by option); every later sparse layer of the
same step attends exactly that set. Cache correction rewrites sparsely decoded KV to dense values."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import (  # noqa: F401
    Driver,
    masked_attention,
    one_thread,
    rope_for,
    tiny_model,
)
from tiny_models import tiny

from methods import ModelInfo, build
from runners.engine import Engine

INFO = ModelInfo(arch="llama", num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                 max_position=512)


@pytest.mark.parametrize("cfg", [
    {},
    {"select": "kv_head"},
    {"select": "kv_head", "group_score": "logit_max"},
    {"include_current": True},
])
def test_selected_tokens_are_exact_topk_and_used_downstream(cfg):
    rope = rope_for(tiny("llama"))
    full_cfg = {"name": "tidal", "budget": 7, "dense_layers": 2, "reselect_layer": 4, **cfg}
    method = build(OmegaConf.create(full_cfg), INFO)
    d = Driver(method, INFO, rope, max_len=40)
    d.step(30, "prefill")
    g = INFO.group
    for _ in range(4):
        qs, outs = d.step(1, "decode")
        L = d.seen
        current = None
        for layer in range(INFO.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L))
            q = rope.apply(qs[layer], torch.tensor([L - 1]))
            everything = torch.ones(d.B, INFO.num_heads, 1, L, dtype=torch.bool)
            full = masked_attention(q, k, d.v[layer], everything, INFO.scaling)
            if layer < 2 or layer in (2, 4):  # dense and selection layers attend everything
                assert (outs[layer] - full).abs().max().item() <= 1e-5
            if layer in (2, 4):
                s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2))[:, :, 0]  # exact q.k [B, Hq, L]
                if method.cfg.select == "kv_head":
                    s = s.unflatten(1, (INFO.num_kv_heads, g))
                    s = torch.softmax(s * INFO.scaling, -1).sum(2) if method.cfg.group_score == "softmax_sum" \
                        else s.amax(2)
                if method.cfg.include_current:
                    s[..., L - 1] = float("inf")
                want = s.topk(7, -1).indices.sort(-1).values
                got = method.selected[layer].sort(-1).values
                assert torch.equal(got, want), (L, layer)
                if method.cfg.include_current:
                    assert (got == L - 1).any(-1).all()
                current = got
            elif layer > 2:  # sparse: exactly the latest selection layer's set
                chosen = torch.zeros(d.B, current.shape[1], L, dtype=torch.bool).scatter_(-1, current, True)
                if chosen.shape[1] != INFO.num_heads:
                    chosen = chosen.repeat_interleave(g, 1)
                ref = masked_attention(q, k, d.v[layer], chosen.unsqueeze(2), INFO.scaling)
                assert (outs[layer] - ref).abs().max().item() <= 1e-5, (L, layer)
                assert (outs[layer] - full).abs().max().item() > 1e-3  # the set really is sparse
        stats = method.stats()["attended_per_layer"]
        assert stats == {0: L, 1: L, 2: L, 3: 7, 4: L, 5: 7}


def test_cache_correction_restores_dense_kv():
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, 128, (2, 34), generator=torch.Generator().manual_seed(3))

    def run(cfg, n_prefill=24):
        eng = Engine(model, build(OmegaConf.create(cfg), info))
        eng.reset(2, ids.shape[1])
        eng.prefill(ids[:, :n_prefill])
        for t in range(n_prefill, ids.shape[1]):
            eng.decode(ids[:, t])
        return eng.method

    base = {"name": "tidal", "budget": 4, "reselect_layer": 4}
    fixed = run({**base, "correction_interval": 4})   # corrections after decode steps 4 and 8
    plain = run(base)
    dense = run({"name": "full"}, n_prefill=34)
    assert fixed._clean_end == 32
    ref_k, ref_v = dense.store.k[:, :, :, :32], dense.store.v[:, :, :, :32]
    assert (fixed.store.k[:, :, :, :32] - ref_k).abs().max().item() <= 1e-5
    assert (fixed.store.v[:, :, :, :32] - ref_v).abs().max().item() <= 1e-5
    # without correction the sparsely decoded tokens' KV (layers past the dense ones) does differ
    assert (plain.store.k[3:, :, :, 24:32] - ref_k[3:, :, :, 24:32]).abs().max().item() > 1e-3
    assert (fixed.store.k[3:, :, :, 32:] - dense.store.k[3:, :, :, 32:34]).abs().max().item() > 1e-3
