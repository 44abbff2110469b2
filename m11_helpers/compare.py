"""The largest difference from the reference (kit): the one number behind every "equal to one process" claim.

    max_diff(y, ref)                                   # max |y − ref| over every element, a float
    max_diff([p.grad for p in model.parameters()],     # over pairs of tensors: the worst pair
             [q.grad for q in ref.parameters()])
    max_diff({"w": g}, {"w": g_ref})                   # dicts with the same keys, pair by pair

max_diff(a, b) = max over elements of |a − b| (the ∞-norm of the difference, in torch's promoted dtype). A
DTensor (FSDP2's shards, tensor parallelism) is compared by its `full_tensor()`; tensors are
detached. Shapes must match exactly (broadcasting would compare a shard with the whole), and so
must the number of tensors or the keys: a mismatch is a ValueError naming what differs. Lessons
print it and tests bound it; `torch.testing.assert_close` stays the assertion where only pass/fail matters.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["max_diff"]


def _full(t: Any) -> torch.Tensor:
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"got must hold tensors (or DTensors), got {type(t).__name__}")
    return t.detach()


def max_diff(got: Any, want: Any) -> float:
    """max |got − want| over every element of a tensor, of paired tensors in two sequences, or of two dicts."""
    if isinstance(got, dict) or isinstance(want, dict):
        keys = [sorted(map(str, d)) if isinstance(d, dict) else type(d).__name__ for d in (got, want)]
        if keys[0] != keys[1]:
            raise ValueError(f"got and want must be dicts with the same keys, got {keys[0]} and {keys[1]}")
        return max_diff([got[k] for k in got], [want[k] for k in got])
    if isinstance(got, torch.Tensor) or hasattr(got, "full_tensor"):
        a, b = _full(got), _full(want)
        if a.shape != b.shape:
            raise ValueError(f"got and want must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
        return (a - b).abs().max().item() if a.numel() else 0.0
    got, want = list(got), list(want)
    if len(got) != len(want):
        raise ValueError(f"got and want must hold as many tensors, got {len(got)} and {len(want)}")
    return max((max_diff(a, b) for a, b in zip(got, want)), default=0.0)
