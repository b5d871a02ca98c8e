"""TOVA oracle: on random q, k, v the tokens each layer keeps, and the attention output, equal a
plain-Python simulation of TOVACache (schwartz-lab-NLP/TOVA src/tova_cache.py): append, attend,
then keep the top `budget` tokens by the last query's attention averaged over heads (over all query
heads: one set per layer; or per KV group), the incoming token included in the ranking."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


def _probs(q, k, mask, scale):
    s = (q @ k.transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1)


@pytest.mark.parametrize("budget,heads,chunk", [(10, "shared", None), (7, "kv_group", None), (9, "shared", 8)])
def test_kept_tokens_and_outputs_match_simulation(budget, heads, chunk):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "tova", "budget": budget, "heads": heads, "prefill_chunk": chunk}, model)
    g, Hkv, Hq = info.group, info.num_kv_heads, info.num_heads
    T0, n_dec = 20, 12
    d = Driver(method, info, rope, max_len=T0 + n_dec)
    kept = {}  # (layer, b, kv head) -> positions

    def score(p):  # [B, Hq, L] -> [B, Hkv, L]
        if heads == "shared":
            return p.mean(1, keepdim=True).expand(-1, Hkv, -1)
        return p.unflatten(1, (Hkv, g)).mean(2)

    def step(T, phase):
        qs, outs = d.step(T, phase)
        a0, a1 = d.seen - T, d.seen
        for layer in range(info.num_layers):
            kr = rope.apply(d.k[layer], torch.arange(a1))
            k = kr.repeat_interleave(g, 1)
            q = rope.apply(qs[layer], torch.arange(a0, a1))
            mask = torch.zeros(d.B, Hq, T, a1, dtype=torch.bool)
            for b in range(d.B):
                for h in range(Hkv):
                    cand = kept.get((layer, b, h), []) + list(range(a0, a1))
                    kept[layer, b, h] = cand
                    for t in range(T):  # causal among the new tokens, old kept ones all visible
                        mask[b, h * g:(h + 1) * g, t, [p for p in cand if p <= a0 + t]] = True
            ref = masked_attention(q, kr, d.v[layer], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (phase, a0, layer)
            s = score(_probs(q, k, mask, info.scaling)[:, :, -1])
            for b in range(d.B):
                for h in range(Hkv):
                    cand = kept[layer, b, h]
                    if len(cand) > budget:
                        kept[layer, b, h] = sorted(sorted(cand, key=lambda p: -s[b, h, p].item())[:budget])
            S = method.store
            for b in range(d.B):
                for h in range(Hkv):
                    n = min(a1, budget)
                    if phase == "decode":
                        n = min(a1, budget + 1)
                        free = int(method.free[layer, b, h])
                        got = sorted(p for i, p in enumerate(S.pos[layer, b, h, :n].tolist())
                                     if not (a1 >= budget + 1 and i == free))
                    else:
                        got = sorted(S.pos[layer, b, h, :n].tolist())
                    assert got == kept[layer, b, h], (phase, a0, layer, b, h)
                    if heads == "shared":
                        assert kept[layer, b, h] == kept[layer, b, 0]

    for s in range(0, T0, chunk or T0):
        step(min(chunk or T0, T0 - s), "prefill")
    for _ in range(n_dec):
        step(1, "decode")
