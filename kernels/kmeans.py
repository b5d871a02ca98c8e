"""Tactic's k-means steps (methods/parts/cluster_keys.py) as one Triton kernel: each key's centroid of highest dot
product, without the [keys x clusters] score matrix, and optionally (the update) the per-cluster sums
and sizes of the keys so assigned, in the same pass.

Contract, assignment (`kmeans_assign`): x [G, n, D], c [G, k, D] (c is cast to x's dtype, as the
products are taken in it) -> int64 [G, n], the index of the largest x.c per key, scores in fp32
(products of the x.dtype inputs accumulated in fp32, never rounded to x.dtype), ties to the lowest
index (torch.argmax's rule).
Contract, assignment and update (`kmeans_assign_update(x, c, prev, acc)`): that assignment a, and
sums fp32 [G, k, D] (sums[g, j] = the sum in fp32 of the rows acc[g, i] with a[g, i] = j; acc [G, n, D]
defaults to x, and is the raw keys when x holds normalised ones), sizes int64 [G, k] (the count of
those rows, bincount of a) and changed (an int64 0-d tensor on x's device: how many keys a assigns
otherwise than prev; None without prev).

Why a kernel: a bmm then argmax (the torch reference, and the method's GPU path before this kernel)
writes every score and reads it back. At a 32K prefill with 1K clusters per KV head (Tactic's 32
tokens a cluster) that is 8 x 32K x 1K = 268M scores a layer and iteration, ~1 GB written and read in
bf16, beside ~70 GFLOP of tensor-core work; k-means runs up to 10 iterations a layer. The H100 bench
(results/bench/tactic_h100.json, before this kernel) put the clustering at 0.29 x the prefill at 32K.
The kernel keeps one tile of scores in registers: a program holds BLOCK_N keys, walks the centroids
BLOCK_K at a time and keeps a running (max, argmax). Why the update inside it: as separate torch ops
(x.float(), index_add_, bincount, torch.equal against the last assignment) it cost more than the
assignment itself on an H100 at 32K (0.28 + 0.16 ms against 0.22 ms an iteration); the program already
holds its keys and their clusters, so it adds them with fp32 atomics into the sums and sizes.

Determinism: the Triton update's fp32 atomics add a cluster's keys in whatever order programs reach
them, so sums (not sizes, assignments or changed) may differ in the last bits from run to run (torch's
CUDA index_add_, which the method used before, was no different). The torch reference is deterministic.

Dispatch: Triton on CUDA tensors (`HARNESS_KERNELS` as everywhere), when D is a power of two of 16 to
256 (tl.dot's tile rule; every model here has D 64 or 128); the torch reference otherwise. Both
compute the same contract, so the choice changes no result beyond fp32 summation order.
"""
from __future__ import annotations

import torch

from ._common import backend_for, kernel_for, tl, triton

REF_SCORES = 1 << 26   # the reference's scores per bmm block at most (256 MiB of fp32)
# Tiles and launch settings on CUDA, module-level so a GPU micro-benchmark can override them; the
# warps and stages are Triton's defaults. The interpreter takes small tiles instead: the CPU tests'
# shapes then span several tiles of keys and of centroids at little cost.
GPU_BLOCK_N = 64
GPU_BLOCK_K = 64
GPU_WARPS = 4
GPU_STAGES = 3
INTERP_BLOCK = 16


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


def kmeans_assign_update_ref(x: torch.Tensor, c: torch.Tensor, prev: torch.Tensor | None = None,
                             acc: torch.Tensor | None = None):
    """The update contract in torch: the reference assignment, then index_add_ / bincount / a != prev."""
    G, n, D = x.shape
    k = c.shape[1]
    a = kmeans_assign_ref(x, c)
    rows = (a + (torch.arange(G, device=x.device) * k).view(G, 1)).view(-1)   # cluster j of group g: g*k + j
    src = (x if acc is None else acc).float().reshape(G * n, D)
    sums = torch.zeros(G * k, D, device=x.device).index_add_(0, rows, src).view(G, k, D)
    sizes = torch.bincount(rows, minlength=G * k).view(G, k)
    return a, sums, sizes, None if prev is None else (a != prev).sum()


@triton.jit
def _assign_kernel(X, C, Out, A, Sums, Sizes, Prev, Changed, N, K, sxg, sxn, scg, sck, sog, sag, san,
                   D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
                   UPCAST: tl.constexpr, UPDATE: tl.constexpr, ACC_IS_X: tl.constexpr, HAS_PREV: tl.constexpr):
    g = tl.program_id(1).to(tl.int64)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    valid = rn < N
    x = tl.load(X + g * sxg + rn[:, None] * sxn + rd[None, :], mask=valid[:, None], other=0.0)
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
    tl.store(Out + g * sog + rn, arg.to(tl.int64), mask=valid)
    if UPDATE:
        # Padded keys (rn >= N) scored zeros and hold some cluster: every atomic below is masked by
        # `valid`, or they would count into that cluster's size.
        if ACC_IS_X:   # the keys are already in registers
            v = x.to(tl.float32)
        else:
            v = tl.load(A + g * sag + rn[:, None] * san + rd[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        row = g * K + arg                                 # int64 (g is): row * D can pass 2^31
        # relaxed: nothing reads these until the kernel ends; lets the compiler use fire-and-forget reductions
        tl.atomic_add(Sums + row[:, None] * D + rd[None, :], v, mask=valid[:, None], sem="relaxed")
        tl.atomic_add(Sizes + row, tl.full([BLOCK_N], 1, tl.int64), mask=valid, sem="relaxed")
        if HAS_PREV:
            p = tl.load(Prev + g * sog + rn, mask=valid, other=0)
            moved = tl.sum((valid & (p != arg)).to(tl.int64), axis=0)
            tl.atomic_add(Changed, moved, mask=moved > 0, sem="relaxed")   # one counter: skip the zeros


def _kernel_fits(x: torch.Tensor) -> bool:
    D = x.shape[-1]
    return D >= 16 and D & (D - 1) == 0 and D <= 256


def _launch(x, c, out, acc=None, sums=None, sizes=None, prev=None, changed=None) -> None:
    """One grid of `_assign_kernel` over contiguous x, c (x's dtype), out; the update when sums is given."""
    G, n, D = x.shape
    update = sums is not None
    a = x if acc is None else acc
    block_n, block_k = (GPU_BLOCK_N, GPU_BLOCK_K) if x.is_cuda else (INTERP_BLOCK, INTERP_BLOCK)
    opts = {"num_warps": GPU_WARPS, "num_stages": GPU_STAGES} if x.is_cuda else {}
    grid = (triton.cdiv(n, block_n), G)
    kernel_for(_assign_kernel, x)[grid](
        x, c, out, a, sums if update else x, sizes if update else out, out if prev is None else prev,
        out if changed is None else changed, n, c.shape[1], x.stride(0), x.stride(1), c.stride(0), c.stride(1),
        out.stride(0), a.stride(0), a.stride(1), D=D, BLOCK_N=block_n, BLOCK_K=block_k,
        IEEE=x.dtype == torch.float32 or not x.is_cuda, UPCAST=not x.is_cuda, UPDATE=update,
        ACC_IS_X=acc is None, HAS_PREV=prev is not None, **opts)


def kmeans_assign(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Best centroid per key (the module's contract); Triton or the torch reference (module docstring)."""
    if backend_for(x) != "triton" or not _kernel_fits(x):
        return kmeans_assign_ref(x, c)
    x = x.contiguous()
    out = torch.empty(x.shape[:2], dtype=torch.long, device=x.device)
    _launch(x, c.to(x.dtype).contiguous(), out)
    return out


def kmeans_assign_update(x: torch.Tensor, c: torch.Tensor, prev: torch.Tensor | None = None,
                         acc: torch.Tensor | None = None):
    """One Lloyd step's data (the module's update contract): (assignment int64 [G, n], sums fp32
    [G, k, D] of the acc rows (default x) per cluster, sizes int64 [G, k], keys changed against prev
    as an int64 0-d tensor or None). Triton (fused, sums in atomic order) or the torch reference."""
    if acc is not None and acc.shape != x.shape:
        raise ValueError(f"acc {tuple(acc.shape)} must have x's shape {tuple(x.shape)}")
    if prev is not None and prev.shape != x.shape[:2]:
        raise ValueError(f"prev {tuple(prev.shape)} must be [G, n] = {tuple(x.shape[:2])}")
    if backend_for(x) != "triton" or not _kernel_fits(x):
        return kmeans_assign_update_ref(x, c, prev, acc)
    G, n, D = x.shape
    k = c.shape[1]
    acc = None if acc is None or acc is x else acc.contiguous()   # None: the kernel reuses its key tile
    x = x.contiguous()
    out = torch.empty((G, n), dtype=torch.long, device=x.device)
    sums = torch.zeros((G, k, D), dtype=torch.float32, device=x.device)
    sizes = torch.zeros((G, k), dtype=torch.long, device=x.device)
    changed = None if prev is None else torch.zeros((), dtype=torch.long, device=x.device)
    prev = None if prev is None else prev.to(torch.long).contiguous()
    _launch(x, c.to(x.dtype).contiguous(), out, acc, sums, sizes, prev, changed)
    return out, sums, sizes, changed
