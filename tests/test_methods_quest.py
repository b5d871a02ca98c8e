"""Quest oracle: on random q, k, v the pages chosen equal a brute-force top-k of the bound
sum_d max(q_d*kmin_d, q_d*kmax_d) recomputed from all rotated keys (so the incremental page
min/max are checked too), and the output is exact attention over those pages' tokens."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from methods.stores import FullStore, PageBounds

P = 16


def brute_scores(q: torch.Tensor, k: torch.Tensor, L: int) -> torch.Tensor:
    """q [B, Hq, 1, D] rotated, k [B, Hkv, L, D] rotated -> bounds [B, Hq, n_pages] (literal formula)."""
    n = -(-L // P)
    g = q.shape[1] // k.shape[1]
    pad = n * P - L
    kmin = torch.cat([k, k.new_full((*k.shape[:2], pad, k.shape[3]), float("inf"))], 2)
    kmax = torch.cat([k, k.new_full((*k.shape[:2], pad, k.shape[3]), float("-inf"))], 2)
    kmin = kmin.unflatten(2, (n, P)).amin(3).repeat_interleave(g, 1)  # [B, Hq, n, D]
    kmax = kmax.unflatten(2, (n, P)).amax(3).repeat_interleave(g, 1)
    qq = q[:, :, 0].unsqueeze(2)  # [B, Hq, 1, D]
    return torch.maximum(qq * kmin, qq * kmax).sum(-1)


@pytest.mark.parametrize("cfg", [
    {"budget": 32},                                                    # 2 pages -> floor of 3
    {"budget": 40, "pool": "kv_head"},
    {"budget": 48, "include_current_page": True, "min_pages": 1},
])
def test_pages_match_brute_force_bounds(cfg):
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make({"name": "quest", "dense_layers": 1, **cfg}, model)
    d = Driver(method, info, rope, max_len=100)
    d.step(20, "prefill")
    d.step(57, "prefill")  # chunked dense prefill: a page filled across two appends
    for _ in range(14):    # crosses the page boundary at 80; 3 of 5-6 pages chosen
        qs, outs = d.step(1, "decode")
        L = d.seen
        n = -(-L // P)
        n_sel = min(max(method.min_pages, method.budget // P), n)
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L))
            q = rope.apply(qs[layer], torch.tensor([L - 1]))
            if layer < 1:  # dense layer
                mask = torch.ones(d.B, info.num_heads, 1, L, dtype=torch.bool)
                assert (outs[layer] - masked_attention(q, k, d.v[layer], mask, info.scaling)).abs().max() <= 1e-5
                continue
            s = brute_scores(q, k, L)
            if method.pool == "kv_head":
                s = s.unflatten(1, (info.num_kv_heads, -1)).sum(2)
            if method.include_current:
                s[..., n - 1] = float("inf")
            want = s.topk(n_sel, -1).indices.sort(-1).values
            got = method.selected[layer].sort(-1).values
            assert torch.equal(got, want), (L, layer)
            # exact attention over exactly those pages' tokens (the partial current page masked)
            tok_page = torch.arange(L) // P
            chosen = (tok_page.view(1, 1, 1, L) == got.unsqueeze(-1)).any(2)  # [B, H, L]
            heads = chosen.repeat_interleave(info.group, 1) if chosen.shape[1] != info.num_heads else chosen
            ref = masked_attention(q, k, d.v[layer], heads.unsqueeze(2), info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5
            per_head = method.stats()["attended_per_head"][layer]
            assert per_head == [round(float(x), 2) for x in chosen.sum(-1).float().mean(0)]  # per set


def test_page_bounds_incremental_equal_recomputed():
    B, H, D, cap = 2, 3, 8, 80
    store, bounds = FullStore(), PageBounds(P)
    store.allocate(1, B, H, cap, D, "cpu", torch.float32)
    store.k.fill_(float("nan"))  # stale contents past the written length must never leak in
    bounds.allocate(1, B, H, cap, D, "cpu", torch.float32)
    keys = torch.randn(B, H, 70, D)
    start = 0
    for n in (5, 11, 1, 1, 30, 1, 21):
        store.write(0, start, keys[:, :, start:start + n], keys[:, :, start:start + n])
        bounds.update(0, store.k[0], start, start + n)
        start += n
        kmin, kmax = bounds.view(0, start)
        for p in range(kmin.shape[2]):
            blk = keys[:, :, p * P:min((p + 1) * P, start)]
            assert torch.equal(kmin[:, :, p], blk.amin(2)) and torch.equal(kmax[:, :, p], blk.amax(2))
