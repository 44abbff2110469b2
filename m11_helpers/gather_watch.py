"""Lesson 05 — what a check sees of a hand-built FSDP: each all-gather's dtype and how far ahead it ran, each wait.

    with watch_gathers(settle_to=3) as w:     # inside a rank, in the thread that runs forward and backward
        loss = net(x, y)
        w.phase("backward")
        loss.backward()
    w.max_in_flight("forward")   # most gathers issued and not yet waited when a layer's gather is waited: the depth
    w.max_alive("backward")      # most gathered buffers alive at once at a wait (weak references to their storages)
    w.dtypes("all_gather"), w.dtypes("reduce_scatter"), w.sync_gathers, w.unwaited

It watches calls with `sys.setprofile`, as `m11_helpers.grading.observe` does (by code object, so any alias
is seen): the all-gather's input dtype is what crosses the wire (cast before the gather: 2 bytes per
element in bf16, not 4); each `Work.wait()` (a C method, recognised by its signature) is matched to
the oldest async gather not yet waited — a profiler is not shown the handle a pybind method is called
on, and a prefetcher waits its gathers in the order it issued them. A gather issued k layers before its wait is k layers of
prefetch (PyTorch FSDP, Zhao et al. 2023 §3.3: "forward/backward prefetching"). A gathered buffer is
alive while its storage is (views keep it; `m11_helpers.live_memory` counts bytes the same way); gloo's
worker thread lets go of a finished buffer a moment after its wait, so a count above `settle_to` is
re-read for up to `settle_s` before it is recorded. On a GPU autograd runs backward in a device thread:
run the watched backward under `torch.autograd.set_multithreading_enabled(False)`.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import sys
import time
import weakref
from typing import Iterator

import torch.distributed as dist

__all__ = ["GatherWatch", "watch_gathers"]

_GATHERS = ("all_gather_single", "all_gather_into_tensor")  # (output, input) flat collectives
_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")
_WORK = "_distributed_c10d.Work"  # in Work.wait's pybind signature: "wait(self: torch._C._distributed_c10d.Work, ..."


def _codes(names: tuple[str, ...]) -> dict:
    return {inspect.unwrap(getattr(dist, n)).__code__: n for n in names if getattr(dist, n, None) is not None}


class GatherWatch:
    """The gathers, waits and reduce-scatters made in one thread inside `watch_gathers()`, per phase."""

    def __init__(self, settle_to: int, settle_s: float):
        self.settle_to, self.settle_s = settle_to, settle_s
        self.current = "forward"
        self.events: list[tuple] = []  # ("gather", phase, dtype, async) / ("wait", phase, in_flight, alive)
        self.scatter_dtypes: list = []  # the reduce-scatter inputs' dtypes
        self.sync_gathers = 0  # gathers called without async_op=True: nothing overlaps them
        self._bufs: list[weakref.ref] = []  # the gathered outputs' storages
        self._pending: collections.deque[int] = collections.deque()  # async gathers issued, not yet waited
        self._waited = 0

    def phase(self, name: str) -> None:
        self.current = name

    def alive(self) -> int:
        return sum(r() is not None for r in self._bufs)

    def _settled_alive(self) -> int:
        deadline = time.perf_counter() + self.settle_s
        while self.alive() > self.settle_to and time.perf_counter() < deadline:
            time.sleep(0.001)
        if self.alive() > self.settle_to:
            self.settle_s = 0.0  # the excess is the code's, not gloo's: measured once, no more waiting
        return self.alive()

    def _gather(self, frame) -> None:
        args = frame.f_locals
        out, inp = args.get("output_tensor"), args.get("input_tensor")
        is_async = bool(args.get("async_op", False))
        self.sync_gathers += not is_async
        if is_async:
            self._pending.append(len(self.events))
        self.events.append(("gather", self.current, getattr(inp, "dtype", None), is_async))
        try:
            self._bufs.append(weakref.ref(out.untyped_storage()))
        except (AttributeError, RuntimeError, TypeError):  # not a plain tensor: the call itself will complain
            pass

    def _wait(self) -> None:
        if not self._pending:
            return  # a wait on something else (a reduce-scatter's handle)
        self._pending.popleft()
        self._waited += 1
        in_flight = len(self._pending)  # issued, not waited: the gathers running ahead of this layer
        self.events.append(("wait", self.current, in_flight, self._settled_alive()))

    def _of(self, kind: str, phase: str | None) -> list[tuple]:
        return [e for e in self.events if e[0] == kind and (phase is None or e[1] == phase)]

    def max_in_flight(self, phase: str | None = None) -> int:
        return max((e[2] for e in self._of("wait", phase)), default=0)

    def max_alive(self, phase: str | None = None) -> int:
        return max((e[3] for e in self._of("wait", phase)), default=0)

    def gathers(self, phase: str | None = None) -> int:
        return len(self._of("gather", phase))

    def dtypes(self, kind: str) -> set:
        return set(self.scatter_dtypes) if kind == "reduce_scatter" else {e[2] for e in self._of("gather", None)}

    @property
    def unwaited(self) -> int:
        """Async gathers whose handle was never waited: their buffer was read before it surely arrived."""
        return sum(e[3] for e in self._of("gather", None)) - self._waited


@contextlib.contextmanager
def watch_gathers(settle_to: int = 1, settle_s: float = 1.0) -> Iterator[GatherWatch]:
    """Record this thread's all-gathers (dtype, async, handle waits, buffers alive) and reduce-scatters."""
    gathers, scatters = _codes(_GATHERS), _codes(_SCATTERS)
    w, depth = GatherWatch(settle_to, settle_s), [0]

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and (code in gathers or code in scatters):
            if depth[0] == 0:
                if code in gathers:
                    w._gather(frame)
                else:
                    w.scatter_dtypes.append(getattr(frame.f_locals.get("input"), "dtype", None))
            depth[0] += 1
        elif event == "return" and (code in gathers or code in scatters):
            depth[0] -= 1
        elif event == "c_call" and getattr(arg, "__name__", "") == "wait" and _WORK in (getattr(arg, "__doc__", "") or ""):
            w._wait()

    previous = sys.getprofile()
    sys.setprofile(profile if previous is None else (lambda f, e, a: (profile(f, e, a), previous(f, e, a))[1]))
    try:
        yield w
    finally:
        sys.setprofile(previous)
