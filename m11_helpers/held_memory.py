"""Where the bytes of mixed-precision training go, measured from the tensors themselves (lesson 06).

    held_state_bytes(model, opt)             # weights, grads, master copy, optimizer state: bytes held now
    autocast_weight_copy_bytes(model, idx)   # the 16-bit weight copies autocast saves for backward

The figures to compare with come from the one helper that owns them: `m11_helpers.model_states`
(bytes per parameter of each layout: ZeRO §3.1 for the 16-bit ones) and `m11_helpers.activations`
(`autocast=True`: its `weight_copies` term). Each storage is counted once, so views and shared
tensors do not inflate the sums.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["held_state_bytes", "autocast_weight_copy_bytes"]


def _key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _optimizer_tensors(obj, found: list, seen: set) -> None:
    """(tensor, "state" | "copy") for every tensor reachable from `obj`'s attributes, containers and optimizers."""
    if id(obj) in seen or isinstance(obj, (nn.Module, type, str, bytes, int, float)) or callable(obj) and not \
            isinstance(obj, torch.optim.Optimizer):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found.append((obj, "copy"))
        if obj.grad is not None:
            found.append((obj.grad, "copy"))
    elif isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():  # exp_avg, exp_avg_sq, step: the optimizer's own memory
            found.extend((t, "state") for t in state.values() if isinstance(t, torch.Tensor))
        _optimizer_tensors(obj.param_groups, found, seen)
    elif isinstance(obj, dict):
        for v in obj.values():
            _optimizer_tensors(v, found, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _optimizer_tensors(v, found, seen)
    elif hasattr(obj, "__dict__"):
        _optimizer_tensors(vars(obj), found, seen)


def held_state_bytes(model: nn.Module, optimizer) -> dict[str, int]:
    """Bytes held now, by part: weights (model parameters), grads (their .grad), master (other tensors the
    optimizer keeps: weight copies and their grads), optimizer (its state), other (AdamW's 0-dim step counters).

    Measured from the tensors, each storage counted once: compare with `model_states.bytes_per_param`.
    """
    out = dict.fromkeys(("weights", "grads", "master", "optimizer", "other"), 0)
    seen: set = set()

    def add(part: str, t: torch.Tensor) -> None:
        if _key(t) not in seen:
            seen.add(_key(t))
            out[part] += t.untyped_storage().nbytes()

    params = list(model.parameters())
    for p in params:
        add("weights", p)
    for p in params:
        if p.grad is not None:
            add("grads", p.grad)
    found: list = []
    _optimizer_tensors(optimizer, found, set())
    for t, where in found:
        add("other" if t.dim() == 0 else "optimizer" if where == "state" else "master", t)
    out["total"] = sum(out[p] for p in ("weights", "grads", "master", "optimizer"))
    return out


def autocast_weight_copy_bytes(model: nn.Module, *inputs, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the 16-bit weight copies autocast saves for backward in one forward of `model(*inputs)`."""
    copies: dict = {}

    def pack(t: torch.Tensor):
        base = t if t._base is None else t._base  # matmuls save a transposed view of the copy
        fn = base.grad_fn  # a cast of a leaf (a parameter) is a weight copy, not an activation
        if fn is not None and type(fn).__name__ == "ToCopyBackward0" and any(
                f is not None and type(f).__name__ == "AccumulateGrad" for f, _ in fn.next_functions):
            copies[_key(t)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=dtype):
        model(*inputs)
    return sum(copies.values())
