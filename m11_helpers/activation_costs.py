"""What an activation-memory policy costs, measured exactly on CPU: bytes kept after forward, the peak, FLOPs, time.

    rows = measure_policies(model, idx, targets, {"none": plain, "blocks": every_block})
    rows[1]["retained"], rows[1]["peak"], rows[1]["transient"]    # bytes; peak − retained = what backward adds

Memory comes from `m11_helpers.live_memory` (every tensor the step's ops allocate and still hold, seen
through a TorchDispatchMode): unlike the saved-tensor hooks of `m11_helpers.memory`, it also sees what
PyTorch's selective checkpointing caches and what an offload hook copies to the host, and it gives the
transient peak while backward recomputes. For a policy whose saves all go through autograd's hooks the two
measurements agree byte for byte (tests/test_activation_checkpointing.py). Parameter gradients are
allocated before the step, so the peak is the activations' (and their gradients'), not the weights'.
FLOPs are torch.utils.flop_counter's (matmuls and convolutions; SDPA's CPU kernel is not counted).
Lesson 08.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from m11_helpers.live_memory import track_live_bytes
from m11_helpers.timing import time_it
from m11_helpers.validate import non_negative_int, positive_int, positive_real

__all__ = ["Forward", "measure_step", "step_flops", "step_seconds", "measure_policies", "choose_policy"]

Forward = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # (model, idx, targets) -> loss


def _grads_allocated(model: nn.Module) -> None:
    """Zero .grad buffers that exist before the step: backward accumulates into them in place."""
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()


def measure_step(model: nn.Module, forward: Forward, idx: torch.Tensor, targets: torch.Tensor, *,
                 host: Callable[[], int] | None = None) -> dict:
    """One forward + backward: bytes retained after forward (the loss excluded), the peak of the step, transient.

    `host()` (optional) returns the bytes an offload hook holds in host memory after forward: they are counted
    apart ("host") and left out of "retained", which is what stays on the device.
    """
    _grads_allocated(model)
    with track_live_bytes() as mem:
        i, t = idx.clone(), targets.clone()  # made inside the block: the ids the graph keeps count too
        loss = forward(model, i, t)
        on_host = host() if host is not None else 0
        retained = mem.now() - loss.untyped_storage().nbytes() - on_host
        mem.phase("backward")
        loss.backward()
    peak = mem.peak - on_host
    return {"retained": retained, "peak": peak, "transient": peak - retained, "host": on_host}


def step_flops(model: nn.Module, forward: Forward, idx: torch.Tensor, targets: torch.Tensor) -> int:
    """Matmul FLOPs of one forward + backward (recomputation included), counted by torch's FlopCounterMode."""
    with FlopCounterMode(display=False) as counter:
        forward(model, idx, targets).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def step_seconds(model: nn.Module, forward: Forward, idx: torch.Tensor, targets: torch.Tensor, *,
                 repeats: int = 5) -> float:
    """Median seconds of forward + backward over `repeats` runs after one warm-up (m11_helpers.timing)."""
    def step():
        forward(model, idx, targets).backward()

    seconds = time_it(step, repeats=positive_int("repeats", repeats), warmup=1).median
    model.zero_grad(set_to_none=True)
    return seconds


def measure_policies(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, policies: dict[str, Forward], *,
                     repeats: int = 0, flops: bool = False) -> list[dict]:
    """measure_step for each named forward, in order; + "seconds" when repeats > 0, + "flops" when asked."""
    non_negative_int("repeats", repeats)
    rows = []
    for name, forward in policies.items():
        row = {"policy": name, **measure_step(model, forward, idx, targets)}
        if flops:
            row["flops"] = step_flops(model, forward, idx, targets)
        if repeats:
            row["seconds"] = step_seconds(model, forward, idx, targets, repeats=repeats)
        rows.append(row)
    model.zero_grad(set_to_none=True)
    return rows


def choose_policy(rows: list[dict], budget_bytes: float) -> dict | None:
    """The fastest row whose peak fits the budget (ties: less memory); None when nothing fits."""
    positive_real("budget_bytes", budget_bytes)
    fits = [r for r in rows if r["peak"] <= budget_bytes]
    return min(fits, key=lambda r: (r.get("seconds", 0.0), r["peak"])) if fits else None
