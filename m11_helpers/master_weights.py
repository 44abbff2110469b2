"""FP32 master weights: the Megatron-LM / DeepSpeed optimizer, and the run that shows why it exists (lesson 06).

    opt = MasterWeightsAdamW(bf16_model.parameters())  # AdamW steps an fp32 copy, rounds it into the model
    precision_run("pure-bf16")                          # the same training with the weights stored four ways

Micikevicius et al. 2018, "Mixed Precision Training", §3.1: an update smaller than half the spacing
of 16-bit numbers near a weight rounds away, so the optimizer updates an fp32 master copy. Two
layouts have one (`m11_helpers.model_states` owns their bytes): `torch.amp.autocast` keeps the
parameters themselves in fp32; DeepSpeed keeps 16-bit parameters and gradients next to a separate
fp32 copy (Rajbhandari et al. 2020, "ZeRO", §3.1: 2Ψ + 2Ψ + 12Ψ); Megatron-LM keeps 16-bit parameters
and a separate fp32 copy too, with fp32 main gradients (model_states "megatron", 18 B/param).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["MasterWeightsAdamW", "MODES", "precision_run"]


class MasterWeightsAdamW:
    """AdamW for a 16-bit model: the update happens on an fp32 master copy, then is rounded into the model.

    Per parameter: 2 B model weight + 2 B gradient (backward writes 16-bit grads) + 4 B master +
    8 B AdamW moments (fp32, on the master) = 16 B, ZeRO §3.1's 2Ψ + 2Ψ + 12Ψ.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.params = list(params)  # the model's 16-bit parameters: forward and backward read these
        self.master = [p.detach().float().clone() for p in self.params]  # fp32 copies the optimizer updates
        self.optimizer = torch.optim.AdamW(self.master, lr=positive_real("lr", lr), betas=betas, eps=eps,
                                           weight_decay=weight_decay)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()  # the 16-bit gradient, widened for the update
        self.optimizer.step()  # exp_avg, exp_avg_sq and the update itself, all fp32
        for p, m in zip(self.params, self.master):
            m.grad = None  # the fp32 gradient copy lives only for the step
            p.copy_(m)  # round the master to the model's dtype: small updates accumulate in the master


MODES = {
    "fp32": "fp32 weights, fp32 AdamW",
    "autocast": "torch.amp autocast bf16: fp32 weights are the master",
    "deepspeed": "bf16 weights and grads + fp32 master copy (DeepSpeed, Megatron-LM): MasterWeightsAdamW",
    "pure-bf16": "bf16 weights, bf16 AdamW, no master",
}


def precision_run(mode: str, steps: int = 120, lr: float = 3e-4, every: int = 5, seed: int = 0) -> dict:
    """AdamW on the course MLP with the weights stored as `mode` says (MODES); the full-data loss every `every`
    steps and, per step, the fraction of stored weight entries the update left unchanged (rounded away)."""
    from m11_helpers.data import regression
    from m11_helpers.models import mlp

    one_of("mode", mode, MODES)
    positive_int("steps", steps)
    x_all, y_all = regression(256).tensors  # (256, 16), (256, 4)
    model = mlp(seed=seed)
    if mode in ("deepspeed", "pure-bf16"):
        model = model.to(torch.bfloat16)
    dt = next(model.parameters()).dtype
    opt = (MasterWeightsAdamW if mode == "deepspeed" else torch.optim.AdamW)(model.parameters(), lr=lr,
                                                                          weight_decay=0.0)
    stored = opt.master if mode == "deepspeed" else list(model.parameters())  # what the update is added to
    losses, unchanged = [], []
    for step in range(steps):
        i = torch.arange(step * 32, step * 32 + 32) % 256  # (32,) a fixed batch order
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            loss = F.mse_loss(model(x_all[i].to(dt)).float(), y_all[i])
        opt.zero_grad()
        loss.backward()
        before = [t.detach().clone() for t in stored]
        opt.step()
        same = sum((t == b).sum().item() for t, b in zip(stored, before))
        unchanged.append(same / sum(t.numel() for t in stored))
        if step % every == 0 or step == steps - 1:
            with torch.no_grad():
                losses.append((step, F.mse_loss(model(x_all.to(dt)).float(), y_all).item()))
    return {"loss": losses, "unchanged": sum(unchanged) / len(unchanged)}
