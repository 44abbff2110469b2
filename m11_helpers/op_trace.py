"""Watch what a call really runs, op by op: the ATen ops it dispatches and the largest tensor it builds (lesson 09).

    seen = trace_dispatch(my_attention, q, k, v)   # seen.out, seen.ops, seen.largest_numel, seen.largest_shape
    largest_intermediate(naive_attention, q, k, v)  # (numel, shape): did it build the (s × s) matrix?

A `TorchDispatchMode` sees every op below autograd however it was reached (`F.scaled_dot_product_attention`,
`torch.ops.aten...`, `nn.MultiheadAttention`), so a check can tell which kernels ran and what was
materialised, not only what came out: exercise 9.2's check, and which SDPA backend this build picks.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DispatchTrace", "trace_dispatch", "largest_intermediate"]


class DispatchTrace(NamedTuple):
    """What one call did, seen op by op: its result, its largest tensor and the ATen ops it ran."""

    out: object
    largest_numel: int
    largest_shape: tuple
    ops: frozenset  # ATen op names, e.g. "mm", "_scaled_dot_product_flash_attention_for_cpu"


def trace_dispatch(fn, *inputs, no_grad: bool = True, **kwargs) -> DispatchTrace:
    """Run fn(*inputs, **kwargs) (under no_grad unless no_grad=False) and watch every ATen op it dispatches.

    A mode sees the ops however they were reached — `F.scaled_dot_product_attention`,
    `torch.ops.aten...`, `nn.MultiheadAttention` — so a check can tell which kernels ran and whether
    an (s × s) matrix was ever built, not only what came out.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    best, ops = [0, ()], set()

    class _Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kw=None):
            out = func(*args, **(kw or {}))
            ops.add(func.__name__.split(".")[0])  # "mm.default" -> "mm"
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.numel() > best[0]:
                    best[:] = [t.numel(), tuple(t.shape)]
            return out

    with torch.no_grad() if no_grad else contextlib.nullcontext(), _Watch():
        out = fn(*inputs, **kwargs)
    return DispatchTrace(out, best[0], best[1], frozenset(ops))


def largest_intermediate(fn, *inputs, **kwargs) -> tuple[int, tuple]:
    """(numel, shape) of the largest tensor any op inside fn(*inputs) produced: did it build the s×s matrix?"""
    t = trace_dispatch(fn, *inputs, **kwargs)
    return t.largest_numel, t.largest_shape
