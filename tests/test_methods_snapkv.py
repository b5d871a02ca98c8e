"""SnapKV / PyramidKV oracle: on random q, k, v the prompt tokens each head keeps, and the outputs of
the prefill and of the dense decode over the kept tokens, equal a brute-force SnapKVCluster.update_kv
(window queries' softmax over the whole prompt, causal inside the window; column sums before the
window; 1-D pooling with zero padding counted; top budget - window; the window kept) and, for
PyramidKV, the per-layer sizes of KVCache-Factory's PyramidKVCluster."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


def _pool(x: torch.Tensor, k: int, how: str) -> torch.Tensor:
    """x [n]: stride-1 pooling with k // 2 zero padding on each side (avg counts the padding)."""
    n, r = x.shape[0], k // 2
    out = torch.empty(n)
    for i in range(n):
        win = [x[j] if 0 <= j < n else (0.0 if how == "avgpool" else float("-inf")) for j in range(i - r, i + r + 1)]
        out[i] = sum(win) / k if how == "avgpool" else max(win)
    return out


def _pyramid(C, w, beta, n, L, layer):
    if n < 2 * (C - w):
        return C - w
    lo = (C - w) // beta
    hi = 2 * (C - w) - lo
    if hi >= n - w:
        hi, lo = n - w, 2 * (C - w) - (n - w)
    return hi - layer * ((hi - lo) // (L - 1))


@pytest.mark.parametrize("cfg", [
    {"name": "snapkv", "budget": 12, "window": 4, "kernel": 5, "pooling": "avgpool", "heads": "query"},
    {"name": "snapkv", "budget": 10, "window": 3, "kernel": 3, "pooling": "maxpool", "heads": "kv_group"},
    {"name": "snapkv", "budget": 40, "window": 4},                       # prompt shorter: kept whole
    {"name": "pyramidkv", "budget": 14, "window": 4, "beta": 3, "heads": "query"},
    {"name": "pyramidkv", "budget": 9, "window": 2, "beta": 2, "heads": "kv_group", "pooling": "maxpool"},
])
def test_kept_tokens_and_outputs_match_brute_force(cfg):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make(cfg, model)
    g, Hkv, Hq, L = info.group, info.num_kv_heads, info.num_heads, info.num_layers
    T0, n_dec = 30, 8
    d = Driver(method, info, rope, max_len=T0 + n_dec)
    per_query = cfg.get("heads", "query") == "query"
    w, C, k_pool = cfg["window"], cfg["budget"], cfg.get("kernel", 5)

    qs, outs = d.step(T0, "prefill")
    kept = {}  # (layer, b, query head) -> kept prompt positions
    for layer in range(L):
        k = rope.apply(d.k[layer], torch.arange(T0))
        q = rope.apply(qs[layer], torch.arange(T0))
        causal = torch.ones(d.B, Hq, T0, T0, dtype=torch.bool).tril()
        assert (outs[layer] - masked_attention(q, k, d.v[layer], causal, info.scaling)).abs().max() <= 1e-5
        s = (q[:, :, -w:] @ k.repeat_interleave(g, 1).transpose(-1, -2)) * info.scaling
        p = torch.softmax(s.masked_fill(~causal[:, :, -w:], float("-inf")), -1)[..., :T0 - w].sum(2)  # [B, Hq, n]
        n_keep = C - w
        if cfg["name"] == "pyramidkv":
            n_keep = _pyramid(C, w, cfg["beta"], T0, L, layer)
        for b in range(d.B):
            pooled = torch.stack([_pool(p[b, h], k_pool, cfg.get("pooling", "avgpool")) for h in range(Hq)])
            for h in range(Hq):
                sc = pooled[h] if per_query else pooled[(h // g) * g:(h // g + 1) * g].mean(0)
                vals = sc.tolist()   # the largest first, equal scores (max pooling repeats a peak) to the lower position
                top = sorted(range(len(vals)), key=lambda i: (-vals[i], i))[:min(n_keep, T0 - w)]
                kept[layer, b, h] = list(range(T0)) if T0 < C else sorted(top) + list(range(T0 - w, T0))
        S, H = method.store, (Hq if per_query else Hkv)
        for b in range(d.B):
            for h in range(H):
                pos = kept[layer, b, h * (1 if per_query else g)]
                want = k[b, h // (g if per_query else 1), pos]
                assert torch.equal(S.k[layer, b, h, :len(pos)], want), (layer, b, h)
    for _ in range(n_dec):
        qs, outs = d.step(1, "decode")
        a = d.seen - 1
        for layer in range(L):
            k = rope.apply(d.k[layer], torch.arange(d.seen))
            q = rope.apply(qs[layer], torch.tensor([a]))
            mask = torch.zeros(d.B, Hq, 1, d.seen, dtype=torch.bool)
            for b in range(d.B):
                for h in range(Hq):
                    mask[b, h, 0, kept[layer, b, h] + list(range(T0, d.seen))] = True
            ref = masked_attention(q, k, d.v[layer], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (a, layer)
