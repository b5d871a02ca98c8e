"""What the method benchmarks share (bench/every_method.py, bench/method_speed.py): timing one call
(CUDA events on a GPU, perf_counter elsewhere), the one-line text a failed configuration's row records,
and freeing what the last configuration left before the next one is measured."""
from __future__ import annotations

import gc
import time

import torch


class Timer:
    """Seconds of one call: CUDA events on a GPU, perf_counter elsewhere."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1000
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t


def error_text(e: BaseException) -> str:
    oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()
    first = (str(e).strip().splitlines() or [""])[0][:240]
    return ("out of memory: " if oom else f"{type(e).__name__}: ") + first


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
