"""Fused element-wise ops of the decoder layer: RMSNorm (optionally with the residual add), RoPE,
SiLU-and-multiply. Each replaces 5-8 small PyTorch kernels; in a decode step of an 8B model the
element-wise kernels took ~2.5 ms of ~9 ms on the H100 (launch-bound, not bandwidth-bound).

Numerics follow the HF modules: RMSNorm in fp32 then cast, times the weight in the model dtype;
RoPE and SiLU-mul round each intermediate to the model dtype as PyTorch's eager ops do.
Each op has a torch reference (`*_ref`) and a dispatcher (Triton on CUDA, reference elsewhere).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rmsnorm_kernel(X, R, W, Y, H_out, N, eps, s_x, s_r, s_y, s_h,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(X + row * s_x + cols, mask=m, other=0.0)
        if HAS_RES:  # h = x + residual, in the model dtype (as `h = h + out` in eager)
            x = (x + tl.load(R + row * s_r + cols, mask=m, other=0.0)).to(X.dtype.element_ty)
            tl.store(H_out + row * s_h + cols, x, mask=m)
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, 0) / N
        y = (xf * tl.math.rsqrt(var + eps)).to(X.dtype.element_ty)
        w = tl.load(W + cols, mask=m, other=0.0)
        tl.store(Y + row * s_y + cols, (w * y).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_kernel(X, C, S, Y, HEADS, T, s_xb, s_xh, s_xt, s_cb, s_ct, s_yb, s_yh, s_yt,
                     D: tl.constexpr):
        # one program per (token, batch*head): y = x*cos + rotate_half(x)*sin, each product
        # rounded to the dtype like the eager expression
        # tokens on grid axis 0: axis 1 is capped at 65535 (a 128K prefill). Offsets in int64: at 1M
        # tokens h * s_xh passes 2^31 (an illegal memory access in bench.cascade's dense layer).
        t = tl.program_id(0).to(tl.int64)
        pid = tl.program_id(1)
        b = (pid // HEADS).to(tl.int64)
        h = (pid % HEADS).to(tl.int64)
        half = D // 2
        i = tl.arange(0, D)
        x = tl.load(X + b * s_xb + h * s_xh + t * s_xt + i)
        j = tl.where(i < half, i + half, i - half)
        xr = tl.load(X + b * s_xb + h * s_xh + t * s_xt + j)
        xr = tl.where(i < half, -xr, xr)
        c = tl.load(C + b * s_cb + t * s_ct + i)
        s = tl.load(S + b * s_cb + t * s_ct + i)
        dt = X.dtype.element_ty
        y = (x * c).to(dt) + (xr * s).to(dt)
        tl.store(Y + b * s_yb + h * s_yh + t * s_yt + i, y.to(dt))

    @triton.jit
    def _silu_mul_kernel(GU, Y, I, s_g, s_y, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < I
        g = tl.load(GU + row * s_g + cols, mask=m, other=0.0)
        u = tl.load(GU + row * s_g + I + cols, mask=m, other=0.0)
        gf = g.to(tl.float32)
        a = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu computes in fp32 and rounds
        tl.store(Y + row * s_y + cols, (a * u).to(g.dtype), mask=m)


# --------------------------------------------------------------------------- references

def rmsnorm_ref(x, weight, eps, residual=None):
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out = weight * y
    return (out, x) if residual is not None else out


def rope_ref(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat((-x2, x1), dim=-1)
    return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


def silu_mul_ref(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


# --------------------------------------------------------------------------- dispatchers

def rmsnorm(x, weight, eps, residual=None):
    """RMSNorm over the last dim of x [..., N] (HF numerics). With `residual`, first h = x +
    residual; returns (norm(h), h)."""
    if backend_for(x) == "torch":
        return rmsnorm_ref(x, weight, eps, residual)
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    rows = x2.shape[0]
    out_dtype = torch.result_type(weight, x2) if weight.dtype != x2.dtype else x2.dtype
    y = torch.empty(rows, N, device=x.device, dtype=out_dtype)
    h = torch.empty_like(x2) if residual is not None else y
    r2 = residual.reshape(-1, N) if residual is not None else x2
    kernel_for(_rmsnorm_kernel, x)[(rows,)](
        x2, r2, weight, y, h, N, float(eps), x2.stride(0), r2.stride(0), y.stride(0), h.stride(0),
        HAS_RES=residual is not None, BLOCK=next_pow2(N), num_warps=4 if N <= 4096 else 8)
    y = y.view(*x.shape[:-1], N)
    return (y, h.view(*x.shape[:-1], N)) if residual is not None else y


def rope(x, cos, sin):
    """x [B, H, T, D] rotated by cos/sin [B or 1, T, D] (rotate_half convention)."""
    if backend_for(x) == "torch":
        return rope_ref(x, cos, sin)
    B, H, T, D = x.shape
    assert x.stride(-1) == 1 and D == next_pow2(D)
    cos = cos.expand(B, T, D) if cos.shape[0] == 1 else cos
    sin = sin.expand(B, T, D) if sin.shape[0] == 1 else sin
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    y = torch.empty(B, H, T, D, device=x.device, dtype=x.dtype)
    kernel_for(_rope_kernel, x)[(T, B * H)](
        x, cos, sin, y, H, T, x.stride(0), x.stride(1), x.stride(2), cos.stride(0), cos.stride(1),
        y.stride(0), y.stride(1), y.stride(2), D=D, num_warps=1)
    return y


def silu_mul(gu):
    """gu [..., 2I] (gate and up projections side by side) -> silu(gate) * up, [..., I]."""
    if backend_for(gu) == "torch":
        return silu_mul_ref(gu)
    I2 = gu.shape[-1]
    I = I2 // 2
    g2 = gu.reshape(-1, I2)
    y = torch.empty(g2.shape[0], I, device=gu.device, dtype=gu.dtype)
    block = 1024
    kernel_for(_silu_mul_kernel, gu)[(g2.shape[0], triton.cdiv(I, block))](
        g2, y, I, g2.stride(0), y.stride(0), BLOCK=block, num_warps=4)
    return y.view(*gu.shape[:-1], I)
