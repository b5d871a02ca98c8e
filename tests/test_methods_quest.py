"""Quest oracle: on random q, k, v the pages chosen equal a brute-force top-k of the bound
sum_d max(q_d*kmin_d, q_d*kmax_d) recomputed from all rotated keys (so the incremental page
min/max are checked too), and the output is exact attention over those pages' tokens."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from methods.parts.stores import PageBounds

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
        n_sel = min(max(method.cfg.min_pages, method.cfg.budget // P), n)
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L))
            q = rope.apply(qs[layer], torch.tensor([L - 1]))
            if layer < 1:  # dense layer
                mask = torch.ones(d.B, info.num_heads, 1, L, dtype=torch.bool)
                assert (outs[layer] - masked_attention(q, k, d.v[layer], mask, info.scaling)).abs().max() <= 1e-5
                continue
            s = brute_scores(q, k, L)
            if method.cfg.pool == "kv_head":
                s = s.unflatten(1, (info.num_kv_heads, -1)).sum(2)
            if method.cfg.include_current_page:
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
    """Appends of every size, on bounds holding NaN from a 'previous sample': every page's min/max
    equals the one recomputed from all keys written so far."""
    B, H, D, cap = 2, 3, 8, 80
    bounds = PageBounds(P)
    bounds.allocate(1, B, H, cap, D, "cpu", torch.float32)
    bounds.kmin.fill_(float("nan"))
    bounds.kmax.fill_(float("nan"))
    keys = torch.randn(B, H, 70, D)
    start = 0
    for n in (5, 11, 1, 1, 30, 1, 21):
        bounds.update(0, keys[:, :, start:start + n], torch.full((B,), start, dtype=torch.int32))
        start += n
        for p in range(-(-start // P)):
            blk = keys[:, :, p * P:min((p + 1) * P, start)]
            assert torch.equal(bounds.kmin[0, :, :, p], blk.amin(2)) and torch.equal(bounds.kmax[0, :, :, p], blk.amax(2))


@pytest.mark.parametrize("clamp,pages", [(True, 62), (False, 63)])
def test_budget_clamped_to_context_as_the_reference(clamp, pages):
    """evaluation/quest_attention.py: token_budget = min(kv_seq_len, token_budget) before
    min(max(3, budget // 16), n_pages): budget 1024 at 1,000 tokens keeps 62 of the 63 pages (the
    partial last page counts as a page); `clamp_budget: false` keeps all 63."""
    model = tiny("llama")
    method, info = make({"name": "quest", "budget": 1024, "clamp_budget": clamp, "dense_layers": 1}, model)
    d = Driver(method, info, rope_for(model), max_len=1001, batch=1)
    d.step(999, "prefill")
    d.step(1, "decode")
    got = method.selected[1]  # page indices, -1 past each set's count
    counts = (got >= 0).sum(-1)
    assert counts.max().item() == pages and counts.min().item() == pages
    per_head = method.stats()["attended_per_head"][1]  # 1000 tokens = 62 full pages + one of 8
    assert all(x in (984, 992) for x in per_head) if clamp else all(x == 1000 for x in per_head)


@pytest.mark.parametrize("kernel_path,pages", [(True, 9), (False, 8)])
def test_kernel_path_keeps_every_page_of_a_short_context(kernel_path, pages):
    """`include_current_page: true` is the reference's kernel path (mit-han-lab/Quest, quest/models/
    QuestAttention.py: `token_budget` pages of the whole cache, no clamp to the context): at 134 tokens
    and budget 4096 it keeps all 9 pages (8 full + the current one), as that kernel does, with the
    YAML's `clamp_budget: true` left as it is. The eval path clamps the budget to the context
    (134 // 16 = 8 pages)."""
    model = tiny("llama")
    method, info = make({"name": "quest", "budget": 4096, "include_current_page": kernel_path, "dense_layers": 1},
                        model)
    d = Driver(method, info, rope_for(model), max_len=140, batch=1)
    d.step(133, "prefill")
    d.step(1, "decode")
    counts = (method.selected[1] >= 0).sum(-1)
    assert counts.min().item() == counts.max().item() == pages
    assert method.cfg.clamp_budget is True and method.cfg.describe()["budget_clamped_to_context"] is not kernel_path
