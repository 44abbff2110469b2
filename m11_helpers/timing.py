"""Timing, the one way: warm up, repeat, report the median (and the spread) of wall-clock seconds.

    t = time_it(lambda: model(x).sum().backward(), repeats=5)
    t.median, t.min, t.samples          # seconds
    f"{t}"                              # '12.3 ms (median of 5, min 11.9 ms)'

Why the median: on a shared machine a few repeats are slowed by other processes; the median ignores
them, where the mean does not, and unlike the minimum it is not one lucky run. Benchmarks print
ratios of medians measured side by side in one run (CONTRIBUTING: performance is never asserted in
tests). On a GPU the kernels run after the call returns, so by default each clock read waits for the
accelerator first (`synchronize()`, a no-op on a CPU-only process): the clock stops when the kernels do.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

from m11_helpers.validate import non_negative_int, positive_int

__all__ = ["Timing", "time_it", "format_seconds", "synchronize"]


def synchronize() -> None:
    """Wait for the accelerator's queued kernels (CUDA or MPS); nothing on CPU.

    Only a process that has initialised the accelerator can have kernels queued on it, and asking
    (`torch.cuda.is_initialized()`) initialises nothing, so a CPU run, or a kernel about to fork GPU
    ranks, is untouched.
    """
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    elif torch.backends.mps.is_available():  # Apple's GPU (asking torch.accelerator could initialise CUDA)
        torch.mps.synchronize()


def format_seconds(s: float) -> str:
    """0.0123 -> '12.3 ms'."""
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of each repeat (warm-up runs excluded)."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    def __str__(self) -> str:
        return f"{format_seconds(self.median)} (median of {len(self.samples)}, min {format_seconds(self.min)})"


def time_it(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1,
            sync: Callable[[], Any] | None = synchronize) -> Timing:
    """Call `fn()` `warmup` times untimed, then `repeats` times timed; `sync()` before each clock read.

    `sync` defaults to `synchronize` (the accelerator's kernels finish inside the timed interval);
    pass `sync=None` to time the launch alone.
    """
    positive_int("repeats", repeats)
    non_negative_int("warmup", warmup)
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples))
