"""Offloading saved activations to host memory: what `torch.autograd.graph.save_on_cpu` moves, and a leaner hook.

    with record_offload(*save_on_cpu_hooks(), model) as log:     # PyTorch's own offload, watched
        loss = model(idx, targets)
    log.copied_bytes, log.param_bytes_copied, log.host_bytes()  # bytes sent to the host, weights among them
    pack, unpack = offload_hooks(model)                         # activations only: parameters stay put

`saved_tensors_hooks(pack, unpack)` is the mechanism under checkpointing, offload and the course's
memory tracker: every tensor autograd saves for backward goes through `pack`, and `unpack` returns it
when backward needs it. `save_on_cpu` packs a host copy of *every* saved tensor (PyTorch docs,
torch.autograd.graph.save_on_cpu): with `pin_memory=True` it copies even on a CPU, as it does from a
GPU. Among the saves are the weights: a Linear saves `weight.t()` (a view, not the Parameter), so every
step copies the model's matmul weights to the host and back, and a tensor saved by two ops is copied
twice. `offload_hooks` leaves anything that shares a parameter's (or buffer's) storage on the device. On a GPU the
copies cross PCIe twice per step (out in forward, back in backward); on a CPU, where the device *is* the
host, the copies only show what would move. Lesson 08, exercise 8.3.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from m11_helpers.memory import param_storage_ptrs

__all__ = ["OffloadLog", "record_offload", "save_on_cpu_hooks", "offload_hooks"]


def _key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors inside what a pack hook returned (a tensor, or tuples/lists/dicts holding some)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


@dataclass
class OffloadLog:
    """Every pack call of one block: what was saved, whether a copy left the original's storage, how many bytes."""

    params: set = field(default_factory=set)  # storage keys of the watched modules' parameters and buffers
    saves: list = field(default_factory=list)  # (nbytes, is_parameter, copied, shape) per pack call
    handles: int = 0  # pack calls that returned no tensor at all (a key into a store the hook keeps itself)
    storages: list = field(default_factory=list)  # nbytes of every distinct activation storage saved
    _seen: dict = field(default_factory=dict, repr=False)  # id(storage) -> weak ref: storages already counted
    _host: dict = field(default_factory=dict, repr=False)  # id(storage) -> (weak ref, nbytes) of the copies made

    @property
    def copied_bytes(self) -> int:
        """Bytes the hook copied out of the device's tensors (every pack that did not keep the original)."""
        return sum(n for n, _, copied, _ in self.saves if copied)

    @property
    def param_bytes_copied(self) -> int:
        """Bytes of parameters and buffers (or views of them) the hook copied: they live on the device anyway."""
        return sum(n for n, is_param, copied, _ in self.saves if is_param and copied)

    @property
    def activations_left(self) -> list[tuple]:
        """Shapes of the activations (not parameters) the hook kept as they were: they stay on the device."""
        return [shape for _, is_param, copied, shape in self.saves if not is_param and not copied]

    @property
    def activation_bytes(self) -> int:
        """Bytes of the distinct activation storages saved (what `memory.track_saved_tensors` counts)."""
        return sum(self.storages)

    def host_bytes(self) -> int:
        """Bytes of the copies that are still alive (the host memory the offload holds now)."""
        total = 0
        for ref, n in self._host.values():
            if ref() is not None:
                total += n
        return total

    def _record(self, t: torch.Tensor, packed: Any) -> None:
        out = _tensors(packed)
        self.handles += not out
        mine = _key(t)
        copied = bool(out) and all(_key(o) != mine for o in out)
        self.saves.append((t.numel() * t.element_size(), mine in self.params, copied, tuple(t.shape)))
        storage = t.untyped_storage()
        seen = self._seen.get(id(storage))
        if mine not in self.params and (seen is None or seen() is not storage):  # ids of dead storages are reused
            self._seen[id(storage)] = weakref.ref(storage)
            self.storages.append(storage.nbytes())
        for o in out if copied else ():
            storage = o.untyped_storage()
            known = self._host.get(id(storage))
            if known is None or known[0]() is not storage:
                self._host[id(storage)] = (weakref.ref(storage), storage.nbytes())


@contextlib.contextmanager
def record_offload(pack: Callable, unpack: Callable, *modules: nn.Module) -> Iterator[OffloadLog]:
    """Run the block under saved_tensors_hooks(pack, unpack), logging every pack; `modules` name the parameters."""
    if not (callable(pack) and callable(unpack)):
        raise ValueError("pack and unpack must be callables (a saved_tensors_hooks pair)")
    log = OffloadLog(params=param_storage_ptrs(modules))

    def watched(t: torch.Tensor) -> Any:
        packed = pack(t)
        log._record(t, packed)
        return packed

    with torch.autograd.graph.saved_tensors_hooks(watched, unpack):
        yield log


def save_on_cpu_hooks(pin_memory: bool = True) -> tuple[Callable, Callable]:
    """PyTorch's own offload as a (pack, unpack) pair. pin_memory=True copies on a CPU too (without a GPU,
    pinned memory is ordinary memory); pin_memory=False on a CPU copies nothing (`tensor.cpu()` is itself)."""
    hooks = torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
    return hooks.pack_hook, hooks.unpack_hook


def offload_hooks(model: nn.Module) -> tuple[Callable, Callable]:
    """Offload saved activations to the host; anything sharing a parameter's or buffer's storage stays where it is."""
    params = param_storage_ptrs([model])

    def pack(t: torch.Tensor):
        if _key(t) in params:  # a parameter or buffer, or a view of one (a Linear saves weight.t()): on the device
            return None, t
        pinned = t.device.type != "cpu" and torch.cuda.is_available()  # pinned host memory: asynchronous copies
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=pinned)
        host.copy_(t, non_blocking=pinned)  # a copy even on a CPU, where .cpu() would return t itself
        return t.device, host

    def unpack(packed):
        device, t = packed
        return t if device is None else t.to(device, non_blocking=True)

    return pack, unpack
