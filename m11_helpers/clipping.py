"""Gradient clipping by global norm, and the loss spike it prevents (lesson 06).

    total = clip_grad_norm_global_(model.parameters(), max_norm=1.0)   # == torch.nn.utils.clip_grad_norm_
    norm = sharded_grad_norm(my_params)          # the global norm when each rank holds a shard of the grads
    losses = loss_spike_run(max_norm=1.0)        # training with one bad batch, clipped or not

Source: Pascanu, Mikolov & Bengio 2013, "On the difficulty of training recurrent neural networks",
§3.2 (rescale the whole gradient when its norm exceeds a threshold).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from m11_helpers.validate import positive_real

__all__ = ["global_grad_norm", "clip_grad_norm_global_", "sharded_grad_norm", "loss_spike_run"]


def _grads(params: Iterable[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    if isinstance(params, torch.Tensor):
        params = [params]
    return [p.grad for p in params if p.grad is not None]


def global_grad_norm(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """‖g‖ = sqrt(Σ_p ‖g_p‖²) over every parameter's gradient (one norm for the whole model, not one per tensor)."""
    grads = _grads(params)
    if not grads:
        return torch.tensor(0.0)
    # norms per tensor in fp32, then the norm of the norms: equal to the norm of the concatenation
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))


def clip_grad_norm_global_(params: Iterable[torch.Tensor], max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """g ← g·min(1, max_norm/(‖g‖+ε)) (Pascanu et al. 2013, §3.2, Alg. 1); returns ‖g‖ before clipping."""
    positive_real("max_norm", max_norm)
    params = list(params) if not isinstance(params, torch.Tensor) else [params]
    total = global_grad_norm(params)
    coef = torch.clamp(max_norm / (total + eps), max=1.0)  # never scale *up* a small gradient
    for g in _grads(params):
        g.mul_(coef.to(g.dtype))  # the same factor for every tensor keeps the direction
    return total


def sharded_grad_norm(local_params: Iterable[torch.Tensor], group=None) -> torch.Tensor:
    """When each rank holds a shard of the gradients: ‖g‖ = sqrt(all_reduce(Σ_local ‖g_p‖²)), the same on every rank."""
    local = global_grad_norm(local_params) ** 2  # () sum of squares of this rank's shard
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    return local.sqrt()


# ----------------------------------------------------------------------------------------------
# A loss spike from one bad batch, with and without clipping
# ----------------------------------------------------------------------------------------------


def loss_spike_run(max_norm: float | None = None, steps: int = 60, bad_step: int = 20, bad_factor: float = 30.0,
                   lr: float = 0.05, seed: int = 0) -> dict[str, list[float]]:
    """SGD+momentum on the course MLP; at `bad_step` the targets are multiplied by `bad_factor` (a corrupt batch).

    Returns the clean-data loss after every step and the gradient norm seen at every step.
    """
    from m11_helpers.data import regression
    from m11_helpers.models import mlp

    if not 0 <= bad_step < steps:
        raise ValueError(f"bad_step must be in 0..{steps - 1}, got {bad_step}")
    x, y = regression(256, seed=seed).tensors  # (256, 16), (256, 4)
    model = mlp(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, norms = [], []
    for step in range(steps):
        i = torch.arange(step * 32, step * 32 + 32) % 256  # (32,) a fixed batch order
        target = y[i] * (bad_factor if step == bad_step else 1.0)
        loss = nn.functional.mse_loss(model(x[i]), target)
        opt.zero_grad()
        loss.backward()
        if max_norm is None:
            norms.append(global_grad_norm(model.parameters()).item())
        else:
            norms.append(clip_grad_norm_global_(model.parameters(), max_norm).item())
        opt.step()
        with torch.no_grad():
            losses.append(nn.functional.mse_loss(model(x), y).item())
    return {"loss": losses, "grad_norm": norms}
