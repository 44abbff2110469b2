"""A preemptible training run: SIGTERM (the spot notice) -> ranks agree -> atomic checkpoint -> exit; --resume continues bit-exactly.

    launch_script("scripts/train_spot.py", "--ckpt-dir", "ckpt", "--preempt-at", "12", check=False)  # notice at step 12
    launch_script("scripts/train_spot.py", "--ckpt-dir", "ckpt", "--resume")                          # finish the run
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 course/scripts/train_spot.py --ckpt-dir ckpt

The notice is the real signal path: with --preempt-at K rank 0 sends SIGTERM to its parent, the
`accelerate launch` (torchrun) agent, which forwards it to every rank, exactly as when the cloud (or
`kill -TERM`, or SLURM's `--signal`) signals the job. --kill-at K is the hard case: every rank gets
SIGKILL, no notice; only the periodic checkpoints (--ckpt-every) survive. Lesson 10.
"""

import argparse
import gc
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator

from m11_helpers.data import regression
from m11_helpers.fault_tolerance import (PreemptionNotice, atomic_save, batch_indices, gather_rng_states,
                                         latest_checkpoint, load_checkpoint, set_rng_state, state_checksum)
from m11_helpers.launch import report
from m11_helpers.models import mlp

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch", type=int, default=32, help="global batch, split across the processes")
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--ckpt-dir", default="checkpoints")
parser.add_argument("--ckpt-every", type=int, default=0, help="periodic checkpoint every N steps (0: only on notice)")
parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --ckpt-dir")
parser.add_argument("--preempt-at", type=int, default=-1, help="rank 0 raises the spot notice after this step")
parser.add_argument("--kill-at", type=int, default=-1, help="every rank is SIGKILLed after this step (no notice)")
parser.add_argument("--progress", default="", help="rank 0 writes the last finished step here (for tests)")
parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of 'work' per step (for tests)")
args = parser.parse_args()

notice = PreemptionNotice()  # install the handler first: a notice during start-up is not lost
acc = Accelerator()
rank, world = acc.process_index, acc.num_processes
if args.batch % world:
    raise ValueError(f"--batch {args.batch} must be divisible by the number of processes {world}")
torch.manual_seed(args.seed + rank)  # per-rank randomness (input noise): its state must be saved per rank

x_all, y_all = regression(n=512, seed=args.seed).tensors  # (512, 16), (512, 4)
model = mlp(seed=args.seed)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)  # not prepared: stepped once per step
ckpt_dir = Path(args.ckpt_dir)

start, resumed_from = 0, None
if args.resume and (path := latest_checkpoint(ckpt_dir)) is not None:
    state = load_checkpoint(path)  # weights_only=True
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"][rank])  # this rank's own generator state
    start, resumed_from = state["step"], path.name
    if acc.is_main_process:
        print(f"resumed from {path.name} at step {start}")
model, opt = acc.prepare(model, opt)  # DDP (rank 0's weights broadcast: equal to the loaded ones)


def save(step: int, name: str) -> None:
    rngs = gather_rng_states()  # a collective: every rank calls it
    if acc.is_main_process:
        atomic_save({"model": acc.unwrap_model(model).state_dict(), "optimizer": opt.optimizer.state_dict(),
                     "scheduler": sched.state_dict(), "rng": rngs, "step": step, "world_size": world},
                    ckpt_dir / name)
    acc.wait_for_everyone()


losses, preempted_at = [], None
local = args.batch // world
for step in range(start, args.steps):
    if notice.agreed():  # one all_reduce(MAX): every rank leaves at this same step
        save(step, "preempted.pt")  # `step` = the next step to run
        preempted_at = step
        if acc.is_main_process:
            print(f"spot notice received: checkpoint written at step {step}, exiting")
        break
    idx = batch_indices(step, args.batch, len(x_all), seed=args.seed)[rank * local:(rank + 1) * local]  # (B/N,)
    x = x_all[idx] + 0.05 * torch.randn(local, x_all.shape[1])  # (B/N, 16): noise from this rank's RNG
    loss = torch.nn.functional.mse_loss(model(x), y_all[idx])
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    sched.step()
    losses.append(acc.reduce(loss.detach(), "mean").item())
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if args.progress and acc.is_main_process:
        Path(args.progress).write_text(str(step))
    if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
        save(step + 1, f"step{step + 1:05d}.pt")
    if step == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # the machine is gone: no handler, no checkpoint
    if step == args.preempt_at and acc.is_main_process and not args.resume:
        os.kill(os.getppid(), signal.SIGTERM)  # to the launcher (torchrun agent), which forwards it to all ranks
        deadline = time.monotonic() + 20
        while not notice.received and time.monotonic() < deadline:  # wait for it to come back round
            time.sleep(0.01)

final = state_checksum(acc.unwrap_model(model))
report(losses=losses, start=start, preempted_at=preempted_at, resumed_from=resumed_from, checksum=final,
       world=world, done=preempted_at is None)
if acc.is_main_process and preempted_at is None:
    print(f"finished {args.steps} steps: final loss {losses[-1]:.4f}, weights {final}")
del model, opt
gc.collect()  # a live DDP model at interpreter exit aborts the process now and then
if dist.is_initialized():
    dist.destroy_process_group()
