"""The NaN hunter: which module first produced an inf or a NaN, and which gradients hold one (lesson 06).

    hit = find_first_nonfinite(model, idx)   # e.g. "blocks.1.mlp.fc (Linear) produced inf"; None if all finite
    nonfinite_grads(model)                   # names of the parameters whose .grad holds inf/NaN

Forward hooks fire when a module finishes, leaves before their parents, so the first hit is the
innermost module that produced the value; run it under the same autocast as training (an FP16
overflow appears only there). GradScaler's skipped steps say *that* a gradient overflowed; this says where.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

__all__ = ["NonFinite", "find_first_nonfinite", "nonfinite_grads"]


@dataclasses.dataclass(frozen=True)
class NonFinite:
    module: str  # dotted name, e.g. "blocks.1.mlp.fc"
    type: str  # e.g. "Linear"
    inputs_finite: bool  # True: this module *created* the inf/NaN; False: it only passed one on
    kind: str  # "inf", "nan" or "inf+nan"

    def __str__(self) -> str:
        how = "produced" if self.inputs_finite else "received and passed on"
        return f"{self.module} ({self.type}) {how} {self.kind}"


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _kind(ts: list[torch.Tensor]) -> str | None:
    nan = any(bool(torch.isnan(t).any()) for t in ts)
    inf = any(bool(torch.isinf(t).any()) for t in ts)
    return "inf+nan" if nan and inf else "nan" if nan else "inf" if inf else None


def find_first_nonfinite(model: nn.Module, *inputs, **kwargs) -> NonFinite | None:
    """Run `model(*inputs)` with a forward hook on every module; the first to finish with inf/NaN output, or None.

    Hooks fire when a module *finishes*, so leaf modules report before their parents: the first hit
    is the innermost module that produced the value. Run it under the same autocast as training.
    """
    hits: list[NonFinite] = []

    def hook(mod, args, out, name):
        if hits:
            return
        kind = _kind(_tensors(out))
        if kind:
            hits.append(NonFinite(name or "(model)", type(mod).__name__, _kind(_tensors(args)) is None, kind))

    handles = [m.register_forward_hook(lambda mod, a, o, n=n: hook(mod, a, o, n)) for n, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return hits[0] if hits else None


def nonfinite_grads(model: nn.Module) -> list[str]:
    """Names of the parameters whose .grad holds inf or NaN (after backward, before the optimizer step)."""
    return [n for n, p in model.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
