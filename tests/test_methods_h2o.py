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


@pytest.mark.parametrize("budget,recent,pool,positions", [(10, None, "sum", "original"), (9, 3, "max", "original"),
                                                          (12, 2, "mean", "original"), (9, 3, "sum", "shifted"),
                                                          (11, 4, "max", "shifted")])
def test_kept_tokens_and_outputs_match_simulation(budget, recent, pool, positions):
    """Real eviction. positions=shifted (the _streaming variant): each KV head's kept keys are rotated
    at their rank among its kept tokens and the query at the cache length, every step."""
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "h2o", "budget": budget, "recent": recent, "pool": pool, "positions": positions},
                        model)
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
            if positions == "shifted":  # rank positions per head; the query at the cache length
                k = d.k[layer].clone()
                for b in range(d.B):
                    for h in range(Hkv):
                        keep = kept[layer, b, h]
                        k[b, h, keep] = rope.apply(d.k[layer][b:b + 1, h:h + 1, keep], torch.arange(len(keep)))[0, 0]
                q = rope.apply(qs[layer], torch.tensor([len(kept[layer, 0, 0]) - 1]))
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


def _utils_hh_mask(scores: torch.Tensor, heavy: int, recent: int) -> torch.Tensor:
    """The next step's attention mask [H, n + 1] from the accumulated scores [H, n], transcribed from
    FMInference/H2O h2o_hf/utils_hh/modify_llama.py (LlamaAttention_heavy_hitter.forward), branches kept:
    with recent_budget == 0 every slot is masked (the incoming token's included) before the heavy
    hitters are switched back on."""
    attn_mask = torch.ones(scores.shape[0], scores.shape[1] + 1, dtype=torch.bool)
    if scores.shape[-1] > heavy + recent:              # attn_tokens_all > self.cache_budget
        if recent != 0:
            attn_mask[:, :-recent] = False
            selected_set = scores[:, :-recent]
        else:
            attn_mask[:, :] = False
            selected_set = scores
        if heavy != 0:
            attn_mask = attn_mask.scatter(-1, selected_set.topk(k=heavy, dim=-1, largest=True).indices, True)
    return attn_mask


def _utils_hh_score_mask(attn_mask: torch.Tensor, recent: int) -> torch.Tensor:
    """utils_hh: `score_mask = attn_mask[:, :-1]; score_mask[:, -self.recent_budget:] = 1` (for a recent
    budget of 0 the slice `-0:` is every slot: no score is zeroed)."""
    score_mask = attn_mask[:, :-1].clone()
    score_mask[:, -recent:] = True
    return score_mask


def test_simulated_recent_zero_attends_the_heavy_tokens_only():
    """Issue 36: heavy_ratio 0.3, recent_ratio 0, a 30-token prompt: utils_hh attends the 9 heavy tokens
    alone (the incoming token masked too), not all 31."""
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "h2o", "eviction": "simulated", "heavy_ratio": 0.3, "recent_ratio": 0.0}, model)
    d = Driver(method, info, rope, max_len=34)
    d.step(30, "prefill")
    d.step(1, "decode")
    assert method.stats()["attended_mean"] == 9
    for layer in range(info.num_layers):
        keep = method.keep[layer, :, :, :9]
        assert int(method.count[layer, 0]) == 9 and not (keep == 30).any()


@pytest.mark.parametrize("cfg,pool", [({"budget": 12, "recent": 5}, "sum"), ({"budget": 9, "recent": 1}, "mean"),
                                      ({"heavy_ratio": 0.2, "recent_ratio": 0.15}, "sum"),
                                      ({"heavy_ratio": 0.3, "recent_ratio": 0.0}, "sum")])
def test_simulated_mask_matches_utils_hh(cfg, pool):
    """eviction=simulated: outputs and the attended set of every step equal a transliteration of
    utils_hh's LlamaAttention_heavy_hitter bookkeeping (scores summed over query rows and accumulated,
    the next step's mask = top heavy among positions < n - recent + the last recent positions of the
    n + 1, scores outside the mask zeroed except the last recent ones), per KV head with the group pooled."""
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "h2o", "eviction": "simulated", "pool": pool, **cfg}, model)
    g, Hkv, Hq = info.group, info.num_kv_heads, info.num_heads
    T0, n_dec = 20, 14
    d = Driver(method, info, rope, max_len=T0 + n_dec)
    if "heavy_ratio" in cfg:
        heavy, recent = int(cfg["heavy_ratio"] * T0), int(cfg["recent_ratio"] * T0)
    else:
        heavy, recent = cfg["budget"] - cfg["recent"], cfg["recent"]
    prev, nxt = {}, {}  # (layer, b) -> scores [Hkv, n]; the mask for the next step [Hkv, n + 1]

    def pooled(p):  # [Hq, L] -> [Hkv, L]
        p = p.unflatten(0, (Hkv, g))
        return p.sum(1) if pool == "sum" else p.mean(1)

    for phase, T in [("prefill", T0)] + [("decode", 1)] * n_dec:
        qs, outs = d.step(T, phase)
        a0, n = d.seen - T, d.seen
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer], torch.arange(n))
            q = rope.apply(qs[layer], torch.arange(a0, n))
            mask = torch.ones(d.B, Hq, T, n, dtype=torch.bool).tril(a0)
            if phase == "decode":
                for b in range(d.B):
                    mask[b, :, 0] = nxt[layer, b].repeat_interleave(g, 0)
            ref = masked_attention(q, k, d.v[layer], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (phase, n, layer)
            s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) * info.scaling
            probs = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
            for b in range(d.B):
                cur = pooled(probs[b].sum(1))                      # [Hkv, n]
                if phase == "decode":
                    cur[:, :-1] += prev[layer, b]
                m = _utils_hh_mask(cur, heavy, recent)
                nxt[layer, b] = m
                prev[layer, b] = cur * _utils_hh_score_mask(m, recent)
                got_n = int(method.count[layer, b])
                for h in range(Hkv):
                    if n < T0 + n_dec:  # after the last step there is no next slot to attend
                        got = sorted(method.keep[layer, b, h, :got_n].tolist())
                        assert got == m[h].nonzero().flatten().tolist(), (phase, n, layer, b, h)


@pytest.mark.parametrize("heavy,recent", [(4, 3), (2, 1), (0, 3), (5, 0)])
def test_simulated_bookkeeping_matches_utils_hh(heavy, recent):
    """The mask/score bookkeeping alone, over many steps of heavy-tailed random attention (so that a
    token leaving the window does come back as a heavy hitter): the scores the method keeps, zeroed
    where utils_hh zeroes them, and its next attended set equal the reference's, step by step."""
    from methods import ModelInfo, Step

    info = ModelInfo(arch="llama", num_layers=1, num_heads=2, num_kv_heads=2, head_dim=16, hidden_size=32,
                     max_position=512)
    method, _ = make({"name": "h2o", "eviction": "simulated", "budget": heavy + max(recent, 1) + 1,
                      "recent": max(recent, 1)}, tiny("llama"))
    T0, steps = 12, 60
    method.setup(info, 1, T0 + steps, torch.device("cpu"), torch.float32)
    method.begin(Step("prefill", 0, T0, torch.arange(T0)))
    method.heavy, method.recent = heavy, recent                    # budgets as utils_hh would fix them
    method.evicts = heavy + recent < method.cap
    method.K = heavy + recent + 1 if method.evicts else method.cap
    gen = torch.Generator().manual_seed(0)
    prev, mask = None, torch.ones(2, T0, dtype=torch.bool)
    for n in range(T0, T0 + steps):
        att = torch.rand(2, n, generator=gen) ** 8 * mask[:, :n]     # what a masked softmax would give
        cur = att.clone()
        if prev is not None:
            cur[:, :-1] += prev
        method.acc[0, 0, :, :n] += att
        m = _utils_hh_mask(cur, heavy, recent)
        prev, mask = cur * _utils_hh_score_mask(m, recent), m
        method._next_keep(0, torch.tensor([n]))
        assert torch.allclose(method.acc[0, 0, :, :n], prev), n
        for h in range(2):
            got = sorted(method.keep[0, 0, h, :int(method.count[0, 0])].tolist())
            assert got == m[h].nonzero().flatten().tolist(), (n, h)
