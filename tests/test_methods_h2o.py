"""H2O oracle: on random q, k, v the tokens each KV head keeps, and the attention output, equal a
plain-Python simulation of h2o_hf/utils_real_drop (a list cache per head: accumulate post-softmax
attention over every query row, keep the recent window plus the top-scored others, evict the
lowest-scored non-recent token after each decode step)."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


def _probs(q, k, mask, scale):
    """q [B, Hq, T, D], k [B, Hq, L, D] (rotated, per query head), mask [B, Hq, T, L] -> probs."""
    s = (q @ k.transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1)


@pytest.mark.parametrize("budget,recent,pool", [(10, None, "sum"), (9, 3, "max"), (12, 2, "mean")])
def test_kept_tokens_and_outputs_match_simulation(budget, recent, pool):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "h2o", "budget": budget, "recent": recent, "pool": pool}, model)
    window = recent if recent is not None else budget // 2
    g, Hkv = info.group, info.num_kv_heads
    T0, n_dec = 20, 12
    d = Driver(method, info, rope, max_len=T0 + n_dec)

    def reduce(p):  # [B, Hq, L] -> [B, Hkv, L]
        p = p.unflatten(1, (Hkv, g))
        return {"sum": p.sum(2), "max": p.amax(2), "mean": p.mean(2)}[pool]

    # prefill: dense causal attention; scores = column sums; keep recent + top others
    qs, outs = d.step(T0, "prefill")
    kept, score = {}, {}
    for layer in range(info.num_layers):
        k = rope.apply(d.k[layer], torch.arange(T0)).repeat_interleave(g, 1)
        q = rope.apply(qs[layer], torch.arange(T0))
        mask = torch.ones(T0, T0, dtype=torch.bool).tril().expand(d.B, info.num_heads, T0, T0)
        pooled = reduce(_probs(q, k, mask, info.scaling).sum(2))  # [B, Hkv, T0]
        for b in range(d.B):
            for h in range(Hkv):
                rec = [p for p in range(T0) if p > T0 - 1 - window]
                rest = sorted((p for p in range(T0) if p not in rec), key=lambda p: -pooled[b, h, p].item())
                keep = sorted(rec + rest[:budget - len(rec)])
                kept[layer, b, h] = keep
                score[layer, b, h] = {p: pooled[b, h, p].item() for p in keep}
    for _ in range(n_dec):
        qs, outs = d.step(1, "decode")
        a = d.seen - 1
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer], torch.arange(d.seen))
            q = rope.apply(qs[layer], torch.tensor([a]))
            mask = torch.zeros(d.B, info.num_heads, 1, d.seen, dtype=torch.bool)
            for b in range(d.B):
                for h in range(Hkv):
                    kept[layer, b, h] = kept[layer, b, h] + [a]
                    score[layer, b, h][a] = 0.0
                    mask[b, h * g:(h + 1) * g, 0, kept[layer, b, h]] = True
            ref = masked_attention(q, k, d.v[layer], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (a, layer)
            pooled = reduce(_probs(q, k.repeat_interleave(g, 1), mask, info.scaling)[:, :, 0])
            for b in range(d.B):
                for h in range(Hkv):
                    for p in kept[layer, b, h]:
                        score[layer, b, h][p] += pooled[b, h, p].item()
                    if len(kept[layer, b, h]) > budget:
                        old = [p for p in kept[layer, b, h] if p <= a - window]
                        victim = min(old, key=lambda p: score[layer, b, h][p])
                        kept[layer, b, h].remove(victim)
            S = method.store
            for b in range(d.B):
                for h in range(Hkv):
                    n = min(d.seen, budget + 1)
                    got = sorted(p for p in S.pos[layer, b, h, :n].tolist() if p >= 0)
                    full_cache = sorted(set(got) - ({int(S.pos[layer, b, h, method.free[layer, b, h]])}
                                                    if d.seen >= budget + 1 else set()))
                    assert full_cache == kept[layer, b, h], (a, layer, b, h)
