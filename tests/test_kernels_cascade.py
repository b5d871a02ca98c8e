"""Cascading KV cache kernels: the update kernel (kernels/cascade_update.py) and the strided attention with
EMA mass (kernels/cascade_attention.py), Triton against the torch references: in the CPU interpreter
on small shapes, and (`-m gpu`) at the shapes of Llama-3.1-8B with a 32K cache."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels.cascade_update import cascade_apply, cascade_apply_ref
from kernels.cascade_attention import (rotated_decode_mass, rotated_decode_mass_ref, strided_attention,
                                      strided_attention_ref)
from methods.parts.stores_cascade import CascadeLayout


def _store(B, H, slots, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, slots, D, generator=g).to(DEV, dtype), torch.randn(B, H, slots, D, generator=g).to(DEV, dtype),
            torch.rand(B, H, slots, generator=g).to(DEV), torch.randint(0, 1000, (B, H, slots), generator=g).to(DEV))


def _new(B, H, T, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g).to(DEV, dtype), torch.randn(B, H, T, D, generator=g).to(DEV, dtype),
            torch.rand(B, H, T, generator=g).to(DEV))


def _both(store, new, tok_new, plan, monkeypatch):
    """(reference result, Triton result) of one plan applied to copies of the same store."""
    a = [t.clone() for t in store]
    b = [t.clone() for t in store]
    cascade_apply_ref(*a, *new, tok_new, plan)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    cascade_apply(*b, *new, tok_new, plan)
    monkeypatch.delenv("HARNESS_KERNELS")
    return a, b


@needs_triton
def test_apply_kernel_matches_reference_on_chunk_and_decode_plans(monkeypatch):
    B, H, D = 2, 2, 16
    L = CascadeLayout(2, 3, 4)
    L.prepare(DEV)
    store = _store(B, H, L.slots, D, 0)
    seed = 1
    for T in (7, 20, 1, 13):                            # chunk plans through and past the eager fill
        new = _new(B, H, T, D, seed)
        tok_new = torch.arange(L.n_seen, L.n_seen + T, device=DEV)
        plan = L.chunk_plan(T, True, DEV)
        a, b = _both(store, new, tok_new, plan, monkeypatch)
        assert plan.n_merge > 0 or T < 13
        for x, y in zip(a, b):
            assert torch.equal(x, y)
        store, seed = a, seed + 1
    ctr = torch.tensor([L.stored, L.start], device=DEV)
    for _ in range(9):                                  # device-built decode plans
        p = torch.tensor([L.n_seen], device=DEV)
        plan, _, _, ctr_new = L.device_step(ctr, p, True)
        new = _new(B, H, 1, D, seed)
        a, b = _both(store, new, p, plan, monkeypatch)
        for x, y in zip(a, b):
            assert torch.equal(x, y)
        store, ctr, seed = a, ctr_new, seed + 1
        L.n_seen += 1


def test_decode_plan_equals_chunk_plan_of_one_token():
    """The device-built decode plan, positions and counters equal the host chunk plan of one token."""
    B, H, D = 1, 2, 16
    host, dev = CascadeLayout(3, 3, 2), CascadeLayout(3, 3, 2)
    dev.prepare(DEV)
    s1 = _store(B, H, host.slots, D, 5)
    s2 = [t.clone() for t in s1]
    ctr = torch.zeros(2, 3, dtype=torch.long, device=DEV)
    for t in range(30):
        new = _new(B, H, 1, D, 100 + t)
        p = torch.tensor([t], device=DEV)
        n, before = host.n_filled, host.positions()
        cascade_apply_ref(*s1, *new, p, host.chunk_plan(1, True, DEV))
        plan, icp, n_filled, ctr = dev.device_step(ctr, p, True)
        assert int(n_filled) == n and icp[:n].tolist() == before[:n] and int(icp[n]) == n
        cascade_apply_ref(*s2, *new, p, plan)
        assert ctr.tolist() == [host.stored, host.start]
        for x, y in zip(s1, s2):                       # the decode plan also scribbles on the trash slot
            assert torch.equal(x[:, :, :host.trash], y[:, :, :host.trash]), t


@needs_triton
@pytest.mark.parametrize("T,L,dtype", [(13, 29, torch.float32), (16, 16, torch.float32), (9, 40, torch.bfloat16)])
def test_strided_attention_kernel_matches_reference(T, L, dtype, monkeypatch):
    g = torch.Generator().manual_seed(T + L)
    B, Hq, Hkv, D = 2, 4, 2, 16
    q = torch.randn(B, Hq, T, D, generator=g).to(DEV, dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(DEV, dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(DEV, dtype)
    w = torch.rand(T, generator=g).to(DEV)
    ref_out, ref_mass = strided_attention_ref(q, k, v, 0.25, w)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    out, mass = strided_attention(q, k, v, 0.25, w)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.float(), ref_out.float(), **tol)
    torch.testing.assert_close(mass, ref_mass, **tol)


def _rot_inputs(B, Hq, Hkv, S, D, dtype, seed, dev=DEV):
    """Queries, a cache with NaN garbage past each length, and a RoPE table at scattered positions."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, D, generator=g).to(dev, dtype)
    k = torch.randn(B, Hkv, S + 5, D, generator=g).to(dev, dtype)
    v = torch.randn(B, Hkv, S + 5, D, generator=g).to(dev, dtype)
    lengths = torch.tensor([S, S - 7][:B], dtype=torch.int32, device=dev)
    for b, n in enumerate(lengths.tolist()):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    pos = torch.randint(0, 5000, (S + 5,), generator=g).double()
    inv = 10000.0 ** (-torch.arange(0, D, 2).double() / D)
    ang = torch.cat([pos[:, None] * inv] * 2, -1)
    return q, k, v, ang.cos()[None].to(dev, dtype), ang.sin()[None].to(dev, dtype), lengths


@needs_triton
@pytest.mark.parametrize("S,dtype", [(37, torch.float32), (64, torch.bfloat16)])
def test_rotated_decode_kernel_matches_rotate_then_attend(S, dtype, monkeypatch):
    q, k, v, cos, sin, lengths = _rot_inputs(2, 4, 2, S, 16, dtype, seed=S)
    ref_out, ref_p = rotated_decode_mass_ref(q, k, v, cos, sin, lengths, 0.25, S)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    out, p = rotated_decode_mass(q, k, v, cos, sin, lengths, 0.25, max_length=S)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.float(), ref_out.float(), **tol)
    torch.testing.assert_close(p, ref_p, **tol)
    assert torch.equal(p[1, :, S - 7:], torch.zeros_like(p[1, :, S - 7:]))   # past the length: probability 0
    # the rotation matters: un-rotated keys give other probabilities
    assert not torch.allclose(p, kernels.decode_attention_mass(q, k[:, :, :S], v[:, :, :S], lengths, 0.25,
                                                                max_length=S)[1].nan_to_num(0), atol=1e-3)


# --- real shapes on the GPU ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T,L", [(4096, 4096 + 32832), (1024, 1024 + 2112)])
def test_strided_attention_real_shapes(T, L):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 32, T, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, L, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 8, L, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    beta = 0.9999999
    w = ((1 - beta) * beta ** torch.arange(T - 1, -1, -1, dtype=torch.float64)).float().cuda()
    out, mass = strided_attention(q, k, v, 128 ** -0.5, w)
    ref_out, ref_mass = strided_attention_ref(q, k, v, 128 ** -0.5, w)
    assert (out.float() - ref_out.float()).abs().max().item() < 2e-2
    assert ((mass - ref_mass).abs().max() / ref_mass.abs().max()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("W,T", [(8192, 4096), (512, 4096)])
def test_apply_kernel_real_shapes(W, T):
    L = CascadeLayout(64, 4, W)
    L.prepare("cuda")
    store = [t.cuda() for t in _store(1, 8, L.slots, 128, 0, torch.bfloat16)]
    for step in range(4 * W * 4 // T + 2):
        new = [t.cuda() for t in _new(1, 8, T, 128, step + 1, torch.bfloat16)]
        tok_new = torch.arange(L.n_seen, L.n_seen + T, device="cuda")
        plan = L.chunk_plan(T, True, "cuda")
        a = [t.clone() for t in store]
        cascade_apply_ref(*a, *new, tok_new, plan)
        cascade_apply(*store, *new, tok_new, plan)
        for x, y in zip(a, store):
            assert torch.equal(x, y), step



@pytest.mark.parametrize("S,N,W,selection", [(2, 3, 4, True), (0, 1, 5, True), (3, 4, 2, False), (1, 5, 3, True),
                                             (4, 2, 8, True)])
def test_level_builder_equals_token_loop(S, N, W, selection):
    """The cascade-by-cascade plan and the reference's token-by-token plan move the same items, over
    random chunk lengths through and far past the eager fill (merge scores random)."""
    g = torch.Generator().manual_seed(S * 100 + N * 10 + W)
    B, H, D = 1, 3, 16
    fast, slow = CascadeLayout(S, N, W), CascadeLayout(S, N, W)
    a = _store(B, H, fast.slots, D, 7)
    b = [t.clone() for t in a]
    for step in range(40):
        T = int(torch.randint(1, 3 * N * W, (1,), generator=g))
        new = _new(B, H, T, D, 1000 + step)
        tok_new = torch.arange(fast.n_seen, fast.n_seen + T, device=DEV)
        cascade_apply_ref(*a, *new, tok_new, fast.chunk_plan(T, selection, DEV))
        cascade_apply_ref(*b, *new, tok_new, slow.chunk_plan(T, selection, DEV, by_token=True))
        assert (fast.stored, fast.start, fast.n_seen) == (slow.stored, slow.start, slow.n_seen)
        for x, y in zip(a, b):
            assert torch.equal(x, y), step


@pytest.mark.parametrize("T,L", [(13, 29), (16, 16), (1, 40)])
def test_strided_attention_reference_equals_kit_ops(T, L):
    """The one-pass reference = the kit's SDPA attention + blockwise attention mass (small query blocks)."""
    from kernels.prefill import attention_mass_ref, prefill_attention

    g = torch.Generator().manual_seed(T * L)
    q, k, v = torch.randn(2, 4, T, 16, generator=g), torch.randn(2, 2, L, 16, generator=g), torch.randn(2, 2, L, 16, generator=g)
    w = torch.rand(T, generator=g)
    out, mass = strided_attention_ref(q, k, v, 0.3, w, block_bytes=2 * 4 * L * 4 * 3)   # 3 queries per block
    torch.testing.assert_close(out, prefill_attention(q, k, v, 0.3), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mass, attention_mass_ref(q, k, 0.3, weights=w), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rotated_decode_real_shapes():
    q, k, v, cos, sin, lengths = _rot_inputs(1, 32, 8, 32832, 128, torch.bfloat16, seed=0, dev="cuda")
    ref_out, ref_p = rotated_decode_mass_ref(q, k, v, cos, sin, lengths, 128 ** -0.5, 32832)
    out, p = rotated_decode_mass(q, k, v, cos, sin, lengths, 128 ** -0.5, max_length=32832)
    assert (out.float() - ref_out.float()).abs().max().item() < 2e-2
    assert (p - ref_p).abs().max().item() < 1e-3
