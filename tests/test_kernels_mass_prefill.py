"""H2O's prefill kernel (kernels/mass_prefill.py): the causal attention and every key's column sum of the
softmax, against the torch reference (SDPA + kernels.prefill's attention_mass_ref), in Triton's
interpreter on small shapes (CPU: the row-lse pass) and on the GPU (`-m gpu`: the flash op's lse at the
Llama-3-8B shape, and the chunked case)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import mass_prefill as MP

SCALE = 0.3


def qkv(B, Hq, Hkv, T, L, D, seed, dtype=torch.float32, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(device=device, dtype=dtype)
            for s in ((B, Hq, T, D), (B, Hkv, L, D), (B, Hkv, L, D))]


def brute_mass(q, k):
    """Column sums of the lower-right causal softmax, one row at a time in float64."""
    B, Hq, T, _ = q.shape
    L, g = k.shape[2], Hq // k.shape[1]
    out = torch.zeros(B, Hq, L, dtype=torch.float64)
    for h in range(Hq):
        for t in range(T):
            n = t + L - T + 1
            s = (q[:, h, t].double()[:, None, :] * k[:, h // g, :n].double()).sum(-1) * SCALE
            out[:, h, :n] += torch.softmax(s, -1)
    return out


@needs_triton
@pytest.mark.parametrize("B,Hq,Hkv,T,L", [(1, 2, 2, 40, 40), (2, 4, 2, 37, 37), (1, 4, 1, 21, 50), (1, 2, 1, 1, 33)])
def test_mass_equals_reference(B, Hq, Hkv, T, L, monkeypatch):
    q, k, v = qkv(B, Hq, Hkv, T, L, 16, seed=T + L)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    out, mass = kernels.causal_attention_mass(q, k, v, SCALE)
    monkeypatch.setenv("HARNESS_KERNELS", "torch")
    ref_out, ref_mass = kernels.causal_attention_mass(q, k, v, SCALE)
    assert (mass - ref_mass).abs().max().item() < 1e-4
    assert (out - ref_out).abs().max().item() < 1e-5
    assert torch.allclose(ref_mass.double().cpu(), brute_mass(q.cpu(), k.cpu()), atol=1e-4)
    # each row's probabilities sum to 1: the masses add up to the number of rows
    assert torch.allclose(mass.sum(-1), torch.full_like(mass.sum(-1), float(T)), rtol=1e-4)


@needs_triton
def test_lse_pass_skips_nothing_visible(monkeypatch):
    """The causal lse pass stops at each block's last visible key: equal to torch's logsumexp."""
    q, k, _ = qkv(1, 2, 1, 30, 45, 16, seed=1)
    lse2 = MP.causal_lse(q, k, SCALE)
    s = torch.einsum("bhtd,bld->bhtl", q.cpu(), k.cpu()[:, 0]) * SCALE
    vis = torch.arange(45)[None, :] <= torch.arange(30)[:, None] + 15
    want = torch.logsumexp(s.masked_fill(~vis, float("-inf")), -1) * MP.LOG2E
    assert (lse2.cpu() - want).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T,L", [(8192, 8192), (3000, 8192)], ids=["flash_lse", "chunk_lse_pass"])
def test_llama3_shape_bf16(T, L):
    q, k, v = qkv(1, 32, 8, T, L, 128, seed=5, dtype=torch.bfloat16)
    out, mass = kernels.causal_attention_mass(q, k, v, SCALE)
    want_out, want_mass = MP.causal_attention_mass_ref(q, k, v, SCALE)
    assert ((out.float() - want_out.float()).norm() / want_out.float().norm()).item() < 1e-2
    assert ((mass - want_mass).norm() / want_mass.norm()).item() < 2e-2
    assert torch.allclose(mass.sum(-1), torch.full_like(mass.sum(-1), float(T)), rtol=1e-2)
