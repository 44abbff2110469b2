"""A preemptible training run: SIGTERM (the spot notice) -> ranks agree -> atomic checkpoint -> exit; --resume continues bit-exactly.

    launch_script("train_spot.py", "--ckpt-dir", "ckpt", "--preempt-at", "12", check=False)  # notice at step 12
    launch_script("train_spot.py", "--ckpt-dir", "ckpt", "--resume")                          # finish the run
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 $(m11 script train_spot.py) --ckpt-dir ckpt
    launch(script_module("train_spot.py").main, ["--ckpt-dir", "ckpt", "--resume"])   # forked ranks (reference_run)

The notice is the real signal path: with --preempt-at K rank 0 sends SIGTERM to its parent, the
`accelerate launch` (torchrun) agent, which forwards it to every rank, exactly as when the cloud (or
`kill -TERM`, or SLURM's `--signal`) signals the job; with no agent above it (ranks forked by
`m11_helpers.launch`) rank 0 signals itself, and the ranks agree at the next step. --kill-at K is the hard case: every rank gets
SIGKILL, no notice; only the periodic checkpoints (--ckpt-every) survive. Lesson 10 (its tests; the lesson
itself runs the sharded reference script, `train.py`).

--accelerate-state does the same with Accelerate's own tools: `acc.save_state(folder)` (every rank's RNG,
model, optimizer, and the scheduler registered with `acc.register_for_checkpointing`) plus the step in a
small step.json beside them, `acc.load_state(folder)` on --resume, and a DataLoader-driven loop resumed
with `accelerate.skip_first_batches(loader, step)`. Same batches, same noise: same weights, bit for bit.
"""

import argparse
import gc
import json
import os
import shutil
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator, skip_first_batches
from torch.utils.data import DataLoader, TensorDataset

from m11_helpers.data import regression
from m11_helpers.fault_tolerance import (
    PreemptionNotice,
    atomic_save,
    batch_indices,
    gather_rng_states,
    latest_checkpoint,
    load_checkpoint,
    set_rng_state,
    state_checksum,
)
from m11_helpers.launch import report
from m11_helpers.models import mlp


def parse(argv=None) -> argparse.Namespace:
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
    parser.add_argument("--accelerate-state", action="store_true",
                        help="checkpoint with acc.save_state/load_state folders + skip_first_batches instead of .pt files")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    """The run on this rank (under `accelerate launch`, or in a rank `m11_helpers.launch` forked); returns what it reports."""
    args = parse(None if argv is None else [str(a) for a in argv])
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
    if args.accelerate_state:
        pass  # acc.load_state needs the prepared objects: see below
    elif args.resume and (path := latest_checkpoint(ckpt_dir)) is not None:
        state = load_checkpoint(path)  # weights_only=True
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"][rank])  # this rank's own generator state
        start, resumed_from = state["step"], path.name
        if acc.is_main_process:
            print(f"resumed from {path.name} at step {start}")
    model, opt = acc.prepare(model, opt)  # DDP (rank 0's weights broadcast: equal to the loaded ones)

    local = args.batch // world
    if args.accelerate_state:
        # This rank's rows of every global batch, exactly the rows of the default loop (batch_indices). The
        # DataLoader is not prepared: the sharding is in the batch sampler. Its own generator keeps the
        # iterator's base-seed draw off the global RNG, so making an iterator after a resume draws nothing
        # from the noise stream.
        rows = [batch_indices(s, args.batch, len(x_all), seed=args.seed)[rank * local:(rank + 1) * local].tolist()
                for s in range(args.steps)]
        loader = DataLoader(TensorDataset(x_all, y_all), batch_sampler=rows, generator=torch.Generator())
        acc.register_for_checkpointing(sched)  # not prepared (that would step it once per process): saved as custom state

        def latest_state(folder: Path) -> Path | None:
            # A state folder is complete once it carries step.json under its final name (`.name.tmp` never is);
            # a `.name.old` left by a kill between the two renames in save() still counts.
            done = [d for d in folder.glob("*") if d.is_dir() and not d.name.endswith(".tmp")
                    and (d / "step.json").is_file()] if folder.is_dir() else []
            return max(done, key=lambda d: (d / "step.json").stat().st_mtime_ns) if done else None

        if args.resume and (path := latest_state(ckpt_dir)) is not None:
            acc.load_state(str(path))  # model, optimizer, scheduler, and this rank's own RNG states
            start, resumed_from = json.loads((path / "step.json").read_text())["step"], path.name
            loader = skip_first_batches(loader, start)  # the data position: batches 0..start-1 are not read
            if acc.is_main_process:
                print(f"resumed from {path.name} at step {start}")

    def save_accelerate_state(step: int, name: str) -> None:
        # acc.save_state writes its files (model.safetensors, optimizer.bin, random_states_{rank}.pkl, ...)
        # in place, one by one, from several ranks: a kill mid-save would leave a torn folder. So every rank
        # saves into a hidden sibling `.name.tmp`, and only when all are done does rank 0 add step.json and
        # rename it into place (rename is atomic; the previous state stays whole until then).
        final, tmp = ckpt_dir / name.removesuffix(".pt"), ckpt_dir / f".{name.removesuffix('.pt')}.tmp"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)  # a torn save from an earlier kill
            ckpt_dir.mkdir(parents=True, exist_ok=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))  # every rank: its RNG file; rank 0: model, optimizer, scheduler
        acc.wait_for_everyone()
        if acc.is_main_process:
            (tmp / "step.json").write_text(json.dumps({"step": step, "world_size": world}))
            old = ckpt_dir / f".{final.name}.old"
            if final.exists():  # rename cannot replace a non-empty folder: move the old one aside first
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    def save(step: int, name: str) -> None:
        if args.accelerate_state:
            return save_accelerate_state(step, name)
        rngs = gather_rng_states()  # a collective: every rank calls it
        if acc.is_main_process:
            atomic_save({"model": acc.unwrap_model(model).state_dict(), "optimizer": opt.optimizer.state_dict(),
                         "scheduler": sched.state_dict(), "rng": rngs, "step": step, "world_size": world},
                        ckpt_dir / name)
        acc.wait_for_everyone()

    def batches():
        if args.accelerate_state:
            yield from enumerate(loader, start=start)  # (B/N, 16), (B/N, 4)
            return
        for step in range(start, args.steps):
            idx = batch_indices(step, args.batch, len(x_all), seed=args.seed)[rank * local:(rank + 1) * local]  # (B/N,)
            yield step, (x_all[idx], y_all[idx])

    losses, preempted_at = [], None
    for step, (xb, yb) in batches():
        if notice.agreed(device=acc.device):  # one all_reduce(MAX) on the training device (NCCL reduces no CPU tensor)
            save(step, "preempted.pt")  # `step` = the next step to run
            preempted_at = step
            if acc.is_main_process:
                print(f"spot notice received: checkpoint written at step {step}, exiting")
            break
        x = xb + 0.05 * torch.randn(local, x_all.shape[1], device=xb.device)  # (B/N, 16): noise from this rank's RNG
        loss = torch.nn.functional.mse_loss(model(x), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(acc.reduce(loss.detach(), "mean").item())
        if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            save(step + 1, f"step{step + 1:05d}.pt")
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the machine is gone: no handler, no checkpoint
        if step == args.preempt_at and acc.is_main_process:  # (a run resumed past step K never raises it)
            # to the launcher (torchrun's agent), which forwards it to every rank; with no agent above
            # (ranks forked by m11_helpers.launch), to this rank only: the ranks agree at the next step
            notice.drill()

    final = state_checksum(acc.unwrap_model(model))
    result = {"losses": losses, "start": start, "preempted_at": preempted_at, "resumed_from": resumed_from,
              "checksum": final, "world": world, "done": preempted_at is None}
    report(**result)
    if acc.is_main_process and preempted_at is None:
        print(f"finished {args.steps} steps: final loss {losses[-1]:.4f}, weights {final}")
    return result


if __name__ == "__main__":
    main()
    gc.collect()  # a live DDP model at interpreter exit aborts the process now and then (docs/cpu-distributed-facts.md)
    if dist.is_initialized():
        dist.destroy_process_group()
