"""Multi-token attention and the blockwise attention mass (kernels/prefill.py): the torch reference
against a brute-force [T, L] softmax, the Triton kernels against the reference (CPU interpreter,
small shapes; real shapes in tests/test_kernels_gpu.py), and garbage in hidden slots never leaking.
Also: every decode reference masks slots nothing wrote (NaN in a torch.empty slot must not leak
through `probability 0 x value`)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import attention as A, prefill as P


def brute_mass(q, k, scale, q_pos, k_pos, w):
    g = q.shape[1] // k.shape[1]
    s = (q.float() @ k.float().repeat_interleave(g, 1).transpose(-1, -2)) * scale
    vis = k_pos.view(1, -1) <= q_pos.view(-1, 1)
    p = torch.softmax(s.masked_fill(~vis, float("-inf")), -1).nan_to_num(0.0)
    return (p * w.view(1, 1, -1, 1)).sum(2)


def _case(seed, B=2, Hq=4, Hkv=2, T=13, L=29, D=16, hidden=()):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=g)
    k = torch.randn(B, Hkv, L, D, generator=g)
    k_pos = torch.arange(L)
    for h in hidden:
        k_pos[h] = 1 << 40
        k[:, :, h] = float("nan")   # a slot no query sees may hold anything
    q_pos = torch.arange(L - T, L)
    w = torch.rand(T, generator=g)
    return q, k, q_pos, k_pos, w


@pytest.mark.parametrize("hidden", [(), (3, 17)])
def test_mass_reference_equals_brute_force(hidden, monkeypatch):
    q, k, qp, kp, w = _case(0, hidden=hidden)
    monkeypatch.setattr(P, "REF_BLOCK_BYTES", 4 * 2 * 4 * 29 * 3)  # 3 queries per block: blocks really split
    got = P.attention_mass_ref(q, k, 0.25, qp, kp, w)
    want = brute_mass(q, k.nan_to_num(0.0), 0.25, qp, kp, w)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    default = P.attention_mass_ref(q, k.nan_to_num(0.0), 0.25)  # no positions: lower-right causal, weight 1
    torch.testing.assert_close(default, brute_mass(q, k.nan_to_num(0.0), 0.25, qp, torch.arange(29), torch.ones(13)),
                               rtol=1e-5, atol=1e-6)


@needs_triton
@pytest.mark.parametrize("hidden,weighted,dtype", [((), False, torch.float32), ((3, 17), True, torch.float32),
                                                   ((5,), True, torch.bfloat16)])
def test_mass_kernel_matches_reference(hidden, weighted, dtype, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    q, k, qp, kp, w = _case(1, hidden=hidden)
    q, k = q.to(DEV, dtype), k.to(DEV, dtype)
    w = w.to(DEV) if weighted else None
    got = kernels.attention_mass(q, k, 0.25, qp.to(DEV), kp.to(DEV), w)
    ref = P.attention_mass_ref(q, k, 0.25, qp.to(DEV), kp.to(DEV), w)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, rtol=2e-2 if dtype == torch.bfloat16 else 1e-4,
                               atol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_prefill_attention_positions_equal_lower_right():
    q, k, qp, kp, _ = _case(2)
    v = torch.randn_like(k)
    a = P.prefill_attention(q, k, v, 0.25)
    b = P.prefill_attention(q, k, v, 0.25, q_pos=qp, k_pos=kp)
    torch.testing.assert_close(a, b)


def test_decode_references_never_read_unwritten_slots():
    """Slots at or past the length, and padding entries of index sets, hold NaN: every reference
    returns the same as on clean data."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, S, D = 2, 4, 2, 40, 16
    q = torch.randn(B, Hq, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    lengths = torch.tensor([23, 31], dtype=torch.int32)
    dirty_k, dirty_v = k.clone(), v.clone()
    for b, n in enumerate(lengths.tolist()):
        dirty_k[b, :, n:], dirty_v[b, :, n:] = float("nan"), float("nan")
    clean = A.decode_attention_ref(q, k, v, lengths, 0.3, S)
    dirty = A.decode_attention_ref(q, dirty_k, dirty_v, lengths, 0.3, S)
    assert torch.isfinite(dirty).all() and torch.equal(clean, dirty)
    out, probs = kernels.decode_attention_mass(q, dirty_k, dirty_v, lengths, 0.3, max_length=S)
    assert torch.equal(out, clean) and torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(B, Hq))
    assert (probs[0, :, 23:] == 0).all()
    # index sets whose padding points at unwritten slots
    index = torch.randint(0, 20, (B, Hq, 8), generator=g, dtype=torch.int32)
    index[..., 6:] = 35
    counts = torch.full((B, Hq), 6, dtype=torch.int32)
    assert torch.equal(A.sparse_decode_tokens_ref(q, k, v, index, counts, 0.3),
                       A.sparse_decode_tokens_ref(q, dirty_k, dirty_v, index, counts, 0.3))
    pages = torch.tensor([[[0, 5, 9]] * Hq] * B, dtype=torch.int32)  # page 9 lies past both lengths
    pc = torch.full((B, Hq), 2, dtype=torch.int32)
    assert torch.equal(A.sparse_decode_pages_ref(q, k, v, pages, pc, 4, lengths, 0.3),
                       A.sparse_decode_pages_ref(q, dirty_k, dirty_v, pages, pc, 4, lengths, 0.3))
