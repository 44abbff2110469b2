"""The learning-rate schedule large runs use: linear warmup, then cosine decay to a floor.

    lr_factor(step, warmup=100, total=10_000, floor=0.1)       # multiplier of the peak LR at `step`
    sched = warmup_cosine(opt, warmup=100, total=10_000)        # a LambdaLR: stepped once per optimizer step

Warmup: the LR ramps linearly from peak/warmup to the peak over the first `warmup` steps, because
Adam's second-moment estimate is noisy at first and large early updates can diverge (Goyal et al.
2017, §2.2; Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and Beyond", §3).
Decay: half a cosine from the peak down to `floor` × peak at `total` (Loshchilov & Hutter 2017,
SGDR, eq. 5, without restarts); GPT-3 (Brown et al. 2020, App. B) and Chinchilla (Hoffmann et al.
2022, §3) decay to 10 % of the peak, hence the default floor 0.1. After `total` it stays at the floor.

The multiplier is a pure function of the step, so the schedule's whole state is one integer: a
checkpoint that stores the scheduler (`sched.state_dict()`: `last_epoch`) resumes it exactly, on any
number of ranks. Lesson 10 (the reference script, `m11_helpers/scripts/train.py`).
"""

from __future__ import annotations

import math

import torch

from m11_helpers.validate import fraction, non_negative_int, positive_int

__all__ = ["lr_factor", "warmup_cosine"]


def lr_factor(step: int, *, warmup: int, total: int, floor: float = 0.1) -> float:
    """η(t)/η_max = (t+1)/W for t < W, else floor + (1 − floor)·½(1 + cos(π·min(1, (t−W)/(T−W))))."""
    non_negative_int("step", step)
    non_negative_int("warmup", warmup)
    positive_int("total", total)
    fraction("floor", floor, allow_zero=True)
    if warmup > total:
        raise ValueError(f"warmup must be an integer in 0..total={total}, got {warmup}")
    if step < warmup:
        return (step + 1) / warmup  # never 0: the first step already moves the weights
    progress = min(1.0, (step - warmup) / max(1, total - warmup))  # 0 → 1 over the decay phase
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(optimizer: torch.optim.Optimizer, *, warmup: int, total: int,
                  floor: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR whose multiplier is `lr_factor`; call `.step()` once after each `optimizer.step()`."""
    lr_factor(0, warmup=warmup, total=total, floor=floor)  # validates the arguments now, not at step 0
    # LambdaLR calls it with its step count (last_epoch): the only state a checkpoint needs
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup=warmup, total=total,
                                                                             floor=floor))
