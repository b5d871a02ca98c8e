"""Sequential prefix sums along one axis of a 3-D tensor, in place: x[:, i, :] += x[:, i - 1, :] (axis 1) or
x[:, :, j] += x[:, :, j - 1] (axis 2), one add at a time in index order.

Why a kernel: Ltri-LLM's span scores (methods/parts/ltri_device.py) take 2-D prefix sums of fp64 maps, and their
bits decide ties between spans. numpy's cumsum and torch's CPU cumsum add sequentially; torch's CUDA cumsum is a
parallel scan (another association, other bits). This kernel keeps the sequential order on the GPU, so the device
sums equal the host's bit for bit: each program owns a strip of BLOCK lines across the other axis and walks the
scanned axis with one running sum per line (plain fp adds, no fused multiply-add, no reassociation).
The torch reference (`prefix_sum_reference`) is torch's CPU cumsum, sequential as well.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton

if HAVE_TRITON:

    @triton.jit
    def _scan_kernel(X, L, W, s_n, s_scan, s_line, BLOCK: tl.constexpr):
        # program (map n, strip of BLOCK lines); walk the L positions of the scanned axis in order
        n = tl.program_id(0).to(tl.int64)
        lines = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = lines < W
        ptr = X + n * s_n + lines.to(tl.int64) * s_line
        acc = tl.load(ptr, mask=ok, other=0.0)
        for i in range(1, L):
            p = ptr + i * s_scan
            acc = acc + tl.load(p, mask=ok, other=0.0)
            tl.store(p, acc, mask=ok)


def prefix_sum_reference(x: torch.Tensor, axis: int) -> torch.Tensor:
    """x.cumsum_(axis) on the CPU (sequential), the result copied back to x's device."""
    x.copy_(x.cpu().cumsum(axis))
    return x


def prefix_sum_(x: torch.Tensor, axis: int) -> torch.Tensor:
    """In place sequential cumsum of a 3-D tensor x along axis 1 or 2 (any strides); x returned."""
    if x.dim() != 3 or axis not in (1, 2):
        raise ValueError(f"prefix_sum_ takes a 3-D tensor and axis 1 or 2, got shape {tuple(x.shape)}, axis {axis}")
    if backend_for(x) == "torch":
        return x.cumsum_(axis) if not x.is_cuda else prefix_sum_reference(x, axis)
    N, L, W = x.shape[0], x.shape[axis], x.shape[3 - axis]
    if N == 0 or L == 0 or W == 0:
        return x
    BLOCK = min(128, next_pow2(W))
    kernel_for(_scan_kernel, x)[(N, triton.cdiv(W, BLOCK))](
        x, L, W, x.stride(0), x.stride(axis), x.stride(3 - axis), BLOCK=BLOCK)
    return x
