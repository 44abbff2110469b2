"""Loss scaling, static and dynamic: GradScaler's rule from scratch, and runs that show it (lesson 06).

    scaler = DynamicLossScaler(growth_interval=4)      # torch.amp.GradScaler's behaviour, in plain Python
    scales, model = scaler_run(scaler, inject=(5, 11))  # fp16 training with overflows injected at those steps
    rows = overflow_run(init_scale=2.0**20)            # a real overflow: the tiny GPT with a too-high scale

Source: Micikevicius et al. 2018, "Mixed Precision Training" (ICLR), §3.2: multiply the loss by S so
small gradients stay in FP16's range, divide the weight gradients by S in FP32 before the update,
and choose S dynamically: skip the step and lower S on overflow, raise S after N clean steps.
PyTorch's `torch.amp.GradScaler` (torch/amp/grad_scaler.py) implements that rule with backoff 0.5,
growth 2 and N = 2000, starting at 2¹⁶.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from m11_helpers.validate import fraction, non_negative_int, positive_int, positive_real

__all__ = ["update_scale", "DynamicLossScaler", "scaler_run", "overflow_run"]


def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """Overflow: scale·backoff, tracker 0. Else tracker+1, and after `growth_interval` clean steps: scale·growth, tracker 0."""
    positive_int("growth_interval", growth_interval)
    non_negative_int("growth_tracker", growth_tracker)
    if positive_real("growth_factor", growth_factor) <= 1 or fraction("backoff_factor", backoff_factor) == 1:
        raise ValueError(f"growth_factor must be > 1 and backoff_factor < 1 (else the scale never moves), got "
                         f"{growth_factor}, {backoff_factor}")
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker + 1 == growth_interval:
        grown = scale * growth_factor
        # the scale lives in an fp32 tensor in GradScaler: never grow it past fp32's max (inf)
        return (grown if grown <= torch.finfo(torch.float32).max else scale), 0
    return scale, growth_tracker + 1


class DynamicLossScaler:
    """GradScaler from scratch: scale the loss, unscale and check grads, skip the step on inf/NaN, update the scale."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        positive_real("init_scale", init_scale)
        update_scale(init_scale, 0, False, growth_factor, backoff_factor, growth_interval)  # validates
        self.scale_value, self.growth_tracker = float(init_scale), 0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.found_inf = False
        self.skipped_steps = 0
        self._unscaled = False

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value  # lifts small gradients out of fp16's underflow zone

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide every grad by the scale in fp32 (before clipping!); remember whether any is inf/NaN."""
        inv = torch.tensor(1.0 / self.scale_value, dtype=torch.float64).float()  # as GradScaler: fp32 1/scale
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())
                    p.grad.mul_(inv)
        self.found_inf = found
        self._unscaled = True
        return found

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (unless done already) and step, or skip the step when a grad overflowed. Returns True if stepped."""
        if not self._unscaled:
            self.unscale_(optimizer)
        if self.found_inf:
            self.skipped_steps += 1
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        self.scale_value, self.growth_tracker = update_scale(
            self.scale_value, self.growth_tracker, self.found_inf, self.growth_factor, self.backoff_factor,
            self.growth_interval)
        self._unscaled, self.found_inf = False, False


def scaler_run(scaler, inject: tuple[int, ...] = (5, 11, 12), steps: int = 24, lr: float = 0.05):
    """FP16 autocast training of the course MLP with `scaler`; at the steps in `inject` one gradient is set to inf.

    Returns (the scale after every step, the trained model): run it with a `DynamicLossScaler` and a
    `torch.amp.GradScaler("cpu")` to compare them step by step.
    """
    from m11_helpers.data import regression
    from m11_helpers.models import mlp

    positive_int("steps", steps)
    x_all, y_all = regression(256).tensors  # (256, 16), (256, 4)
    model = mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scales = []
    for step in range(steps):
        i = torch.arange(step * 32, step * 32 + 32) % 256  # (32,) a fixed batch order
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x_all[i]), y_all[i])  # mse_loss autocasts to fp32
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step in inject:  # an overflow, as a too-large scale would cause
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)  # skipped when a gradient is inf/NaN
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, model


def overflow_run(init_scale: float = 2.0**20, steps: int = 8, lr: float = 1e-3, batch: int = 16) -> list[dict]:
    """The tiny GPT under FP16 autocast with GradScaler("cpu", init_scale); per step: scale used, loss, skipped?"""
    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    positive_real("init_scale", init_scale)
    x, y = (t.clone() for t in tokens(batch).tensors)  # (batch, 32) each
    model = tiny_gpt(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    rows = []
    for step in range(positive_int("steps", steps)):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        used = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        rows.append({"step": step, "scale": used, "loss": loss.item(), "skipped": scaler.get_scale() < used})
    return rows
