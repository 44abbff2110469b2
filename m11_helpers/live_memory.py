"""Tensor memory alive at each moment, measured on CPU: what a block allocates, what it frees, the peak.

    with track_live_bytes() as mem:          # in one process, or inside one rank started by launch()
        y = model(x)
        mem.phase("after forward")           # later peaks are counted under this name
        y.sum().backward()
    mem.peaks["start"], mem.peaks["after forward"], mem.peak, mem.now()

A CPU has no allocator statistics (`torch.cuda.memory_allocated` has no CPU twin; RSS and tracemalloc
see the process, not tensors), so this watches the tensors themselves: a `TorchDispatchMode` sees
every ATen op, and each plain tensor an op returns is remembered by a weak reference to its
*storage* (views and in-place results share one storage, and FSDP2's `storage.resize_` changes a
storage's size without a new tensor). After every op the bytes of the storages still alive are
summed; the peak per phase is the largest such sum. What existed before the block (parameters,
inputs, a shard, found with `gc` when the block starts) counts only by what it grew (a storage
resized from 0 to a full layer counts the layer), so views of a weight or an `out=` buffer made
earlier cost nothing. Exact and deterministic: the bytes the block's own ops allocated and still hold
(tensor subclasses such as DTensor are seen through the plain tensors their ops create). Lesson 05
measures ZeRO-3's "one layer at a time" with it, on FSDP2 and on the learner's own implementation.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Iterator

import torch

try:  # an underscore module, but the documented way to see every ATen op (PyTorch docs, "TorchDispatchMode")
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError as err:  # pragma: no cover - every torch the course supports (>= 2.6) has it
    raise ImportError(f"m11_helpers.live_memory needs torch.utils._python_dispatch.TorchDispatchMode, which torch "
                      f"{torch.__version__} does not have: {err}") from err

__all__ = ["LiveBytes", "track_live_bytes", "warm_up"]


def _tensors(out) -> Iterator[torch.Tensor]:
    """The tensors in an op's result (a tensor, or tuples/lists of them)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)


def _storage(t: torch.Tensor):
    """The tensor's storage (one Python object per storage while it lives: PyObject preservation), or None."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
        return None


def _ref(storage, table: dict) -> weakref.ref:
    """A weak reference that removes the storage's entry from `table` when the storage dies."""
    key = id(storage)
    return weakref.ref(storage, lambda _: table.pop(key, None))


class LiveBytes(TorchDispatchMode):
    """The storages the block's ops returned, alive or not; `peaks[phase]` is the largest live sum seen."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, tuple[weakref.ref, int]] = {}  # id(storage) -> (weak ref, bytes it had before)
        self._before: dict[int, tuple[weakref.ref, int]] = {}  # storages alive when the block started
        self.peaks: dict[str, int] = {"start": 0}
        self.current = "start"
        self.ops = 0

    def __enter__(self):
        for obj in gc.get_objects():  # every tensor alive now: what its storage holds is the baseline
            if type(obj) in (torch.Tensor, torch.nn.Parameter):  # type(), not isinstance(): no __class__ lookups
                storage = _storage(obj)
                if storage is not None and id(storage) not in self._before:
                    self._before[id(storage)] = (_ref(storage, self._before), storage.nbytes())
        return super().__enter__()

    def phase(self, name: str) -> None:
        """Count later peaks under `name` (its peak starts from what is alive now)."""
        self.current = name
        self.peaks[name] = max(self.peaks.get(name, 0), self.now())

    def now(self) -> int:
        """Bytes the block added and still holds (a storage resized in the block counts its growth)."""
        total = 0
        for ref, before in list(self._live.values()):
            storage = ref()
            if storage is not None:
                total += max(0, storage.nbytes() - before)
        return total

    @property
    def peak(self) -> int:
        return max(self.peaks.values())

    def _remember(self, t: torch.Tensor) -> None:
        storage = _storage(t)
        if storage is None or id(storage) in self._live:
            return
        old = self._before.get(id(storage))
        before = old[1] if old is not None and old[0]() is storage else 0
        self._live[id(storage)] = (_ref(storage, self._live), before)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in _tensors(out):
            if type(t) is torch.Tensor and t.device.type != "meta":
                self._remember(t)
        now = self.now()
        if now > self.peaks.get(self.current, 0):
            self.peaks[self.current] = now
        return out


@contextlib.contextmanager
def track_live_bytes() -> Iterator[LiveBytes]:
    """Measure the tensor memory the block allocates (see the module docstring); yields the `LiveBytes`."""
    mem = LiveBytes()
    with mem:
        yield mem


def warm_up() -> None:
    """Enter a dispatch mode once: the first entry imports torch._dynamo (seconds), which forked ranks then inherit."""
    with track_live_bytes():
        torch.zeros(1)
