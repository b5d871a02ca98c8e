"""DuoAttention oracle: on random q, k, v, retrieval KV heads attend everything; streaming KV heads
attend exactly the first `sink` tokens, the `recent` before the current one and the current one, in
decode, and the same Λ pattern per query in a streaming prefill; head_scale doubles the set by score."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import Driver, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from methods import ModelInfo, build
from methods.parts.headfile import HeadSet

INFO = ModelInfo(arch="llama", num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                 max_position=512)
HEADS = "inline:10/01/00/11/00/10"
ROLES = [[c == "1" for c in row] for row in HEADS[len("inline:"):].split("/")]


def lam(L: int, q_pos: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    kp = torch.arange(L).view(1, -1)
    qp = q_pos.view(-1, 1)
    return (kp <= qp) & ((kp < sink) | (kp >= qp - recent))


@pytest.mark.parametrize("prefill", ["streaming", "dense"])
def test_streaming_heads_attend_sinks_and_recent(prefill):
    rope = rope_for(tiny("llama"))
    sink, recent = 3, 5
    method = build(OmegaConf.create({"name": "duo", "heads": HEADS, "sink": sink, "recent": recent,
                                     "prefill": prefill}), INFO)
    d = Driver(method, INFO, rope, max_len=40)
    g = INFO.group
    qs, outs = d.step(20, "prefill")
    for step in range(4):
        if step:
            qs, outs = d.step(1, "decode")
        L = d.seen
        T = qs[0].shape[2]
        q_pos = torch.arange(L - T, L)
        for layer in range(INFO.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L))
            q = rope.apply(qs[layer], q_pos)
            causal = lam(L, q_pos, L, L)
            streaming = causal if (prefill == "dense" and T > 1) else lam(L, q_pos, sink, recent)
            mask = torch.stack([causal if ROLES[layer][h // g] else streaming for h in range(INFO.num_heads)])
            ref = masked_attention(q, k, d.v[layer], mask.unsqueeze(0).expand(d.B, -1, -1, -1), INFO.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (L, layer)
        if step:
            stats = method.stats()["attended_per_layer"]
            for layer in range(INFO.num_layers):
                n = [L if ROLES[layer][kv] else min(L, sink + recent + 1) for kv in range(2)]
                assert stats[layer] == sum(n) / 2


def test_head_scale_takes_the_top_scored_heads():
    hs = HeadSet(((True, False), (False, False)), "x", ((0.9, 0.1), (0.5, 0.7)))
    assert hs.scaled(2.0, keep_layer0=False).roles == ((True, False), (False, True))
    assert hs.scaled(1.0, keep_layer0=False) is hs
    m = build(OmegaConf.create({"name": "duo", "heads": "random:0:3", "head_scale": 2.0}), INFO)
    assert m.cfg.head_set(INFO).count == 6
