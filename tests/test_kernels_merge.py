"""Attention parts and their merge (kernels/lse.py, kernels/window.py): each part's (out, lse) against a
brute-force softmax, the merge of parts against one softmax over the union of their keys (what
InfLLM's two-stage attention must equal), garbage in unseen slots never leaking, and the Triton
kernels against the torch references in the interpreter (small shapes; real shapes in
tests/test_kernels_gpu_merge.py)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import lse as LS
from kernels import window as W

B, HQ, HKV, D = 2, 4, 2, 16


def brute(q, k, v, vis, scale):
    """q [B, Hq, T, D], k/v [B, Hkv, L, D], vis [B, Hq, T, L] -> (out, lse) with an explicit softmax."""
    g = q.shape[1] // k.shape[1]
    s = (q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2)) * scale
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ v.double().nan_to_num(0.0).repeat_interleave(g, 1)), lse


def _qkv(seed, T, L):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, T, D, generator=g)
    k = torch.randn(B, HKV, L, D, generator=g) + 0.3
    v = torch.randn(B, HKV, L, D, generator=g)
    return q, k, v


def test_merge_of_two_parts_equals_attention_over_the_union():
    q, k, v = _qkv(0, 5, 30)
    cut = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    a, b = cut[:13], cut[13:]
    full = torch.ones(B, HQ, 5, 30, dtype=torch.bool)
    want, want_lse = brute(q, k, v, full, 0.3)
    parts = []
    for idx in (a, b):
        o, l = W.window_attention_lse_ref(q, k[:, :, idx], v[:, :, idx], 0.3, torch.zeros(5, dtype=torch.long),
                                          torch.zeros(len(idx), dtype=torch.long))
        parts.append((o, l))
    out, lse = LS.merge_attention(parts)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-6)


def test_merge_ignores_empty_parts_even_with_garbage_outputs():
    q, k, v = _qkv(1, 3, 12)
    o, l = W.window_attention_lse_ref(q, k, v, 0.3, torch.zeros(3, dtype=torch.long), torch.zeros(12, dtype=torch.long))
    garbage = torch.full_like(o, float("nan"))
    out, lse = LS.merge_attention([(o, l), (garbage, torch.full_like(l, float("-inf")))])
    assert torch.equal(out, o) and torch.equal(lse, l)
    out, lse = LS.merge_attention([(garbage, torch.full_like(l, float("-inf")))] * 2)
    assert (out == 0).all() and torch.isinf(lse).all()


@pytest.mark.parametrize("dmin,dmax", [(0, 6), (7, W.FAR), (0, W.FAR), (-100, W.FAR)])
def test_window_reference_equals_brute_force(dmin, dmax, monkeypatch):
    T, L = 9, 25
    q, k, v = _qkv(2, T, L)
    qp = torch.arange(L - T, L)
    kp = torch.arange(L)
    kp[4] = 1 << 40                      # a hidden slot holding garbage
    k[:, :, 4], v[:, :, 4] = float("nan"), float("nan")
    monkeypatch.setattr(W, "REF_BLOCK_BYTES", 4 * B * HQ * L * 2)   # blocks of 2 queries: blocks really split
    d = qp.view(-1, 1) - kp.view(1, -1)
    vis = ((d >= dmin) & (d <= dmax)).expand(B, HQ, T, L)
    want, want_lse = brute(q, k.nan_to_num(0.0), v, vis, 0.25)
    out, lse = W.window_attention_lse_ref(q, k, v, 0.25, qp, kp, dmin, dmax)
    seen = torch.isfinite(want_lse)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double()[seen], want[seen], rtol=1e-5, atol=1e-6)
    assert (out[~seen] == 0).all() and torch.isinf(lse[~seen]).all()
    torch.testing.assert_close(lse.double()[seen], want_lse[seen], rtol=1e-5, atol=1e-6)
    # mass under an external normaliser: the key probabilities of the softmax whose lse is given
    ext = want_lse.float() + 0.7
    mass = W.window_mass_ref(q, k, 0.25, qp, kp, ext, dmin, dmax)
    s = (q.double() @ k.nan_to_num(0.0).double().repeat_interleave(2, 1).transpose(-1, -2)) * 0.25
    p = torch.where(vis & seen.unsqueeze(-1), torch.exp(s - ext.double().unsqueeze(-1)), 0.0)
    torch.testing.assert_close(mass.double(), p.sum(2), rtol=1e-5, atol=1e-7)


def test_decode_lse_references_equal_brute_force():
    q, k, v = _qkv(3, 1, 20)
    q1 = q[:, :, 0]
    lengths = torch.tensor([13, 0], dtype=torch.int32)
    k[0, :, 13:], v[0, :, 13:] = float("nan"), float("nan")
    out, lse = LS.decode_attention_lse_ref(q1, k, v, lengths, 0.3, 20)
    vis = (torch.arange(20) < lengths.view(B, 1, 1, 1)).expand(B, HQ, 1, 20)
    want, want_lse = brute(q, k.nan_to_num(0.0), v, vis, 0.3)
    torch.testing.assert_close(out[0].double(), want[0, :, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse[0].double(), want_lse[0, :, 0], rtol=1e-5, atol=1e-6)
    assert (out[1] == 0).all() and torch.isinf(lse[1]).all()       # an empty part
    # index sets per KV head, raw scores written at the attended slots only
    index = torch.tensor([[[2, 5, 7, 0], [1, 3, 0, 0]]] * B, dtype=torch.int32)
    counts = torch.tensor([[3, 2]] * B, dtype=torch.int32)
    scores = torch.full((B, HQ, 20), -7.0)
    out, lse = LS.sparse_decode_tokens_lse_ref(q1, k.nan_to_num(0.0), v.nan_to_num(0.0), index, counts, 0.3, scores)
    for h in range(HQ):
        sel = index[0, h // 2, :counts[0, h // 2]].long()
        vis = torch.zeros(B, HQ, 1, 20, dtype=torch.bool)
        vis[:, h, 0, sel] = True
        w, wl = brute(q, k.nan_to_num(0.0), v.nan_to_num(0.0), vis, 0.3)
        torch.testing.assert_close(out[:, h].double(), w[:, h, 0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[:, h].double(), wl[:, h, 0], rtol=1e-5, atol=1e-6)
        raw = torch.einsum("bd,bld->bl", q1[:, h].double(), k.nan_to_num(0.0)[:, h // 2].double())
        torch.testing.assert_close(scores[:, h, sel].double(), raw[:, sel], rtol=1e-5, atol=1e-6)
        untouched = torch.ones(20, dtype=torch.bool)
        untouched[sel] = False
        assert (scores[:, h, untouched] == -7.0).all()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_paths_match_references(dtype, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    T, L = 7, 40
    q, k, v = _qkv(4, T, L)
    q, k, v = q.to(DEV, dtype), k.to(DEV, dtype), v.to(DEV, dtype)
    qp, kp = torch.arange(L - T, L, device=DEV), torch.arange(L, device=DEV)
    kp[9] = 1 << 40
    k[:, :, 9], v[:, :, 9] = float("nan"), float("nan")
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    for dmin, dmax in ((0, 11), (12, W.FAR)):
        got, gl = kernels.window.window_attention_lse(q, k, v, 0.3, qp, kp, dmin, dmax)
        ref, rl = W.window_attention_lse_ref(q, k, v, 0.3, qp, kp, dmin, dmax)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.float(), ref.float(), **tol)
        torch.testing.assert_close(gl, rl, **tol)
        ext = torch.logaddexp(rl, torch.zeros_like(rl))
        torch.testing.assert_close(kernels.window.window_mass(q, k, 0.3, qp, kp, ext, dmin, dmax),
                                   W.window_mass_ref(q, k, 0.3, qp, kp, ext, dmin, dmax), **tol)
    q1 = q[:, :, 0].contiguous()
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    k[0, :, 31:], v[0, :, 31:] = float("nan"), float("nan")   # past the length: never read
    lengths = torch.tensor([31, 0], dtype=torch.int32, device=DEV)
    got, gl = LS.decode_attention_lse(q1, k, v, lengths, 0.3, max_length=L)
    ref, rl = LS.decode_attention_lse_ref(q1, k, v, lengths, 0.3, L)
    torch.testing.assert_close(got.float(), ref.float(), **tol)
    torch.testing.assert_close(gl, rl, **tol)
    index = torch.tensor([[[2, 5, 7, 30], [1, 3, 0, 39]]] * B, dtype=torch.int32, device=DEV)
    counts = torch.tensor([[4, 2], [0, 1]], dtype=torch.int32, device=DEV)
    s1 = torch.full((B, HQ, L), -7.0, device=DEV)
    s2 = s1.clone()
    got, gl = LS.sparse_decode_tokens_lse(q1, k, v, index, counts, 0.3, scores=s1)
    ref, rl = LS.sparse_decode_tokens_lse_ref(q1, k, v, index, counts, 0.3, s2)
    torch.testing.assert_close(got.float(), ref.float(), **tol)
    torch.testing.assert_close(gl, rl, **tol)
    torch.testing.assert_close(s1, s2, **tol)
