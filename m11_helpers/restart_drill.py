"""Lesson 10 — the checkpoint-restart drill that live recovery is measured against: kill a rank, the job dies, relaunch.

    drill = restart_drill(tmp_dir, ranks=3, steps=20, kill_at=5, every=4)
    drill["lost_s"], drill["redone_steps"], drill["losses"]

The same training as live_recovery_drill (the tiny GPT, one fixed global batch per step split over
the ranks, gradients averaged), under the kit's launcher (m11_helpers.launch): rank 0 writes an
atomic checkpoint (m11_helpers.fault_tolerance.atomic_save) of weights, AdamW state and step every
`every` steps; at `kill_at` rank `kill_rank` SIGKILLs itself (a machine gone: no handler runs).
The launch fails — the whole job stops, as a torchrun job does when a rank dies — and a second
launch resumes from the newest checkpoint and redoes the steps since. Lost time = when the killed
step is done again − when the rank died. Forked ranks start in a fraction of a second here; a job
restarted on a cluster also waits for the scheduler, new processes, imports and NCCL set-up, so
this is a lower bound on a restart's cost.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from m11_helpers.fault_tolerance import atomic_save, batch_indices, latest_checkpoint, load_checkpoint
from m11_helpers.launch import LaunchError, launch
from m11_helpers.live_replica import flat_state, load_flat_state, model_and_opt, tokens
from m11_helpers.validate import positive_int

__all__ = ["restart_drill"]


def _train(attempt: int, folder: str, steps: int, kill_rank: int, kill_at: int, every: int, global_batch: int,
           n: int, seed: int, lr: float) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = model_and_opt(seed, lr)
    x_all, y_all = tokens(n).tensors  # (n, T) each
    step, ckpt = 0, latest_checkpoint(folder)
    if ckpt is not None:
        step = load_flat_state(model, opt, load_checkpoint(ckpt)["state"])
    log = Path(folder) / "commits.jsonl"
    while step < steps:
        if attempt == 0 and rank == kill_rank and step == kill_at:
            with open(log, "a") as f:
                f.write(json.dumps({"killed": step, "t": time.time()}) + "\n")  # m11: cpu-only - an event's wall time
            os.kill(os.getpid(), signal.SIGKILL)
        mine = batch_indices(step, global_batch, n).chunk(world)[rank]  # (global_batch / world,)
        opt.zero_grad(set_to_none=False)
        loss = model(x_all[mine], y_all[mine])
        loss.backward()
        w = len(mine) / global_batch
        vec = torch.cat([p.grad.reshape(-1) * w for p in model.parameters()] + [loss.detach().view(1) * w])
        dist.all_reduce(vec)  # (P + 1,): the global batch's mean gradient and loss
        i = 0
        for p in model.parameters():
            p.grad.copy_(vec[i:i + p.numel()].view_as(p))
            i += p.numel()
        opt.step()
        step += 1
        if rank == 0:
            with open(log, "a") as f:
                f.write(json.dumps({"attempt": attempt, "step": step, "loss": float(vec[-1]), "t": time.time()}) + "\n")
            if step % every == 0:
                atomic_save({"state": flat_state(model, opt, step)}, Path(folder) / f"step{step:05d}.pt")


def restart_drill(folder: str | os.PathLike, ranks: int = 3, steps: int = 20, kill_rank: int = 1, kill_at: int = 5,
                  every: int = 4, global_batch: int = 12, n: int = 192, seed: int = 0, lr: float = 1e-3,
                  timeout: float = 120.0) -> dict:
    """Run the job, kill a rank at `kill_at`, relaunch from the checkpoint; returns losses, lost_s, redone_steps."""
    positive_int("ranks", ranks)
    positive_int("every", every)
    if not 0 < positive_int("kill_at", kill_at) < positive_int("steps", steps):
        raise ValueError(f"kill_at must be in 1..steps-1={steps - 1}, got {kill_at}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    args = (str(folder), steps, kill_rank, kill_at, every, global_batch, n, seed, lr)
    try:
        launch(_train, 0, *args, num_processes=ranks, timeout=timeout, show_output=False)
        raise AssertionError("the first launch should have failed: its rank was killed")
    except LaunchError:
        t_failed = time.time()  # the launcher saw the dead rank and stopped the job
    launch(_train, 1, *args, num_processes=ranks, timeout=timeout, show_output=False)  # the relaunched job
    lines = [json.loads(x) for x in (folder / "commits.jsonl").read_text().splitlines()]
    t_kill = next(x["t"] for x in lines if "killed" in x)
    after = [x for x in lines if x.get("attempt") == 1]
    losses: dict[int, float] = {}
    for x in lines:
        if "step" in x:
            losses[x["step"] - 1] = x["loss"]  # the redone steps overwrite; equal values when resume is exact
    first_redo = after[0]["step"] - 1  # the first step the relaunched job ran: the one after the checkpoint
    first = [x["t"] for x in lines if x.get("attempt") == 0]
    gaps = [b - a for a, b in zip(first, first[1:])]
    return {"losses": dict(sorted(losses.items())), "kill_step": kill_at, "resumed_from": first_redo,
            "redone_steps": kill_at - first_redo, "detect_s": t_failed - t_kill,
            "lost_s": next(x["t"] for x in after if x["step"] == kill_at + 1) - t_kill,
            "step_s": sorted(gaps)[len(gaps) // 2] if gaps else float("nan"),
            "first_run_losses": {x["step"] - 1: x["loss"] for x in lines if x.get("attempt") == 0}}
