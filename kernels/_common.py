"""Backend choice, interpreter fallback and the split-K combine shared by the kernel modules.

Dispatch rule: `HARNESS_KERNELS=torch|triton` forces a backend; otherwise Triton runs on CUDA
tensors and the torch reference everywhere else. A Triton kernel called on CPU tensors runs in
Triton's interpreter, which works only if `TRITON_INTERPRET=1` was in the environment
before triton was first imported (triton decides at import time; see `interpreter_active`).
"""
from __future__ import annotations

import functools
import math
import os

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - triton is an optional extra
    triton = tl = None
    HAVE_TRITON = False

LOG2E = 1.4426950408889634


def backend_for(t: torch.Tensor) -> str:
    """'triton' or 'torch' for an op whose inputs live where `t` lives."""
    forced = os.environ.get("HARNESS_KERNELS", "").strip().lower()
    if forced == "torch":
        return "torch"
    if forced == "triton":
        if not HAVE_TRITON:
            raise RuntimeError("HARNESS_KERNELS=triton but triton is not importable")
        return "triton"
    if forced:
        raise ValueError(f"HARNESS_KERNELS must be 'torch' or 'triton', got {forced!r}")
    return "triton" if (HAVE_TRITON and t.is_cuda) else "torch"


def interpreter_active() -> bool:
    """True when triton was imported under TRITON_INTERPRET=1 (its own library functions are then
    interpretable too; a kernel cannot be interpreted after the fact)."""
    if not HAVE_TRITON:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction) or isinstance(
        getattr(tl.zeros, "__wrapped__", None), InterpretedFunction) or bool(
        triton.knobs.runtime.interpret)


def _shim_interpreter_index() -> None:
    """Triton 3.6's interpreter keeps scalars as 1-element arrays and converts them for `range()`
    with int(array), which numpy >= 2.4 refuses; convert through the single element instead."""
    from triton.runtime import interpreter as ti

    if getattr(ti, "_harness_index_shim", False):
        return
    original = ti._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    ti._patch_lang_tensor = patched
    ti._harness_index_shim = True


def kernel_for(kernel, t: torch.Tensor):
    """The kernel, after checking it can run on t's device (CPU needs the interpreter)."""
    if not t.is_cuda and not interpreter_active():
        raise RuntimeError("Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before triton "
                           "is imported; use HARNESS_KERNELS=torch (or unset it) on the CPU")
    if not t.is_cuda:
        _shim_interpreter_index()
    return kernel


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(t: torch.Tensor) -> int:
    # On the CPU interpreter a "machine" of 2 SMs keeps test grids small but still splits.
    return _sm_count(t.device.index or 0) if t.is_cuda else 2


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def plan_splits(n_slots_max: int, programs: int, block: int, sms: int,
                splits_per_sm: float = 4.0, num_splits: int | None = None) -> tuple[int, int]:
    """(number of splits, slots per split) so that programs*splits fills the machine a few times.

    Splits are whole blocks: a split never straddles a block, so masking stays per block.
    """
    n_blocks = max(1, -(-n_slots_max // block))
    if num_splits is None:
        num_splits = max(1, -(-int(sms * splits_per_sm) // max(1, programs)))
    num_splits = max(1, min(num_splits, n_blocks))
    chunk = -(-n_blocks // num_splits) * block
    return -(-n_blocks * block // chunk), chunk


if HAVE_TRITON:

    @triton.jit
    def _combine_kernel(Op, Lp, Out, NS, s_ob, s_oh, HQ,
                        D: tl.constexpr, BLOCK_S: tl.constexpr):
        # One program per (batch, query head): merge NS partial results (each normalised, with its
        # base-2 log-sum-exp). An all-empty row (every split had nothing) yields zeros, not NaN.
        pid = tl.program_id(0)
        b = pid // HQ
        h = pid % HQ
        ss = tl.arange(0, BLOCK_S)
        dd = tl.arange(0, D)
        lp = Lp + pid.to(tl.int64) * NS
        op = Op + pid.to(tl.int64) * NS * D
        m = tl.full((), float("-inf"), tl.float32)
        for s0 in range(0, NS, BLOCK_S):
            lse = tl.load(lp + s0 + ss, mask=s0 + ss < NS, other=float("-inf"))
            m = tl.maximum(m, tl.max(lse, 0))
        m = tl.where(m == float("-inf"), 0.0, m)
        acc = tl.zeros((D,), tl.float32)
        den = tl.zeros((), tl.float32)
        for s0 in range(0, NS, BLOCK_S):
            smask = s0 + ss < NS
            w = tl.exp2(tl.load(lp + s0 + ss, mask=smask, other=float("-inf")) - m)
            o = tl.load(op + (s0 + ss)[:, None] * D + dd[None, :], mask=smask[:, None], other=0.0)
            acc += tl.sum(w[:, None] * o, 0)
            den += tl.sum(w, 0)
        out = acc / tl.where(den > 0, den, 1.0)
        tl.store(Out + b.to(tl.int64) * s_ob + h * s_oh + dd, out.to(Out.dtype.element_ty))


def combine(op: torch.Tensor, lp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge split partials op [B, Hq, NS, D] fp32, lp [B, Hq, NS] (log2 lse) into out [B, Hq, D]."""
    B, Hq, NS, D = op.shape
    assert out.stride(-1) == 1 and op.is_contiguous() and lp.is_contiguous()
    kernel_for(_combine_kernel, op)[(B * Hq,)](
        op, lp, out, NS, out.stride(0), out.stride(1), Hq, D=D, BLOCK_S=16, num_warps=4)
    return out


def combine_torch(op: torch.Tensor, lp: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Torch version of `combine` (used by tests to check the kernel's partials)."""
    m = lp.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lp - m)
    den = w.sum(-1, keepdim=True)
    out = (w.unsqueeze(-1) * op).sum(-2) / torch.where(den > 0, den, torch.ones_like(den))
    return out.to(dtype)
