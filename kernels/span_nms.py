"""Greedy 1-D non-maximum suppression of many maps' candidate spans at once (Ltri-LLM's span rule,
methods/parts/ltri_spans.py nms_1d, batched as methods/parts/ltri_batch.py nms): per map, `steps` times, keep the
live candidate of the highest score (ties: the lower index; no live one left: index 0, marked not ok) and kill
every candidate whose IoU with it exceeds `iou`.

Why a kernel: the batched torch loop issues ~25 small operations per step, a few hundred launches per call on a
GPU (the 512-token query map takes 16 steps); here one program per map runs all steps in registers. Exact: index
work, comparisons, and the IoU as the same fp64 operations ((len + len_i) - inter, then one IEEE divide), iou
passed as fp64 (a Python float argument would reach Triton as fp32).
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton

if HAVE_TRITON:

    @triton.jit
    def _nms_kernel(X, Y, S, Iou, OX, OY, OK, C, K, BLOCK: tl.constexpr):
        m = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        inb = c < C
        xs = tl.load(X + m * C + c, mask=inb, other=0)
        ys = tl.load(Y + m * C + c, mask=inb, other=0)
        sc = tl.load(S + m * C + c, mask=inb, other=float("-inf"))
        iou = tl.load(Iou)
        length = (ys - xs + 1).to(tl.float64)
        alive = inb
        for k in range(K):
            ok = tl.max(alive.to(tl.int32), 0) > 0
            live = tl.where(alive, sc, float("-inf"))
            best = tl.max(live, 0)
            i = tl.min(tl.where(inb & (live == best), c, BLOCK), 0)      # the first maximum (numpy's argmax)
            hit = c == i
            xi = tl.sum(tl.where(hit, xs, 0), 0)
            yi = tl.sum(tl.where(hit, ys, 0), 0)
            li = tl.sum(tl.where(hit, length, 0.0), 0)
            inter = tl.maximum(tl.minimum(ys, yi) - tl.maximum(xs, xi) + 1, 0).to(tl.float64)
            ratio = inter / ((length + li) - inter)
            alive = alive & ~(ratio > iou) & ~hit
            tl.store(OX + m * K + k, xi)
            tl.store(OY + m * K + k, yi)
            tl.store(OK + m * K + k, ok.to(tl.int8))


def nms_reference(xs: torch.Tensor, ys: torch.Tensor, sc: torch.Tensor, iou: float, steps: int):
    """(x, y, ok) [N, steps]: the batched torch loop (ltri_batch.nms's operations, in torch)."""
    length = (ys - xs + 1).double()
    alive = torch.ones(xs.shape, dtype=torch.bool, device=xs.device)
    out = []
    for _ in range(steps):
        ok = alive.any(1)
        i = torch.where(alive, sc, float("-inf")).argmax(1, keepdim=True)
        xi, yi = xs.gather(1, i), ys.gather(1, i)
        inter = (torch.minimum(ys, yi) - torch.maximum(xs, xi) + 1).clamp(min=0)
        ratio = inter / (length + length.gather(1, i) - inter)
        alive &= ~(ratio > iou)
        alive.scatter_(1, i, False)
        out.append((xi[:, 0], yi[:, 0], ok))
    return tuple(torch.stack(v, 1) for v in zip(*out))


def nms(xs: torch.Tensor, ys: torch.Tensor, sc: torch.Tensor, iou: float, steps: int):
    """(x, y, ok) [N, steps] of greedy NMS over candidates [N, C] (int64 x, y; fp64 scores, no NaN), steps <= C,
    steps >= 1."""
    if backend_for(xs) == "torch":
        return nms_reference(xs, ys, sc, iou, steps)
    N, C = xs.shape
    xs, ys, sc = xs.contiguous(), ys.contiguous(), sc.contiguous()
    ox, oy = (torch.empty(N, steps, dtype=torch.long, device=xs.device) for _ in range(2))
    ok = torch.empty(N, steps, dtype=torch.int8, device=xs.device)
    if N:
        iou_t = torch.full((1,), iou, dtype=torch.float64, device=xs.device)   # a fill: no host copy, no sync
        kernel_for(_nms_kernel, xs)[(N,)](xs, ys, sc, iou_t, ox, oy, ok, C, steps, BLOCK=next_pow2(C))
    return ox, oy, ok.bool()
