"""LM-Infinite oracle: on random q, k, v each output equals the Lambda-masked attention of the
reference's explicit (non-Lambda-matrix) path in Glaciohound/LM-Infinite models/llama.py, computed
over EVERY key so far (the reference keeps all keys): for query p and key j,
  p - j < local_branch            -> logit of q, k rotated at their real positions;
  else j < global_branch          -> logit of q rotated by min(limit_distance, kv_len - 1), k un-rotated;
  else                            -> masked;
one softmax over the row."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


def lambda_attention(q, K, V, a, kv_len, cfg, rope, scale):
    """q [B, Hq, T, D] at positions a..; K, V [B, Hkv, N, D] (un-rotated) -> [B, T, Hq*D]."""
    B, Hq, T, D = q.shape
    g = Hq // K.shape[1]
    N = K.shape[2]
    L, G = cfg["local_branch"], cfg["global_branch"]
    limit = min(cfg.get("limit_distance") or L, kv_len - 1)
    qr = rope.apply(q, torch.arange(a, a + T)).double()
    kr = rope.apply(K, torch.arange(N)).double().repeat_interleave(g, 1)
    qs = rope.apply(q, torch.tensor([limit] * T)).double()
    ks = K.double().repeat_interleave(g, 1)
    rot = qr @ kr.transpose(-1, -2)
    sta = qs @ ks.transpose(-1, -2)
    p = torch.arange(a, a + T).view(-1, 1)
    j = torch.arange(N).view(1, -1)
    d = p - j
    logits = torch.where((d >= 0) & (d < L), rot, torch.where((d >= L) & (j < G), sta, float("-inf")))
    w = torch.softmax(logits * scale, -1)
    return (w @ V.double().repeat_interleave(g, 1)).transpose(1, 2).reshape(B, T, Hq * D)


@pytest.mark.parametrize("cfg", [
    {"global_branch": 3, "local_branch": 7, "prefill_chunk": 5},
    {"global_branch": 4, "local_branch": 6, "limit_distance": 11, "prefill_chunk": 9},
    {"global_branch": 0, "local_branch": 8, "prefill_chunk": 4},
    {"global_branch": 2, "local_branch": 9, "limit_distance": 3, "prefill_chunk": 9},
])
def test_outputs_match_the_lambda_mask(cfg):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "lm_infinite", **cfg}, model)
    d = Driver(method, info, rope, max_len=50, batch=2, seed=2)
    chunk = cfg["prefill_chunk"]
    steps = [(chunk, "prefill")] * (27 // chunk) + [(27 % chunk or chunk, "prefill")] + [(1, "decode")] * 12
    for T, phase in steps:
        a = d.seen
        qs, outs = d.step(T, phase)
        for layer in range(info.num_layers):
            want = lambda_attention(qs[layer], d.k[layer], d.v[layer], a, a + T, cfg, rope, info.scaling)
            assert (outs[layer].double() - want).abs().max().item() <= 1e-5, (a, phase, layer)
    st = method.stats()
    assert all(n == cfg["local_branch"] + min(cfg["global_branch"], d.seen - cfg["local_branch"])
               for n in st["attended_per_layer"].values())
