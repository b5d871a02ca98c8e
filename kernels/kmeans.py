"""The assignment step of Tactic's k-means (methods/kmeans.py) as one Triton kernel: each key's
centroid of highest dot product, without the [keys x clusters] score matrix.

Contract: x [G, n, D], c [G, k, D] (c is cast to x's dtype, as the products are taken in it) ->
int64 [G, n], the index of the largest x.c per key, scores in fp32 (products of the x.dtype inputs
accumulated in fp32, never rounded to x.dtype), ties to the lowest index (torch.argmax's rule).

Why a kernel: a bmm then argmax (the torch reference, and the method's GPU path before this kernel)
writes every score and reads it back. At a 32K prefill with 1K clusters per KV head (Tactic's 32
tokens a cluster) that is 8 x 32K x 1K = 268M scores a layer and iteration, ~1 GB written and read in
bf16, beside ~70 GFLOP of tensor-core work; k-means runs up to 10 iterations a layer. The H100 bench
(results/bench/tactic_h100.json, before this kernel) put the clustering at 0.29 x the prefill at 32K.
The kernel keeps one tile of scores in registers: a program holds BLOCK_N keys, walks the centroids
BLOCK_K at a time and keeps a running (max, argmax).

Dispatch: Triton on CUDA tensors (`HARNESS_KERNELS` as everywhere), when D is a power of two of 16 or
more (tl.dot's tile rule; every model here has D 64 or 128); the torch reference otherwise. Both
compute the same contract, so the choice changes no result beyond fp32 summation order.
"""
from __future__ import annotations

import torch

from ._common import backend_for, kernel_for, tl, triton

REF_SCORES = 1 << 26   # the reference's scores per bmm block at most (256 MiB of fp32)


def kmeans_assign_ref(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The contract above in torch: fp32 scores of the x.dtype-rounded inputs, blocked over keys."""
    G, n, _ = x.shape
    xf = x.float()
    ct = c.to(x.dtype).float().transpose(1, 2)
    block = max(1, REF_SCORES // max(1, G * c.shape[1]))
    out = torch.empty((G, n), dtype=torch.long, device=x.device)
    for s in range(0, n, block):
        out[:, s:s + block] = torch.bmm(xf[:, s:s + block], ct).argmax(-1)
    return out


@triton.jit
def _assign_kernel(X, C, Out, N, K, sxg, sxn, scg, sck, sog,
                   D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
                   UPCAST: tl.constexpr):
    g = tl.program_id(1).to(tl.int64)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    x = tl.load(X + g * sxg + rn[:, None] * sxn + rd[None, :], mask=rn[:, None] < N, other=0.0)
    if UPCAST:   # the interpreter's dot mishandles bf16; fp32 products of bf16 values are exact anyway
        x = x.to(tl.float32)
    best = tl.full([BLOCK_N], float("-inf"), tl.float32)
    arg = tl.zeros([BLOCK_N], dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        c = tl.load(C + g * scg + rk[None, :] * sck + rd[:, None], mask=rk[None, :] < K, other=0.0)   # [D, BK]
        if UPCAST:
            c = c.to(tl.float32)
        if IEEE:   # fp32 keys: exact fp32 products, not TF32 (the reference's precision)
            s = tl.dot(x, c, input_precision="ieee")
        else:
            s = tl.dot(x, c)
        s = tl.where(rk[None, :] < K, s, float("-inf"))
        m = tl.max(s, axis=1)
        a = tl.argmax(s, axis=1, tie_break_left=True).to(tl.int32) + k0
        take = m > best                 # strict: an equal score in a later tile keeps the lower index
        best = tl.where(take, m, best)
        arg = tl.where(take, a, arg)
    tl.store(Out + g * sog + rn, arg.to(tl.int64), mask=rn < N)


def _kernel_fits(x: torch.Tensor) -> bool:
    D = x.shape[-1]
    return D >= 16 and D & (D - 1) == 0 and D <= 256


def kmeans_assign(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Best centroid per key (the module's contract); Triton or the torch reference (module docstring)."""
    if backend_for(x) != "triton" or not _kernel_fits(x):
        return kmeans_assign_ref(x, c)
    G, n, D = x.shape
    k = c.shape[1]
    x = x.contiguous()
    c = c.to(x.dtype).contiguous()
    out = torch.empty((G, n), dtype=torch.long, device=x.device)
    block_n = 64 if x.is_cuda else 16
    block_k = 64 if x.is_cuda else 16
    grid = (triton.cdiv(n, block_n), G)
    kernel_for(_assign_kernel, x)[grid](x, c, out, n, k, x.stride(0), x.stride(1), c.stride(0), c.stride(1),
                                         out.stride(0), D=D, BLOCK_N=block_n, BLOCK_K=block_k,
                                         IEEE=x.dtype == torch.float32 or not x.is_cuda, UPCAST=not x.is_cuda)
    return out
