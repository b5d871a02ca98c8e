"""Quest page metadata (incremental min/max), page scores and page top-k: Triton vs torch reference
on the CPU through Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import quest_pages as Qm

pytestmark = needs_triton


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    monkeypatch.setattr(Qm, "_empty", lambda *s, device, dtype: torch.full(
        s, float("nan") if dtype.is_floating_point else -7, device=device, dtype=dtype))


def scratch_bounds(k, lengths, P, n_pages):
    """min/max per page recomputed from the whole cache (what the incremental update must equal)."""
    B, H, _, D = k.shape
    lo = torch.full((B, H, n_pages, D), float("inf"))
    hi = torch.full((B, H, n_pages, D), float("-inf"))
    for b in range(B):
        n = int(lengths[b])
        for p in range(-(-n // P)):
            blk = k[b, :, p * P:min(n, p * P + P)].float()
            lo[b, :, p], hi[b, :, p] = blk.amin(1), blk.amax(1)
    return lo, hi


@pytest.mark.parametrize("dtype,P", [(torch.float32, 16), (torch.bfloat16, 8)])
def test_update_pages_incremental_equals_scratch(dtype, P):
    B, H, S, D, n_pages = 2, 2, 80, 64, 10
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B, H, S, D, generator=g).to(dtype)
    # stale garbage from an earlier sample: pages that start inside an append must be overwritten
    kmin = torch.full((B, H, n_pages, D), -7.0, dtype=dtype, device=DEV)
    kmax = torch.full((B, H, n_pages, D), 7.0, dtype=dtype, device=DEV)
    rmin, rmax = kmin.cpu().clone(), kmax.cpu().clone()  # the torch reference runs on the CPU inputs
    # per-sequence different prefill lengths, then single-token steps, then a chunk
    pos = torch.tensor([19, 33], dtype=torch.int32)
    steps = [("prefill", None), ("one", 1), ("one", 1), ("chunk", 21)]
    for name, t in steps:
        if name == "prefill":
            for b in range(B):  # prefill is per sequence (different lengths)
                n = int(pos[b])
                sub = (slice(b, b + 1),)
                kernels.quest_update_pages(kmin[sub], kmax[sub], k[b:b + 1, :, :n].to(DEV), 0, P)
                Qm.quest_update_pages_ref(rmin[sub], rmax[sub], k[b:b + 1, :, :n], 0, P)
            continue
        new = torch.stack([k[b, :, int(pos[b]):int(pos[b]) + t] for b in range(B)])
        kernels.quest_update_pages(kmin, kmax, new.to(DEV), pos.to(DEV), P)
        Qm.quest_update_pages_ref(rmin, rmax, new, pos, P)
        pos = pos + t
    lo, hi = scratch_bounds(k, pos, P, n_pages)
    for b in range(B):
        used = -(-int(pos[b]) // P)
        torch.testing.assert_close(kmin[b, :, :used].float().cpu(), lo[b, :, :used], rtol=0, atol=0)
        torch.testing.assert_close(kmax[b, :, :used].float().cpu(), hi[b, :, :used], rtol=0, atol=0)
        assert (kmin[b, :, used:] == -7).all()  # untouched pages stay untouched
    torch.testing.assert_close(kmin.cpu(), rmin, rtol=0, atol=0)
    torch.testing.assert_close(kmax.cpu(), rmax, rtol=0, atol=0)


@pytest.mark.parametrize("G,D,dtype", [(1, 64, torch.float32), (3, 64, torch.float32),
                                       (4, 128, torch.bfloat16), (8, 64, torch.bfloat16)])
def test_page_scores(G, D, dtype):
    B, Hkv, NP = 2, 2, 40
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, G * Hkv, D, generator=g).to(DEV, dtype)
    a = torch.randn(B, Hkv, NP, D, generator=g)
    b = torch.randn(B, Hkv, NP, D, generator=g)
    kmin, kmax = torch.minimum(a, b).to(DEV, dtype), torch.maximum(a, b).to(DEV, dtype)
    nv = torch.tensor([NP, 23], dtype=torch.int32, device=DEV)
    out = kernels.quest_page_scores(q, kmin, kmax, nv)
    ref = Qm.quest_page_scores_ref(q, kmin, kmax, nv)
    assert out.shape == (B, G * Hkv, NP) and out.dtype == torch.float32
    assert not torch.isnan(out).any()
    assert torch.isinf(out[1, :, 23:]).all() and torch.isfinite(out[1, :, :23]).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_page_scores_upper_bound_the_true_logits():
    B, Hkv, G, D, P, n = 1, 2, 4, 64, 16, 70
    q = torch.randn(B, Hkv * G, D)
    k = torch.randn(B, Hkv, n, D)
    lo, hi = scratch_bounds(k, torch.tensor([n]), P, 5)
    s = Qm.quest_page_scores_ref(q, lo, hi, 5)
    qk = torch.einsum("bhd,bhsd->bhs", q, k.repeat_interleave(G, 1))
    for p in range(5):
        assert (s[..., p] >= qk[..., p * P:min(n, p * P + P)].amax(-1) - 1e-4).all()


def test_topk_pages_forces_last_and_counts():
    B, H, NP = 2, 3, 12
    scores = torch.randn(B, H, NP, device=DEV)
    scores[0, :, 11] = -100.0  # the last page must be taken even with the worst score
    nv = torch.tensor([12, 4], dtype=torch.int32, device=DEV)
    idx, cnt = kernels.quest_topk_pages(scores, 5, nv)
    assert cnt.tolist() == [[5] * 3, [4] * 3]
    for h in range(H):
        sel = idx[0, h].tolist()
        assert 11 in sel and sel == sorted(sel)
        want = set(scores[0, h, :11].topk(4).indices.tolist()) | {11}
        assert set(sel) == want
        assert idx[1, h, :4].tolist() == [0, 1, 2, 3]
    idx, cnt = kernels.quest_topk_pages(scores, 5, nv, force_last=False)
    assert 11 not in idx[0, 0].tolist()


@pytest.mark.parametrize("force_last", [True, False])
def test_topk_pages_row_budget_equals_a_smaller_budget(force_last):
    """The row budget (Quest's clamp of the budget to a short context: at least valid pages - 1) gives
    what the plain top-k with that budget gives, per sequence: same pages, same counts."""
    g = torch.Generator().manual_seed(5)
    B, H, NP, k = 4, 3, 16, 8
    for trial in range(20):
        scores = torch.randn(B, H, NP, generator=g).to(DEV)
        nv = torch.randint(1, NP + 1, (B,), generator=g).to(DEV)
        row = torch.clamp(nv - torch.randint(0, 2, (B,), generator=g).to(DEV), min=1)  # nv or nv - 1
        row = torch.minimum(row, torch.tensor(k, device=DEV))
        idx, cnt = kernels.quest_topk_pages(scores, k, nv, force_last=force_last, row_budget=row)
        for b in range(B):
            want_i, want_c = kernels.quest_topk_pages(scores[b:b + 1], int(row[b]), nv[b:b + 1], force_last=force_last)
            n = int(want_c[0, 0])
            assert cnt[b].tolist() == want_c[0].tolist(), (trial, b)
            assert idx[b, :, :n].tolist() == want_i[0, :, :n].tolist(), (trial, b)


@pytest.mark.parametrize("K", [5, 1500])
def test_page_keep_kernel_equals_reference(K):
    """The fused keep (one program per row, in chunks of 1024) == the torch ops: kept pages, NP in
    the other slots, counts, and the row budget dropping the worst kept entry (first of tied ones)."""
    g = torch.Generator().manual_seed(K)
    B, H, NP = 3, 4, 4096
    vals = torch.randn(B, H, K, generator=g).round(decimals=1)  # ties
    vals[torch.rand(B, H, K, generator=g) < 0.3] = float("-inf")
    vals[0, 1] = float("-inf")                                     # a row with nothing kept
    idx = torch.randint(0, NP, (B, H, K), generator=g)
    vals, idx = vals.to(DEV), idx.to(DEV)
    kept = (vals != float("-inf")).sum(-1)
    for row in (None, torch.tensor([K, int(kept[1].max()) - 1, 0], device=DEV)):
        got = Qm.page_keep(vals, idx, NP, row)
        want = Qm.page_keep_ref(vals, idx, NP, row)
        assert got[0].dtype == want[0].dtype == torch.int32
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert (want[1][1] == kept[1] - 1).any()  # the budget did drop in some row


@pytest.mark.parametrize("force_last", [True, False])
def test_fused_selection_equals_scores_then_topk(force_last):
    """quest_select_pages (scores kernel with the forced page, radix top-k with the row budget as a
    per-sequence k) == quest_page_scores_ref + quest_topk_pages on the torch path: same pages, same
    counts (distinct scores: ties are the one allowed difference)."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D, NP, k = 3, 4, 2, 16, 40, 9
    for trial in range(6):
        q = torch.randn(B, Hq, D, generator=g)
        kmin = torch.randn(B, Hkv, NP, D, generator=g)
        kmax = kmin + torch.rand(B, Hkv, NP, D, generator=g)
        nv = torch.randint(1, NP + 1, (B,), generator=g).to(torch.int32)
        row = torch.clamp(torch.minimum(nv - torch.randint(0, 2, (B,), generator=g), torch.tensor(k)), min=1)
        row = row.to(torch.int32) if trial % 2 else None
        got_i, got_c = Qm.quest_select_pages(q, kmin, kmax, nv, k, force_last=force_last, row_budget=row)
        want_i, want_c = Qm.quest_topk_pages(Qm.quest_page_scores_ref(q, kmin, kmax, nv), k, nv,
                                             force_last=force_last, row_budget=row)
        assert torch.equal(got_c, want_c), trial
        live = torch.arange(got_i.shape[-1]) < got_c.unsqueeze(-1)
        assert torch.equal(torch.where(live, got_i, -1), torch.where(live, want_i, -1)), trial
