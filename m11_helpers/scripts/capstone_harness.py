"""The capstone's measurement harness: the tiny GPT with a flag per lever, and counters around every run.

    launch_script("capstone_harness.py", "--parallel", "fsdp2", "--bf16", "--accum", "2", num_processes=4)
    launch_script("capstone_harness.py", "--sweep", "ddp,fsdp2,bf16", num_processes=4)   # several runs, one process group
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 4 $(m11 script capstone_harness.py) --parallel fsdp2

This is NOT the script to copy for a real run: it sweeps presets, counts bytes and collectives,
signals itself and gathers full checkpoints on rank 0 so lesson 11 can compare each lever's measured
figures with its plan. The reference training script is `train.py` (sharded async DCP checkpoints,
resharding resume, elastic restarts, loss-spike rollback).

Levers: --parallel ddp|fsdp2 (FSDP2 `fully_shard` on a device mesh, applied here directly: Accelerate's
FSDP plugin does not shard on CPU), --bf16 (torch.autocast), --accum K (K micro-batches per step, the
global batch unchanged), --checkpointing (each block recomputed in backward), --clip NORM (global norm),
--warmup STEPS (linear LR warmup). --ckpt-dir DIR: SIGTERM → the ranks agree → an atomic, world-size-
independent checkpoint (full state dict) → exit; --resume continues from it bit-exactly. Each run
report()s its losses, median step time, and measured bytes per rank: parameters, gradients, optimizer
state (local shards), activations (saved tensors of one micro-batch), elements communicated per step.
Lesson 11.
"""

import argparse
import contextlib
import gc
import hashlib
import os
import signal
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from m11_helpers.capstone import checkpoint_blocks, local_bytes, track_activations
from m11_helpers.data import tokens
from m11_helpers.fault_tolerance import PreemptionNotice, atomic_save, batch_indices, latest_checkpoint, load_checkpoint
from m11_helpers.fsdp import TrafficCounter, apply_fsdp, init_device_mesh
from m11_helpers.launch import report
from m11_helpers.models import tiny_gpt

# Named configurations for --sweep: each changes one lever of the baseline (DDP, fp32, no extras).
PRESETS = {
    "ddp": {}, "fsdp2": {"parallel": "fsdp2"}, "bf16": {"bf16": True}, "accum2": {"accum": 2},
    "checkpointing": {"checkpointing": True}, "clip": {"clip": 0.5}, "warmup": {"warmup": 4},
    "all": {"parallel": "fsdp2", "bf16": True, "accum": 2, "checkpointing": True, "clip": 0.5, "warmup": 4},
}

parser = argparse.ArgumentParser()
parser.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp")
parser.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16 (weights stay fp32)")
parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing of every block")
parser.add_argument("--clip", type=float, default=0.0, help="global gradient-norm clipping (0: off)")
parser.add_argument("--warmup", type=int, default=0, help="linear LR warmup steps (0: off)")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch", type=int, default=16, help="global batch (sequences per optimizer step)")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--ckpt-dir", default="", help="checkpoint here on SIGTERM (and every --ckpt-every steps)")
parser.add_argument("--ckpt-every", type=int, default=0)
parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --ckpt-dir")
parser.add_argument("--preempt-at", type=int, default=-1, help="rank 0 sends the launcher SIGTERM after this step")
parser.add_argument("--sweep", default="", help=f"comma-separated presets run one after another: {', '.join(PRESETS)}")
args = parser.parse_args()

notice = PreemptionNotice()  # first: a notice during start-up is not lost
acc = Accelerator()
rank, world, device = acc.process_index, acc.num_processes, acc.device
mesh = init_device_mesh(device.type, (world,)) if world > 1 else None
x_all, y_all = tokens(n=512, seed=args.seed).tensors  # (512, T) inputs, (512, T) next tokens


def build(cfg):
    model = tiny_gpt(args.seed).to(device)
    if cfg["checkpointing"]:
        checkpoint_blocks(model)  # torchtitan's order: activation checkpointing, then sharding
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    counter = {"all_reduce": 0}
    if cfg["parallel"] == "fsdp2" and mesh is not None:
        apply_fsdp(model, mesh)  # each block, then the root: parameters become DTensor Shard(0), in place
        counter = TrafficCounter().attach(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)  # over the shards
    elif world > 1:
        # Accelerate wraps the model in DDP (the harness's baseline lever).
        model, opt = acc.prepare(model, opt)
        if isinstance(model, DDP):
            def count(state, bucket):  # a comm hook that counts what DDP all-reduces, then all-reduces it
                counter["all_reduce"] += bucket.buffer().numel()
                fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
                return fut.then(lambda f: f.value()[0])

            model.register_comm_hook(None, count)
    warm = cfg["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return model, opt, sched, counter


def traffic(counter) -> int:
    return counter.totals()["all_gather"] + counter.totals()["reduce_scatter"] if hasattr(counter, "totals") \
        else counter["all_reduce"]


def save(model, opt, sched, step: int, folder: Path) -> None:
    """Full (unsharded) state dict gathered on every rank, rank 0 writes it atomically: resumable on any N."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {"model": get_model_state_dict(model, options=full), "optimizer": get_optimizer_state_dict(model, getattr(opt, "optimizer", opt), options=full),
             "scheduler": sched.state_dict(), "step": step, "world_size": world}
    if acc.is_main_process:
        atomic_save(state, folder / f"step{step:05d}.pt")
    acc.wait_for_everyone()


def train(cfg: dict, preemptible: bool = True) -> dict:
    torch.manual_seed(args.seed)
    model, opt, sched, counter = build(cfg)
    start, folder = 0, Path(args.ckpt_dir) if (args.ckpt_dir and preemptible) else None
    if args.resume and folder and (path := latest_checkpoint(folder)) is not None:
        state = load_checkpoint(path)  # every rank reads the full state; set_* keep this rank's shard
        set_model_state_dict(model, state["model"], options=StateDictOptions(full_state_dict=True))
        set_optimizer_state_dict(model, getattr(opt, "optimizer", opt), state["optimizer"], options=StateDictOptions(full_state_dict=True))
        sched.load_state_dict(state["scheduler"])
        start = state["step"]
        if acc.is_main_process:
            print(f"resumed from {path.name} at step {start} (saved by {state['world_size']} ranks)")
    K, local = cfg["accum"], args.batch // world
    if args.batch % (world * K):
        raise ValueError(f"--batch {args.batch} must be divisible by processes × accum = {world * K}")
    micro = local // K
    losses, times, grad_bytes, act_bytes, comm, norms, preempted_at = [], [], 0, 0, [], [], None
    for step in range(start, args.steps):
        if preemptible and notice.agreed():  # one all_reduce(MAX): every rank stops at this same step
            save(model, opt, sched, step, folder)
            preempted_at = step
            if acc.is_main_process:
                print(f"spot notice: checkpoint of step {step} written, exiting")
            break
        t0, before = time.perf_counter(), traffic(counter)
        rows = batch_indices(step, args.batch, len(x_all), seed=args.seed)[rank * local:(rank + 1) * local]  # (B/N,)
        step_loss = torch.zeros((), device=device)
        for k in range(K):
            idx = rows[k * micro:(k + 1) * micro]  # (B/(N·K),) this micro-batch
            x, y = x_all[idx].to(device), y_all[idx].to(device)  # (b, T), (b, T)
            last = k == K - 1
            sync = contextlib.nullcontext() if (last or cfg["parallel"] == "fsdp2") else acc.no_sync(model)
            measure = step == start and k == 0
            with sync:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["bf16"]), (track_activations() if measure else contextlib.nullcontext()) as saved:
                    loss = model(x, y) / K  # (): the mean over the global batch, once all K are summed
                if measure:
                    act_bytes = saved.bytes  # saved for backward by one micro-batch, parameters excluded
                acc.backward(loss)
            step_loss += loss.detach()
        if step == start:
            grad_bytes = local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        if cfg["clip"]:
            clip = torch.nn.utils.clip_grad_norm_ if cfg["parallel"] == "fsdp2" else acc.clip_grad_norm_
            norm = clip(model.parameters(), cfg["clip"])  # the global norm (a DTensor under FSDP2)
            norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss) if world > 1 else None
        losses.append(step_loss.item() / world)
        times.append(time.perf_counter() - t0)
        comm.append(traffic(counter) - before)
        if folder and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            save(model, opt, sched, step + 1, folder)
        if preemptible and step == args.preempt_at and acc.is_main_process and not args.resume:
            os.kill(os.getppid(), signal.SIGTERM)  # to the launcher, which forwards it to every rank
            deadline = time.monotonic() + 20
            while not notice.received and time.monotonic() < deadline:
                time.sleep(0.01)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # full tensors on every rank
    digest = hashlib.sha256()  # bit-level fingerprint of the weights: equal iff bitwise equal
    for name, t in sorted(full.items()):
        digest.update(name.encode() + t.detach().cpu().contiguous().numpy().tobytes())
    checksum = digest.hexdigest()[:16]
    out = {**cfg, "losses": losses, "start": start, "preempted_at": preempted_at, "checksum": checksum,
           "step_s": statistics.median(times[1:] or times) if times else None, "micro_batch": micro,
           "parameters": local_bytes(model.parameters()), "gradients": grad_bytes,
           "optimizer": local_bytes(t for s in getattr(opt, "optimizer", opt).state.values() for t in s.values() if torch.is_tensor(t)),
           "activations": act_bytes, "comm_elements": comm[-1] if comm else 0, "grad_norms": norms}
    del model, opt, counter
    gc.collect()  # a live DDP model at interpreter exit can abort the process
    return out


base = {"parallel": args.parallel, "bf16": args.bf16, "accum": args.accum, "checkpointing": args.checkpointing,
        "clip": args.clip, "warmup": args.warmup}
names = [n for n in args.sweep.split(",") if n] or ["run"]  # "run": the flags given; a preset: the baseline + its lever
unknown = [n for n in names if n != "run" and n not in PRESETS]
if unknown:
    raise ValueError(f"--sweep: unknown presets {unknown}; choose from {list(PRESETS)}")
runs = {}
for name in names:
    cfg = base if name == "run" else {**{k: v for k, v in base.items()}, "parallel": "ddp", "bf16": False, "accum": 1,
                                      "checkpointing": False, "clip": 0.0, "warmup": 0, **PRESETS[name]}
    runs[name] = r = train(cfg, preemptible=name == "run")  # presets: never checkpointed nor resumed
    if acc.is_main_process and r["losses"]:
        print(f"{name:>13}: loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, step {1e3 * r['step_s']:.0f} ms, "
              f"params {r['parameters']} B, optimizer {r['optimizer']} B, activations {r['activations']} B")
report(runs=runs, world=world, rank=rank, device=device.type)
acc.free_memory()  # drop the prepared (DDP) models first: a live DDP model at exit can abort the process
acc.end_training()  # destroys the process group before the interpreter exits
