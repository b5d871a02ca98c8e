"""Parity of the fused element-wise kernels (RMSNorm + residual, RoPE, SiLU-mul) with their torch
references, through Triton's interpreter on the CPU (compiled on a GPU box)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import fused

pytestmark = needs_triton


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")


def _skip_interpreted_bf16(dtype):
    if dtype == torch.bfloat16 and DEV == "cpu":
        pytest.skip("Triton's interpreter mishandles bf16 loads/stores (numpy has no bf16); checked on the GPU")


def _check(got, ref, dtype):
    assert torch.isfinite(got).all()
    tol = 0 if dtype == torch.float32 else 1e-2
    assert ((got.float() - ref.float()).abs().max() <= tol * ref.float().abs().max() + 1e-6).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [64, 576, 100])
def test_rmsnorm(dtype, n):
    _skip_interpreted_bf16(dtype)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, 2, n, generator=g).to(DEV, dtype)
    r = torch.randn(3, 2, n, generator=g).to(DEV, dtype)
    w = torch.randn(n, generator=g).to(DEV, dtype)
    _check(fused.rmsnorm(x, w, 1e-5), fused.rmsnorm_ref(x, w, 1e-5), dtype)
    y, h = fused.rmsnorm(x, w, 1e-5, residual=r)
    y_ref, h_ref = fused.rmsnorm_ref(x, w, 1e-5, residual=r)
    _check(h, h_ref, dtype)
    _check(y, y_ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,H,T,D", [(1, 9, 1, 64), (2, 4, 5, 16)])
def test_rope(dtype, B, H, T, D):
    _skip_interpreted_bf16(dtype)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(B, H, T, D, generator=g).to(DEV, dtype)
    ang = torch.rand(1, T, D // 2, generator=g) * 6
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(DEV, dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(DEV, dtype)
    _check(fused.rope(x, cos, sin), fused.rope_ref(x, cos, sin), dtype)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # the engine's [B, T, H, D] -> [B, H, T, D] view
    _check(fused.rope(xt, cos, sin), fused.rope_ref(xt, cos, sin), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype):
    _skip_interpreted_bf16(dtype)
    gu = torch.randn(2, 3, 2 * 1536, generator=torch.Generator().manual_seed(0)).to(DEV, dtype)
    _check(fused.silu_mul(gu), fused.silu_mul_ref(gu), dtype)
