"""Activation memory, measured exactly: the bytes autograd keeps alive for the backward pass.

    n = saved_activation_bytes(model, x)             # bytes saved by one forward of model(x)
    with track_saved_tensors(model) as t:            # or around any code
        loss = model(x, y)
    t.bytes, t.count, t.by_shape()

How: `torch.autograd.graph.saved_tensors_hooks` sees every tensor an op saves for backward. Many
saves share one buffer (a view, the same tensor saved by two ops), so tensors are deduplicated by
their storage and each storage is counted once, whole. Parameters (a Linear saves its weight) are
excluded: they exist whether or not you train. The result is exact and deterministic on CPU and GPU,
unlike RSS or tracemalloc, which see the allocator, not the graph (docs/cpu-distributed-facts.md).

What it does not see: tensors saved *inside* a `torch.utils.checkpoint` region (checkpointing installs
its own hooks, which win — that is exactly the memory it saves) and the transient peak while backward
recomputes a segment; `m11_helpers.activation_costs.measure_step` (lesson 08) measures that part with `live_memory`. Lessons 07, 08 and 09.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from m11_helpers.validate import non_negative_real

__all__ = ["SavedTensors", "track_saved_tensors", "saved_activation_bytes", "param_storage_ptrs", "format_bytes"]


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """(device, address) of the buffer behind `t`, or None when it has no plain storage."""
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage (DTensor wrappers, …)
        return None
    return (str(t.device), s.data_ptr())


def param_storage_ptrs(modules: Iterable[nn.Module | torch.Tensor]) -> set[tuple[str, int]]:
    """Storage keys of every parameter and buffer of `modules` (tensors are taken as they are)."""
    keys = set()
    for m in modules:
        tensors = [m] if isinstance(m, torch.Tensor) else [*m.parameters(), *m.buffers()]
        for t in tensors:
            key = _storage_key(t)
            if key is not None:
                keys.add(key)
    return keys


@dataclass
class SavedTensors:
    """What one `track_saved_tensors` block saw: unique activation storages and their sizes."""

    exclude: set = field(default_factory=set)
    storages: dict = field(default_factory=dict)  # key -> (nbytes, shape, dtype) of the first tensor seen
    saves: int = 0  # every pack call, duplicates included
    _keep: list = field(default_factory=list, repr=False)  # hold tensors so no address is reused mid-block

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.saves += 1
        key = _storage_key(t)
        if key is not None and key not in self.exclude and key not in self.storages:
            if not isinstance(t, nn.Parameter):
                self.storages[key] = (t.untyped_storage().nbytes(), tuple(t.shape), t.dtype)
                self._keep.append(t)
        return t  # store the tensor itself: the graph behaves exactly as without hooks

    @property
    def bytes(self) -> int:
        """Σ nbytes over unique saved storages (parameters excluded)."""
        return sum(n for n, _, _ in self.storages.values())

    @property
    def count(self) -> int:
        """Number of unique saved storages."""
        return len(self.storages)

    def by_shape(self) -> list[tuple[tuple, torch.dtype, int]]:
        """(shape, dtype, nbytes) per unique storage, largest first: what is taking the memory."""
        return sorted(((s, d, n) for n, s, d in self.storages.values()), key=lambda r: -r[2])

    def release(self) -> None:
        self._keep.clear()


@contextlib.contextmanager
def track_saved_tensors(*exclude: nn.Module | torch.Tensor) -> Iterator[SavedTensors]:
    """Record every tensor saved for backward inside the block, excluding `exclude`'s parameters/buffers."""
    tracker = SavedTensors(exclude=param_storage_ptrs(exclude))
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracker._pack, lambda t: t):
            yield tracker
    finally:
        tracker.release()  # the sizes stay; the references go, so the graph can be freed


def saved_activation_bytes(fn_or_model: Callable[..., Any], *inputs: Any, exclude: Iterable = (),
                           **kwargs: Any) -> int:
    """Bytes of activations one forward `fn_or_model(*inputs, **kwargs)` keeps for backward.

    Deduplicated by storage; parameters and buffers of `fn_or_model` (when it is a module) and of
    `exclude` are not counted. Inputs that autograd saves (e.g. the first Linear's input) are counted:
    they are held by the graph too. The forward runs with grad enabled; nothing is backpropagated.
    """
    if not callable(fn_or_model):
        raise ValueError(f"fn_or_model must be a callable or nn.Module, got {type(fn_or_model).__name__}")
    excluded = list(exclude) + ([fn_or_model] if isinstance(fn_or_model, nn.Module) else [])
    with torch.enable_grad(), track_saved_tensors(*excluded) as t:
        out = fn_or_model(*inputs, **kwargs)
    del out  # frees the graph
    return t.bytes


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as memory is allocated)."""
    non_negative_real("n", n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover
