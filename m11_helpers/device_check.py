"""Device mistakes made visible on a CPU: a buffer made without `device=` that reaches a collective fails here as on NCCL.

On CPU ranks gloo takes any CPU tensor, so `torch.empty(n)` and `x.new_empty(n)` look the same; on GPUs
NCCL rejects the first ("No backend type associated with device type cpu"). Inside a checked rank a
`TorchFunctionMode` tags every tensor that a factory call in user code (not torch's own) makes without
`device=`, the tag follows it through ops whose every tensor input is tagged (a view, a `.float()`, a
`new_empty`, a `zeros_like`), and each torch.distributed collective raises `DeviceError` naming where
the tensor was made. The ways out are the ones a GPU needs: `device=x.device`, `x.new_*`, `*_like(x)`,
`.to(device)`.

Used by every rank `launch()` forks and every script rank that imports `m11_helpers.launch` when
M11_STRICT=1 (the suite's strict mode) or M11_DEVICE_CHECK=1 (`check_ranks()` sets it: the exercises whose
buffers meet a collective call it); `checked()` turns it on for a block of this process.
Lessons 02-12 (rank code); the static half is `m11_helpers.device_lint`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["DeviceError", "DeviceCheck", "check_ranks", "checked", "enabled", "install", "origin"]

NCCL_ERROR = ("NCCL rejects it on a GPU: \"No backend type associated with device type cpu\" "
              "(older torch: \"Tensors must be CUDA and dense\")")

_FACTORIES = {getattr(torch, n) for n in (
    "empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "linspace", "logspace", "eye",
    "rand", "randn", "randint", "randperm", "empty_strided", "from_numpy", "scalar_tensor")}
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type}  # with a device: the way out
# The collectives and point-to-point calls a rank's tensors go through (objects are moved by torch itself).
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
               "all_to_all_single", "send", "recv", "isend", "irecv", "gather", "scatter", "batch_isend_irecv",
               "all_reduce_coalesced", "all_gather_coalesced", "reduce_scatter_single", "all_gather_single")
_TORCH_DIR = os.path.dirname(torch.__file__)
_ENV = ("M11_STRICT", "M11_DEVICE_CHECK")


class DeviceError(RuntimeError):
    """A tensor made without a device reached a collective: gloo would take it, NCCL would not."""


# tensor -> "file:line" of its factory call, made by the first check: a process that only launches (a
# notebook's kernel, whose kit modules the grader's guard compares with a fresh import) holds none
_registry: list = []


def _origins() -> WeakIdKeyDictionary:
    if not _registry:
        _registry.append(WeakIdKeyDictionary())
    return _registry[0]


def origin(t: torch.Tensor) -> str | None:
    """Where `t` (or the tensor it derives from) was made without a device, or None."""
    return _registry[0].get(t) if _registry else None


def _caller() -> str | None:
    """file:line of the user code that called the factory; None when torch (or the stdlib) called it."""
    f = sys._getframe(2)
    name = f.f_code.co_filename
    if name.startswith(_TORCH_DIR) or "/site-packages/" in name and "/m11_helpers/" not in name:
        return None
    return f"{name}:{f.f_lineno}"


def _tensors(args: Any, kwargs: dict) -> Iterator[torch.Tensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (b for b in a if isinstance(b, torch.Tensor))


class DeviceCheck(TorchFunctionMode):
    """Tag tensors made without a device in user code; carry the tag through ops on tagged inputs only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, origins = kwargs or {}, _origins()
        out = func(*args, **kwargs)
        if func in _FACTORIES:
            if kwargs.get("device") is None and isinstance(out, torch.Tensor) and out.device.type == "cpu" \
                    and not (args and isinstance(args[0], torch.Tensor)):
                where = _caller()
                if where:
                    origins[out] = where
            return out
        if not origins:
            return out
        if isinstance(out, torch.Tensor):
            if func in _MOVES and ("device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:])):
                origins.pop(out, None)  # moved to a device on purpose (on CPU `.to("cpu")` may return itself)
                return out
            outs: tuple = (out,)
        elif isinstance(out, (tuple, list)):  # chunk, split, unbind: every piece lives where its source does
            outs = tuple(t for t in out if isinstance(t, torch.Tensor))
        else:
            return out
        found = [origins.get(t) for t in _tensors(args, kwargs)]
        if found and all(found):
            for t in outs:
                if t not in origins:
                    origins[t] = found[0]
        return out


_cpu_groups: list = []  # groups made with backend="gloo" on purpose (a CPU side channel even under NCCL)


def _check(name: str, args: tuple, kwargs: dict) -> None:
    group = kwargs.get("group")
    if group is not None and any(group is g for g in _cpu_groups):
        return  # CPU tensors are right there
    for a in (*args, *kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        for t in items:
            t = getattr(t, "tensor", t)  # a P2POp of batch_isend_irecv
            where = origin(t) if isinstance(t, torch.Tensor) else None
            if where:
                raise DeviceError(  # NCCL's words first: a launcher's one-line summary keeps 200 characters
                    f"dist.{name}() fails on GPUs with NCCL's \"No backend type associated with device type cpu\" "
                    f"(older torch: \"Tensors must be CUDA and dense\"): its tensor was made without a device at "
                    f"{where} (gloo takes it). Make it on the data's device: x.new_empty(...), "
                    f"torch.zeros_like(x), device=x.device, or launch.rank_device()")


def _guard(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _check(name, args, kwargs)
        return fn(*args, **kwargs)
    wrapper.__m11_checked__ = True
    return wrapper


def _new_group(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        group = fn(*args, **kwargs)
        if "gloo" in str(kwargs.get("backend") or (args[2] if len(args) > 2 else "")).lower():
            _cpu_groups.append(group)
        return group
    wrapper.__m11_checked__ = True
    return wrapper


def _patch() -> None:
    from torch.distributed import distributed_c10d as c10d

    if not getattr(c10d.new_group, "__m11_checked__", False):
        c10d.new_group = dist.new_group = _new_group(c10d.new_group)

    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is not None and not getattr(fn, "__m11_checked__", False):
            wrapped = _guard(name, fn)  # one object in both places: P2POp checks `op in [isend, irecv]`
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, wrapped)


def enabled() -> bool:
    """True when this process's ranks are checked (M11_STRICT=1 or M11_DEVICE_CHECK=1)."""
    return any(os.environ.get(k) == "1" for k in _ENV)


def check_ranks() -> None:
    """Check every rank this process launches from now on (the graded notebooks' import cell calls it)."""
    os.environ["M11_DEVICE_CHECK"] = "1"


_installed: list[DeviceCheck] = []


def install() -> None:
    """Check this process for the rest of its life (a rank): patch the collectives, enter the mode."""
    if _installed:
        return
    _patch()
    mode = DeviceCheck()
    mode.__enter__()
    _installed.append(mode)


@contextlib.contextmanager
def checked() -> Iterator[None]:
    """Check the block (a test, a grader's call of a learner's rank function)."""
    _patch()
    with DeviceCheck():
        yield
