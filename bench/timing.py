"""What the benchmarks share: timing a call (Clock: CUDA events on a GPU, perf_counter elsewhere;
bench/engine.py re-exports it), the one-line text a failed configuration's row records, and freeing
what the last configuration left before the next one is measured."""
from __future__ import annotations

import gc
import statistics
import time

import torch


class Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn, repeat: int = 1) -> float:
        """Median seconds of `fn()` over `repeat` runs (CUDA events on GPU)."""
        times = []
        for _ in range(repeat):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1000)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)


def error_text(e: BaseException) -> str:
    oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()
    first = (str(e).strip().splitlines() or [""])[0][:240]
    return ("out of memory: " if oom else f"{type(e).__name__}: ") + first


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
