"""Gradient accumulation: K micro-batches, gradients summed in place, one optimizer step.

    ∇ (1/K) Σₖ Lₖ = (1/K) Σₖ ∇Lₖ        — the K× larger batch's gradient, for a mean loss and equal micro-batches
    global batch = micro-batch × K × N   (N data-parallel ranks)

Lesson 07. `train_with_accumulation` (the loop done right: the last, short window still steps, and
is averaged over its own size), `token_weighted_losses` (variable lengths: normalise by the window's
token count, not per micro-batch), `ddp_accumulation_run` / `accelerate_accumulation_run` (inside a
launched rank: DDP with `no_sync`, or `accelerator.accumulate`, counting all-reduces with a
communication hook); `no_sync_step_times` (one optimizer step timed with and without `no_sync`, through
`m11_helpers.timing.time_it`: benchmarks/accumulation.py prints the ratios).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
import torch._dynamo  # noqa: F401  why: DDP imports it lazily (~5 s per rank on 2 cores); forked ranks inherit it
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from m11_helpers.validate import positive_int

__all__ = ["global_batch", "accumulation_steps_for", "accumulation_windows", "train_with_accumulation",
           "token_weighted_losses", "count_allreduces", "ddp_accumulation_run", "accelerate_accumulation_run",
           "no_sync_step_times"]


def global_batch(micro_batch: int, accumulation_steps: int, world_size: int = 1) -> int:
    """B_global = b_micro × K × N (e.g. Goyal et al. 2017: 32 per GPU × 256 GPUs = 8192)."""
    for name, v in (("micro_batch", micro_batch), ("accumulation_steps", accumulation_steps),
                    ("world_size", world_size)):
        positive_int(name, v)
    return micro_batch * accumulation_steps * world_size


def accumulation_steps_for(target_global_batch: int, micro_batch: int, world_size: int = 1) -> int:
    """K = B_global / (b_micro × N), which must divide exactly (else the batch is not the published one)."""
    for name, v in (("target_global_batch", target_global_batch), ("micro_batch", micro_batch),
                    ("world_size", world_size)):
        positive_int(name, v)
    per_step = micro_batch * world_size
    if target_global_batch % per_step:
        raise ValueError(f"target_global_batch={target_global_batch} is not a multiple of micro_batch × world_size "
                         f"= {per_step}: change micro_batch or world_size")
    return target_global_batch // per_step


def accumulation_windows(num_batches: int, accumulation_steps: int) -> list[int]:
    """Sizes of the optimizer-step windows: [K, K, …, r] with a last, short window r = n mod K when r > 0."""
    positive_int("num_batches", num_batches)
    positive_int("accumulation_steps", accumulation_steps)
    full, rest = divmod(num_batches, accumulation_steps)
    return [accumulation_steps] * full + ([rest] if rest else [])


def train_with_accumulation(model: nn.Module, optimizer: torch.optim.Optimizer,
                            batches: Sequence[tuple[torch.Tensor, torch.Tensor]], accumulation_steps: int,
                            loss_fn: Callable = F.mse_loss) -> list[float]:
    """One pass over `batches`, stepping once per window of K micro-batches; returns each window's mean loss.

    Each micro-loss is divided by its window's size, so the summed gradient is the window's mean;
    the last window may be short (len(batches) mod K) and still steps — the loop that tests
    `(i + 1) % K == 0` only would leave its gradients in .grad, silently, to leak into the next epoch.
    """
    windows = accumulation_windows(len(batches), accumulation_steps)
    losses, i = [], 0
    optimizer.zero_grad(set_to_none=True)
    for size in windows:
        total = 0.0
        for x, y in batches[i:i + size]:
            loss = loss_fn(model(x), y) / size  # a mean over the window, whatever its size
            loss.backward()  # adds into p.grad: the sum over the window
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
        i += size
    return losses


def token_weighted_losses(per_token_losses: Iterable[torch.Tensor], masks: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Micro-losses whose sum is the window's token mean: Σ_tokens ℓ / Σ_window tokens (not mean of means).

    per_token_losses[k]: (B, T) losses, masks[k]: (B, T) 1 for real tokens, 0 for padding.
    """
    per_token_losses, masks = list(per_token_losses), list(masks)
    if len(per_token_losses) != len(masks) or not masks:
        raise ValueError("per_token_losses and masks must be non-empty and of equal length")
    total_tokens = sum(m.sum() for m in masks)  # known before the window starts: count it from the data
    return [(loss * m).sum() / total_tokens for loss, m in zip(per_token_losses, masks)]


# ---------------------------------------------------------------------------------------------
# On real processes (call inside a function run by m11_helpers.launch.launch)
# ---------------------------------------------------------------------------------------------


def count_allreduces(ddp_model) -> list[int]:
    """Register a comm hook on a DDP model that counts bucket all-reduces; returns the live counter [n]."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    counter = [0]

    def hook(state, bucket):
        counter[0] += 1
        return default_hooks.allreduce_hook(state, bucket)  # sum, then divide by N, as DDP does

    ddp_model.register_comm_hook(None, hook)
    return counter


def _rank_batches(steps: int, k: int, micro: int, seed: int):
    from m11_helpers.data import regression

    x, y = regression(n=steps * k * micro * dist.get_world_size(), seed=seed).tensors  # (n, 16), (n, 4)
    x = x.view(steps * k, dist.get_world_size(), micro, -1)[:, dist.get_rank()]  # this rank's micro-batches
    y = y.view(steps * k, dist.get_world_size(), micro, -1)[:, dist.get_rank()]
    return list(zip(x, y))


def ddp_accumulation_run(accumulation_steps: int, steps: int = 2, micro_batch: int = 4, no_sync: bool = True,
                         seed: int = 0, lr: float = 0.1) -> dict:
    """DDP(mlp) trained `steps` optimizer steps of K micro-batches each; all-reduces counted; rank's result.

    With no_sync the first K−1 backward passes only accumulate locally and the K-th all-reduces the
    sum: one all-reduce round per step instead of K. Gradients are identical either way.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.models import mlp

    positive_int("accumulation_steps", accumulation_steps)
    model = DDP(mlp(seed=seed), bucket_cap_mb=1000)  # one bucket: one all-reduce per synchronised backward
    counter = count_allreduces(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = _rank_batches(steps, accumulation_steps, micro_batch, seed)
    for step in range(steps):
        for k in range(accumulation_steps):
            x, y = batches[step * accumulation_steps + k]
            last = k == accumulation_steps - 1
            ctx = model.no_sync() if (no_sync and not last) else _nullcontext()
            with ctx:
                (F.mse_loss(model(x), y) / accumulation_steps).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = [p.detach().clone() for p in model.module.parameters()]
    del model  # a live DDP model at interpreter exit can abort the process (docs/cpu-distributed-facts.md)
    return {"allreduces": counter[0], "params": params}


def accelerate_accumulation_run(accumulation_steps: int, steps: int = 2, micro_batch: int = 4, seed: int = 0,
                                lr: float = 0.1) -> dict:
    """The same training with `Accelerator(gradient_accumulation_steps=K)` and `accelerator.accumulate`."""
    from accelerate import Accelerator

    from m11_helpers.models import mlp

    acc = Accelerator(cpu=True, gradient_accumulation_steps=accumulation_steps)
    model = mlp(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model, opt = acc.prepare(model, opt)
    counter = count_allreduces(model)
    for x, y in _rank_batches(steps, accumulation_steps, micro_batch, seed):
        with acc.accumulate(model):  # no_sync on all but every K-th call; the prepared optimizer skips steps
            acc.backward(F.mse_loss(model(x), y))  # Accelerate divides the loss by K itself
            opt.step()
            opt.zero_grad()
    params = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    out = {"allreduces": counter[0], "params": params, "distributed_type": str(acc.distributed_type)}
    del model, acc
    return out


def no_sync_step_times(accumulation_steps: int, repeats: int = 5, micro_batch: int = 4, seed: int = 0) -> dict:
    """On a launched rank: median seconds of one optimizer step of K micro-batches, with and without no_sync."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.models import mlp
    from m11_helpers.timing import time_it

    positive_int("accumulation_steps", accumulation_steps)
    model = DDP(mlp(seed=seed), bucket_cap_mb=1000)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = _rank_batches(1, accumulation_steps, micro_batch, seed)

    def step(ddp: DDP, no_sync: bool) -> None:
        for k, (x, y) in enumerate(batches):
            skip = no_sync and k < accumulation_steps - 1
            with ddp.no_sync() if skip else _nullcontext():
                (F.mse_loss(ddp(x), y) / accumulation_steps).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out = {name: time_it(lambda ns=ns, m=model: step(m, ns), repeats=repeats).median  # ranks call in lock-step
           for name, ns in (("no_sync", True), ("every micro-batch", False))}
    del model
    return out


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
