"""Peak live tensor bytes on the CPU, and the engine's CUDA-graph capture replayed on the CPU (issue 34).

`LiveBytes` is a TorchDispatchMode that counts the bytes of every storage an op allocates while the
mode is on, until that storage is freed (a finalizer on the storage: a view keeps it alive, as the
caching allocator would see it). Storages that existed before (weights, a caller's tensors) are never
counted, nor are views of them or in-place writes to them. `peak` is the most counted at once since
the last `mark()`. The GPU's `torch.cuda.max_memory_allocated` counts the same allocations, plus
the allocator's rounding. SDPA's causal bias (a Tensor subclass, which cannot be made under a dispatch
mode, and holds no data) is made with the mode off.

`cpu_capture(engine, token)` runs runners/graphs.py's DecodeGraph._capture as is, with the CUDA
stream and graph calls made no-ops: its warm-up steps run for real, and for a method that is not
`decode_idempotent` it saves and restores the declared buffers, as it does on the GPU.
"""
from __future__ import annotations

import contextlib
import types
import weakref
from unittest import mock

import torch
from torch.nn.attention import bias
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from runners import graphs


def _modeless(fn):
    def call(*a, **k):
        with _disable_current_modes():
            return fn(*a, **k)
    return call


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}

    def __enter__(self):
        self._bias = mock.patch.object(bias, "causal_lower_right", _modeless(bias.causal_lower_right))
        self._bias.start()
        return super().__enter__()

    def __exit__(self, *exc):
        self._bias.stop()
        return super().__exit__(*exc)

    def mark(self) -> None:
        """Start a new phase: `peak` counts from what is live now."""
        self.peak = self.live

    def _free(self, key: int, n: int) -> None:
        if self._sizes.pop(key, None) is not None:
            self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            s = t.untyped_storage()
            key, n = s.data_ptr(), s.nbytes()
            if n == 0 or key in inputs or key in self._sizes:   # a view, an in-place write, or counted
                continue
            self._sizes[key] = n
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(s, self._free, key, n)
        return out


class _NoGraph:
    def replay(self):
        raise RuntimeError("cpu_capture only captures: decode on without graphs (engine.graphs = None)")


def _fake_cuda():
    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    return types.SimpleNamespace(Stream=lambda: stream, current_stream=lambda: stream,
                                 stream=lambda s: contextlib.nullcontext(), CUDAGraph=_NoGraph,
                                 graph=lambda g: contextlib.nullcontext())


class _TorchWithoutCuda:
    """torch, but for its `cuda` namespace (streams and graphs that do nothing)."""
    cuda = _fake_cuda()

    def __getattr__(self, name):
        return getattr(torch, name)


def cpu_capture(engine, token: torch.Tensor) -> None:
    """The first decode step's graph capture (`before_decode`, then DecodeGraph._capture) on the CPU."""
    engine.method.before_decode(engine.seq_len)
    fake = _TorchWithoutCuda()
    dg = graphs.DecodeGraph(engine)
    with mock.patch.object(graphs, "torch", fake), torch.inference_mode():
        dg._capture(engine, token, dg.key_of(engine, token))
