"""The composed training step: every lever of lessons 03–07 in one optimizer step, in the order that is right.

    for k in range(K):                                  # K micro-batches
        with grad_sync(model, k == K - 1):              # DDP no_sync / FSDP2 set_requires_gradient_sync
            with torch.autocast("cpu", dtype=...):      # forward in bf16 (or fp16)
                loss = loss_fn(model(x), y)
            scaler.scale(loss / K).backward()           # ÷K: the window's mean; scaled only for fp16
    scaler.unscale_(optimizer)                          # once, after the K-th backward
    clip_grad_norm_(model.parameters(), max_norm)       # the true, global, accumulated gradient
    scaler.step(optimizer); scaler.update()             # skipped (and scale halved) on inf/NaN
    if the step was not skipped: scheduler.step()       # the schedule counts optimizer steps

Lesson 07. `accumulation_step` (bf16, no scaler) and `scaled_accumulation_step` (fp16 + GradScaler)
are the reference the lesson runs; `composed_step_run` runs them on a launched rank under DDP or
FSDP2; `large_batch_reference` is the one-process large batch they must equal.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from m11_helpers.validate import non_negative_int, one_of, positive_int, positive_real

__all__ = ["grad_sync", "accumulation_step", "scaled_accumulation_step", "make_optimizer", "step_batches",
           "large_batch_reference", "wrap", "composed_step_run", "unsharded_grad_bytes", "fsdp_grad_memory_run", "composed_runs",
           "PRECISIONS", "WRAPPERS"]

PRECISIONS = ("fp32", "bf16", "fp16")  # fp16 needs a GradScaler (lesson 06); bf16 does not
WRAPPERS = ("ddp", "fsdp2")


def grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-batch's backward: communicate gradients only when `sync` (the K-th micro-batch)."""
    if isinstance(model, FSDPModule):  # FSDP2: a flag on every FSDP unit, read by the post-backward hooks
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if isinstance(model, DDP) and not sync:
        return model.no_sync()  # DDP: the reducer skips its bucket all-reduces inside the context
    return contextlib.nullcontext()


def _autocast(precision: str, device_type: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def accumulation_step(model: nn.Module, optimizer, scheduler, micro_batches: Sequence, *, max_norm: float,
                      precision: str = "bf16", loss_fn: Callable = F.mse_loss, device_type: str = "cpu"):
    """One optimizer step from K micro-batches; returns the gradient norm before clipping (‖g‖ of the window).

    Equal to one step on the K micro-batches concatenated (every rank's), for a mean loss and equal sizes.
    """
    one_of("precision", precision, ("fp32", "bf16"))  # fp16 needs the scaler: scaled_accumulation_step
    k_steps = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with grad_sync(model, k == k_steps - 1):
            with _autocast(precision, device_type):
                loss = loss_fn(model(x), y)  # mse_loss runs in fp32 under autocast
            (loss / k_steps).backward()  # adds into .grad: after K, the window's mean gradient
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), positive_real("max_norm", max_norm))
    optimizer.step()
    scheduler.step()  # once per optimizer step, never per micro-batch
    optimizer.zero_grad(set_to_none=True)
    return norm


def scaled_accumulation_step(model: nn.Module, optimizer, scheduler, scaler, micro_batches: Sequence, *,
                             max_norm: float, loss_fn: Callable = F.mse_loss, device_type: str = "cpu",
                             scheduler_always: bool = False) -> bool:
    """fp16 + GradScaler over K micro-batches; True when the optimizer stepped, False when the scaler skipped it.

    `scheduler_always=True` is the common mistake, kept for the lesson's side-by-side: the scheduler
    advances on a skipped step too, so the learning-rate schedule runs ahead of the weights.
    """
    k_steps = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with grad_sync(model, k == k_steps - 1):
            with torch.autocast(device_type, dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss / k_steps).backward()  # the K gradients share one scale: unscale once, below
    scaler.unscale_(optimizer)  # the true gradient, before clipping compares it with max_norm
    torch.nn.utils.clip_grad_norm_(model.parameters(), positive_real("max_norm", max_norm))
    before = scaler.get_scale()
    scaler.step(optimizer)  # skips optimizer.step() if any gradient is inf/NaN
    scaler.update()  # ... and then halves the scale
    stepped = scaler.get_scale() >= before  # update() lowers the scale only after an inf/NaN: a skipped step
    if stepped or scheduler_always:
        scheduler.step()  # Accelerate's prepared scheduler also waits: it checks optimizer.step_was_skipped
    optimizer.zero_grad(set_to_none=True)
    return stepped


def make_optimizer(model: nn.Module, lr: float = 0.1, warmup: int = 8):
    """SGD with momentum and a linear warm-up over `warmup` steps: an optimizer that shows a missing ÷K."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)  # Adam would hide it: scale-invariant
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))


def step_batches(steps: int, k: int, micro: int, world: int, seed: int = 3, inf_at: tuple | None = None):
    """Regression data shaped (steps, world, K, micro, d): [s, r] is rank r's K micro-batches of step s.

    inf_at=(step, rank, k) puts one inf in that micro-batch's inputs: an overflow the scaler must skip.
    """
    from m11_helpers.data import regression

    for name, v in (("steps", steps), ("k", k), ("micro", micro), ("world", world)):
        positive_int(name, v)
    x, y = regression(n=steps * k * micro * world, seed=seed).tensors  # (n, 16), (n, 4)
    x = x.view(steps, world, k, micro, -1).clone()  # (steps, N, K, b, 16)
    if inf_at is not None:
        s, r, j = inf_at
        x[s, r, j, 0, 0] = float("inf")
    return x, y.view(steps, world, k, micro, -1)


def large_batch_reference(steps: int, k: int, micro: int, world: int, *, max_norm: float, precision: str = "bf16",
                          seed: int = 3, skip: Sequence[int] = ()) -> dict:
    """One process, one backward per step on all N·K micro-batches at once; `skip` lists steps not taken."""
    from m11_helpers.models import mlp

    one_of("precision", precision, PRECISIONS)
    model = mlp(seed=0)
    opt, sched = make_optimizer(model)
    xs, ys = step_batches(steps, k, micro, world, seed)
    norms = []
    for s in range(steps):
        if s in skip:
            continue
        with _autocast(precision, "cpu"):
            loss = F.mse_loss(model(xs[s].reshape(-1, xs.shape[-1])), ys[s].reshape(-1, ys.shape[-1]))  # (N·K·b, 4)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return {"params": [p.detach() for p in model.parameters()], "norms": norms, "lr": sched.get_last_lr()[0]}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def wrap(model: nn.Module, wrapper: str) -> nn.Module:
    """DDP (one bucket: one all-reduce per synchronised backward) or FSDP2 (each Linear, then the root)."""
    one_of("wrapper", wrapper, WRAPPERS)
    if wrapper == "ddp":
        return DDP(model, bucket_cap_mb=1000)
    from m11_helpers.fsdp import apply_fsdp, init_device_mesh

    return apply_fsdp(model, init_device_mesh("cpu", (dist.get_world_size(),)))


def composed_step_run(wrapper: str, steps: int = 3, k: int = 3, micro: int = 4, *, max_norm: float = 0.2,
                      precision: str = "bf16", inf_at: tuple | None = None, scheduler_always: bool = False,
                      seed: int = 3) -> dict:
    """On a launched rank: the composed step under DDP or FSDP2; what each step did, and the final weights."""
    from m11_helpers.fsdp import TrafficCounter
    from m11_helpers.gradient_accumulation import count_allreduces
    from m11_helpers.models import mlp

    one_of("wrapper", wrapper, WRAPPERS)
    one_of("precision", precision, PRECISIONS)
    rank = dist.get_rank()
    model = wrap(mlp(seed=0), wrapper)
    reduces = count_allreduces(model) if wrapper == "ddp" else None
    traffic = TrafficCounter().attach(model) if wrapper == "fsdp2" else None
    opt, sched = make_optimizer(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12) if precision == "fp16" else None
    xs, ys = step_batches(steps, k, micro, dist.get_world_size(), seed, inf_at)
    log = []
    for s in range(steps):
        before = [_full(p).detach().clone() for p in model.parameters()]
        micro_batches = list(zip(xs[s, rank], ys[s, rank]))  # this rank's K micro-batches
        if scaler is None:
            norm = _full(accumulation_step(model, opt, sched, micro_batches, max_norm=max_norm,
                                           precision=precision)).item()
            stepped = True
        else:
            norm = float("nan")
            stepped = scaled_accumulation_step(model, opt, sched, scaler, micro_batches, max_norm=max_norm,
                                               scheduler_always=scheduler_always)
        changed = any(not torch.equal(b, _full(p)) for b, p in zip(before, model.parameters()))
        log.append({"step": s, "stepped": stepped, "weights changed": changed, "norm": norm,
                    "lr": sched.get_last_lr()[0], "scale": scaler.get_scale() if scaler else None})
    comm = reduces[0] if reduces is not None else traffic.calls("reduce_scatter")
    out = {"log": log, "params": [_full(p).detach().clone() for p in model.parameters()], "grad_syncs": comm}
    del model  # a live DDP model at interpreter exit can abort the process (docs/cpu-distributed-facts.md)
    return out


def unsharded_grad_bytes(model: nn.Module) -> int:
    """Bytes of unsharded gradients FSDP2 holds on this rank between backward passes (kept while sync is off).

    Reads FSDP2's private per-parameter state (torch 2.13); only this measurement needs it.
    """
    total = 0
    try:
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    held = [fp.unsharded_accumulated_grad]
                    if fp._unsharded_param is not None:
                        held.append(fp._unsharded_param.grad)
                    total += sum(t.numel() * t.element_size() for t in held if t is not None)
    except AttributeError as err:
        raise RuntimeError(f"FSDP2's private gradient state changed in torch {torch.__version__}: {err}") from err
    return total


def fsdp_grad_memory_run(k: int = 3, micro: int = 4, seed: int = 3) -> list[dict]:
    """On a launched rank: gradient bytes held after each micro-batch's backward, FSDP2 sync off for K−1 of K."""
    from m11_helpers.models import mlp

    non_negative_int("seed", seed)
    model = wrap(mlp(seed=0), "fsdp2")
    xs, ys = step_batches(1, k, micro, dist.get_world_size(), seed)
    rows = []
    for j in range(k):
        with grad_sync(model, j == k - 1):
            F.mse_loss(model(xs[0, dist.get_rank(), j]), ys[0, dist.get_rank(), j]).backward()
        sharded = sum(p.grad.to_local().numel() * p.grad.element_size() for p in model.parameters()
                      if p.grad is not None)
        rows.append({"micro-batch": j + 1, "synced": j == k - 1, "unsharded grad bytes": unsharded_grad_bytes(model),
                     "sharded grad bytes": sharded})
    return rows


def composed_runs(configs: Sequence[dict]) -> list[dict]:
    """On a launched rank: several `composed_step_run(**config)` in one launch (forking ranks costs more than a step)."""
    return [composed_step_run(**c) for c in configs]
