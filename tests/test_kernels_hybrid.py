"""Hybrid-head decode and retrieval-score kernels (kernels/hybrid_triton.py) against their torch
references: in Triton's interpreter on small shapes (CPU), and at the Llama-3-8B shape on the GPU
(`-m gpu`). Mixed, all-retrieval and all-sparse layers; token and block (page) index sets; lengths
that are not multiples of anything; NaN in every slot nothing wrote and in every kernel buffer."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import hybrid as H

pytestmark = needs_triton


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    from kernels import hybrid_triton as HT

    nan = lambda *s, device, dtype: torch.full(s, float("nan"), device=device, dtype=dtype)
    monkeypatch.setattr(HT, "_empty", nan)


def rel(a, b):
    assert torch.isfinite(a).all(), "unwritten (NaN) or non-finite output"
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def case(B, G, Hkv, S, D, lens, dtype, seed, n_idx, page=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, G * Hkv, D, generator=g)
    k = torch.randn(B, Hkv, S, D, generator=g) + 0.3
    v = torch.randn(B, Hkv, S, D, generator=g)
    lengths = torch.tensor(lens, dtype=torch.int32)
    for b, n in enumerate(lens):  # slots nothing wrote hold NaN: every reader must mask them
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    index = torch.zeros(B, Hkv, n_idx, dtype=torch.int32)
    counts = torch.zeros(B, Hkv, dtype=torch.int32)
    for b, n in enumerate(lens):
        units = -(-n // page)
        for h in range(Hkv):
            c = int(torch.randint(1, min(n_idx, units) + 1, (1,), generator=g))
            index[b, h, :c] = torch.randperm(units, generator=g)[:c].sort().values
            index[b, h, c:] = 12345  # padding: never read
            counts[b, h] = c
    return [t.to(DEV) for t in (q.to(dtype), k.to(dtype), v.to(dtype), lengths, index, counts)]


ROLES = [(True, False, True, False), (True, True, True, True), (False, False, False, False), (False, True, False, False)]


@pytest.mark.parametrize("roles", ROLES)
@pytest.mark.parametrize("page,dtype", [(1, torch.float32), (4, torch.float32), (1, torch.bfloat16)])
@pytest.mark.parametrize("chunk", [None, 32])
def test_hybrid_decode_matches_reference(roles, page, dtype, chunk):
    q, k, v, lengths, index, counts = case(2, 2, 4, 120, 32, [77, 118], dtype, seed=len(roles) + page, n_idx=9,
                                           page=page)
    ret = torch.tensor(roles, device=DEV)
    all_ret = all(roles)
    got = H.hybrid_decode(q, k, v, lengths, ret, None if all_ret else index, None if all_ret else counts, 0.2,
                          max_length=120, page=page, roles=roles, chunk=chunk)
    if page > 1:
        from kernels.attention import decode_attention_ref, sparse_decode_pages_ref
        rq = ret.repeat_interleave(2).view(1, -1, 1)
        want = torch.where(rq, decode_attention_ref(q, k, v, lengths, 0.2),
                           sparse_decode_pages_ref(q, k, v, index, counts, page, lengths, 0.2))
    else:
        want = H.hybrid_decode_ref(q, k, v, lengths, ret, None if all_ret else index, None if all_ret else counts, 0.2)
    assert got.dtype == dtype
    assert rel(got, want) < (2e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("roles", [ROLES[0], ROLES[1], ROLES[3]])
@pytest.mark.parametrize("pool,dtype", [(1, torch.float32), (4, torch.float32), (64, torch.float32),
                                        (4, torch.bfloat16)])
@pytest.mark.parametrize("chunk", [None, 64])
def test_hybrid_decode_fused_scores(roles, pool, dtype, chunk):
    """The attention kernel's own selection scores (score_heads) equal retrieval_scores_ref, -inf past
    each length, including the splits that start past a length; the output is unchanged."""
    q, k, v, lengths, index, counts = case(2, 3, 4, 150, 32, [77, 141], dtype, seed=pool, n_idx=9, page=pool)
    ret = torch.tensor(roles, device=DEV)
    heads = torch.nonzero(ret).flatten()
    all_ret = all(roles)
    args = (q, k, v, lengths, ret, None if all_ret else index, None if all_ret else counts, 0.2)
    out, scores = H.hybrid_decode(*args, max_length=150, page=pool, roles=roles, chunk=chunk, score_heads=heads,
                                  score_block=pool)
    plain = H.hybrid_decode(*args, max_length=150, page=pool, roles=roles, chunk=chunk)
    assert rel(out, plain) < (1e-6 if dtype == torch.float32 else 1e-2)  # pool 64 > the CPU tile: other tiling
    want = H.retrieval_scores_ref(q, k, lengths, heads, 150, pool)
    if DEV == "cpu":  # the reference spans the longest length off CUDA (kernels.attention._span)
        want = torch.nn.functional.pad(want, (0, scores.shape[-1] - want.shape[-1]), value=float("-inf"))
    assert scores.shape == want.shape == (2, len(heads), -(-150 // pool))
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(scores)) and (scores[~fin] == float("-inf")).all()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(scores[fin], want[fin], atol=tol * 10, rtol=tol)


@pytest.mark.parametrize("roles", [ROLES[0], ROLES[1]])
@pytest.mark.parametrize("sink,recent,only", [(4, 9, False), (0, 30, False), (50, 0, False), (3, 6, True),
                                              (200, 200, False)])
@pytest.mark.parametrize("chunk", [None, 64])
def test_hybrid_decode_forced_scores(roles, sink, recent, only, chunk, monkeypatch):
    """score_force: the kernel's token scores are retrieval_scores_ref's with the first `sink` and last
    `recent` slots below each length at +inf (only: everything else -inf), i.e. force_scores_ref, and the
    same boost LycheeDecode applied after the kernel before (lychee_sets.forced + masked_fill); the
    output is unchanged. Sinks/recent overlapping and covering the whole length included."""
    from methods.parts import lychee_sets

    q, k, v, lengths, index, counts = case(2, 2, 4, 150, 32, [77, 141], torch.float32, seed=sink + recent,
                                           n_idx=9)
    ret = torch.tensor(roles, device=DEV)
    heads = torch.nonzero(ret).flatten()
    all_ret = all(roles)
    args = (q, k, v, lengths, ret, None if all_ret else index, None if all_ret else counts, 0.2)
    out, scores = H.hybrid_decode(*args, max_length=150, roles=roles, chunk=chunk, score_heads=heads,
                                  score_force=(sink, recent, only))
    plain, raw = H.hybrid_decode(*args, max_length=150, roles=roles, chunk=chunk, score_heads=heads)
    assert rel(out, plain) < 1e-6
    want = H.force_scores_ref(raw, lengths, sink, recent, only)
    old = raw.masked_fill(lychee_sets.forced(raw, lengths, sink, recent), float("inf"))
    if only:
        old = old.masked_fill(~torch.isposinf(old), float("-inf"))
    assert torch.equal(want, old)
    fin = torch.isfinite(want)
    assert torch.equal(scores[~fin], want[~fin]) and torch.isposinf(scores).sum() > 0
    torch.testing.assert_close(scores[fin], want[fin], atol=1e-3, rtol=1e-4)
    # the torch path (the CPU's accuracy runs) applies the same force to its reference scores
    monkeypatch.setenv("HARNESS_KERNELS", "torch")
    cpu = [a.cpu() if torch.is_tensor(a) else a for a in args]
    _, ref_scores = H.hybrid_decode(*cpu, max_length=150, score_heads=heads.cpu(), score_force=(sink, recent, only))
    n = ref_scores.shape[-1]   # the reference spans the longest length off CUDA
    assert torch.equal(torch.isfinite(ref_scores), fin[..., :n].cpu())
    assert torch.equal(torch.isposinf(ref_scores), torch.isposinf(want[..., :n]).cpu())


def test_hybrid_plan_balances_work():
    from kernels.hybrid_triton import plan

    ch, nf, ns = plan(n_ret=1, n_sparse=7, slots_full=131072, slots_sparse=4096, batch=1, block=64, sms=132,
                      programs_per_sm=4.0)
    assert nf * ch >= 131072 and ns * ch >= 4096 and ch % 64 == 0
    assert abs(nf * ch / 131072 - 1) < 0.1 and nf > 8 * ns  # full heads get proportionally more splits


@pytest.mark.parametrize("pool", [1, 4, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_retrieval_scores_match_reference(pool, dtype):
    q, k, _, lengths, _, _ = case(2, 3, 3, 100, 32, [61, 100], dtype, seed=pool, n_idx=4)
    heads = torch.tensor([2, 0], device=DEV)
    got = H.retrieval_scores(q, k, lengths, heads, max_length=100, block=pool)
    want = H.retrieval_scores_ref(q, k, lengths, heads, 100, pool)
    if DEV == "cpu":
        want = torch.nn.functional.pad(want, (0, got.shape[-1] - want.shape[-1]), value=float("-inf"))
    assert got.shape == want.shape
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got[fin], want[fin], atol=tol * 10, rtol=tol)


# --- real shapes on the GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("B,S,n_ret", [(1, 131072, 1), (8, 32768, 1), (4, 131072, 4), (2, 65536, 8)])
@pytest.mark.parametrize("page", [1, 64])
def test_hybrid_decode_llama3_shape(B, S, n_ret, page):
    HQ, HKV, D = 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(B + S)
    q = torch.randn(B, HQ, D, device="cuda", generator=g).bfloat16()
    k = (torch.randn(B, HKV, S, D, device="cuda", generator=g) + 0.5).bfloat16()
    v = torch.randn(B, HKV, S, D, device="cuda", generator=g).bfloat16()
    lengths = torch.randint(S // 2, S + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    n_idx = 4096 // page
    index = torch.stack([torch.randperm(S // 2 // page, device="cuda", generator=g)[:n_idx].sort().values
                         for _ in range(B * HKV)]).view(B, HKV, n_idx).int()
    counts = torch.full((B, HKV), n_idx, device="cuda", dtype=torch.int32)
    roles = tuple(h < n_ret for h in range(HKV))
    ret = torch.tensor(roles, device="cuda")
    got = H.hybrid_decode(q, k, v, lengths, ret, index, counts, D ** -0.5, max_length=S, page=page, roles=roles)
    from kernels.attention import decode_attention_ref, sparse_decode_pages_ref
    dense = decode_attention_ref(q, k, v, lengths, D ** -0.5, S)
    sparse = (H.hybrid_decode_ref(q, k, v, lengths, torch.zeros_like(ret), index, counts, D ** -0.5, S) if page == 1
              else sparse_decode_pages_ref(q, k, v, index, counts, page, lengths, D ** -0.5))
    want = torch.where(ret.repeat_interleave(4).view(1, -1, 1), dense, sparse)
    assert rel(got, want) < 1e-2
    heads = torch.arange(n_ret, device="cuda")
    ref = H.retrieval_scores_ref(q, k, lengths, heads, S, page)
    fin = torch.isfinite(ref)
    fused_out, fused = H.hybrid_decode(q, k, v, lengths, ret, index, counts, D ** -0.5, max_length=S, page=page,
                                       roles=roles, score_heads=heads, score_block=page)
    assert rel(fused_out, got) < 1e-3
    for scores in (H.retrieval_scores(q, k, lengths, heads, max_length=S, block=page), fused):
        assert torch.equal(fin, torch.isfinite(scores))
        torch.testing.assert_close(scores[fin], ref[fin], atol=0.5, rtol=2e-2)
    if page == 1:   # LycheeDecode's forced sinks/recent written by the kernel: the same as boosting its scores
        _, forced = H.hybrid_decode(q, k, v, lengths, ret, index, counts, D ** -0.5, max_length=S, roles=roles,
                                    score_heads=heads, score_force=(128, 256, False))
        want = H.force_scores_ref(fused, lengths, 128, 256)
        wfin = torch.isfinite(want)
        assert torch.equal(forced[~wfin], want[~wfin]) and torch.equal(wfin, torch.isfinite(forced))
        torch.testing.assert_close(forced[wfin], want[wfin], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("T,L,sink,recent,block", [(40, 40, 3, 5, 8), (23, 61, 0, 7, 5), (30, 50, 4, 40, 16),
                                                   (17, 17, 2, 0, 4)])
def test_streaming_prefill_reads_only_visible_keys_and_equals_the_full_mask(T, L, sink, recent, block):
    """DuoAttention's Λ prefill, per block over only the sinks and the block's window span, equals SDPA
    with the [T, L] mask over every key (the previous implementation) for retrieval and streaming heads."""
    g = torch.Generator().manual_seed(T * L)
    B, Hkv, G, D = 2, 3, 2, 16
    q = torch.randn(B, Hkv * G, T, D, generator=g)
    k, v = (torch.randn(B, Hkv, L, D, generator=g) for _ in range(2))
    retrieval = [True, False, False]
    got = H.streaming_prefill_attention(q, k, v, 0.25, retrieval, sink, recent, block=block)
    kpos = torch.arange(L)
    qpos = torch.arange(L - T, L).view(-1, 1)
    lam = (kpos <= qpos) & ((kpos < sink) | (kpos >= qpos - recent))
    want = []
    for h in range(Hkv * G):
        mask = (kpos <= qpos) if retrieval[h // G] else lam
        want.append(torch.nn.functional.scaled_dot_product_attention(q[:, h:h + 1], k[:, h // G:h // G + 1],
                                                                     v[:, h // G:h // G + 1], attn_mask=mask, scale=0.25))
    want = torch.cat(want, 1).transpose(1, 2).reshape(B, T, -1)
    assert (got - want).abs().max().item() <= 1e-5
