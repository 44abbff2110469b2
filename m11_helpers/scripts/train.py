"""The reference training script: FSDP2 (or DDP), sharded async checkpoints, resume on any number of ranks.

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 4 $(m11 script train.py) --ckpt-dir ckpt
    accelerate launch --multi_gpu --num_processes 8 $(m11 script train.py) --bf16 --ckpt-dir ckpt          # 8 GPUs
    torchrun --standalone --nproc-per-node 8 --max-restarts 3 $(m11 script train.py) --bf16 --ckpt-dir ckpt
    launch(run_train, "--steps", "12", "--ckpt-dir", d, num_processes=4)   # a notebook: m11_helpers.reference_run

Stop it any way you like (SIGKILL, a lost node, a spot notice) and start it again with the same
--ckpt-dir, on the same or another number of ranks: it continues from the newest complete checkpoint.
No flag, no human step; under torchrun's --max-restarts the agent restarts it by itself. On the same
number of ranks it continues bit for bit (FSDP2 at any size; DDP at 2 ranks: at more, its first step
after a start uses another bucket layout, so another summation order); on another number of ranks, to
float-summation tolerance (tests/test_train_script.py states and tests both). Top to bottom:

1. Processes: the launcher's environment (RANK, WORLD_SIZE, ...); NCCL on GPUs, gloo on CPUs.
2. The model on the meta device (nothing allocated) → activation checkpointing (--ac) → FSDP2
   `fully_shard` per block, then the root, with MixedPrecisionPolicy (bf16 compute with --bf16, fp32
   gradient reduction) — or DDP (+ autocast with --bf16) → allocate and initialise this rank's shards.
3. AdamW (fused kernel; no weight decay on biases and norm gains), linear warmup + cosine decay.
4. Resume: newest complete checkpoint in --ckpt-dir, each rank reading only the slices it now owns.
5. Each step: --accum micro-batches, gradients reduced on the LAST one only; global-norm clipping;
   the spike guard's verdict (roll back and skip batches, or step); tokens/s and MFU; an async
   checkpoint every --ckpt-every steps that training does not wait for.
6. SIGTERM (a spot notice) on any rank → all ranks stop at the same step → final checkpoint → exit 0.

Data: seeded synthetic token sequences (`m11_helpers.data`). The global batch --batch is the same on
any number of ranks: rank r of N reads rows [r·B/N, (r+1)·B/N) of each global batch, so a run resumed
on another world size reads exactly the same sequences. The loss is the mean over the global batch.
Drills: --inject-bad-batch, --crash-at, --hang-at SIMULATE faults, --notice-at sends a real SIGTERM. Lesson 10.
"""

import argparse
import contextlib
import functools
import gc
import math
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from m11_helpers.config import TINY_GPT
from m11_helpers.data import tokens
from m11_helpers.fault_tolerance import PreemptionNotice, batch_indices
from m11_helpers.launch import report
from m11_helpers.lr_schedule import warmup_cosine
from m11_helpers.meta_init import materialize
from m11_helpers.models import TinyGPT
from m11_helpers.procs import exit_on_failure
from m11_helpers.sharded_checkpoint import Checkpointer, weights_checksum
from m11_helpers.spike_guard import SpikeGuard, bad_batches, inject, next_batch, parse_batches, skip_window
from m11_helpers.throughput import device_peak, step_throughput
from m11_helpers.timing import synchronize
from m11_helpers.validate import fraction, non_negative_int, positive_int, positive_real


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The course's reference training script (tiny GPT, FSDP2 or DDP).")
    p.add_argument("--parallel", choices=("fsdp2", "ddp"), default="fsdp2")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps of the whole run (a resumed run ends there too)")
    p.add_argument("--batch", type=int, default=16, help="global batch in sequences, the same on any number of ranks")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step; gradients reduced on the last only")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=4, help="linear warmup steps, then cosine decay")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine ends at this fraction of --lr")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clipping (0: measure the norm only)")
    p.add_argument("--bf16", action="store_true", help="bf16 compute: FSDP2 MixedPrecisionPolicy / DDP autocast")
    p.add_argument("--ac", action="store_true", help="activation checkpointing: recompute each block in backward")
    p.add_argument("--ac-every", type=int, default=1, help="with --ac, recompute every K-th block only (0, K, 2K...)")
    p.add_argument("--dropout", type=float, default=0.0, help="residual dropout p (0: none; masks from torch's RNG)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-size", type=int, default=2048, help="sequences in the synthetic data set")
    p.add_argument("--ckpt-dir", default="", help="checkpoint folder; the run resumes from it when it holds one")
    p.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--keep", type=int, default=3, help="complete checkpoints kept (older ones are deleted)")
    p.add_argument("--sync-ckpt", action="store_true", help="block on each save instead of writing in the background")
    p.add_argument("--no-guard", action="store_true", help="apply every step, NaN or spike (to see why the guard exists)")
    p.add_argument("--spike-factor", type=float, default=3.0, help="a loss above this × the running median is a spike")
    p.add_argument("--skip-batches", default="", help="batch indices never to read, e.g. '12-15,40'")
    p.add_argument("--inject-bad-batch", default="", help="DRILL: batch indices whose loss is corrupted, e.g. '7,11'")
    p.add_argument("--bad-batch-kind", default="nan", help="DRILL: spike (×1000) or nan; one for all, or one per batch")
    p.add_argument("--crash-at", type=int, default=-1, help="DRILL: --fault-rank raises at this step")
    p.add_argument("--hang-at", type=int, default=-1, help="DRILL: --fault-rank stops responding at this step")
    p.add_argument("--notice-at", type=int, default=-1, help="DRILL: --fault-rank sends the launcher a SIGTERM here")
    p.add_argument("--fault-rank", type=int, default=-1, help="DRILL: the rank that crashes, hangs or signals (-1: the last)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a collective waits for a silent peer")
    p.add_argument("--log-every", type=int, default=1)
    args = p.parse_args(argv)
    for name in ("steps", "batch", "accum", "ac_every", "ckpt_every", "keep", "data_size", "log_every"):
        positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    for name in ("lr", "timeout", "spike_factor"):
        positive_real(f"--{name.replace('_', '-')}", getattr(args, name))
    non_negative_int("--warmup", args.warmup)
    fraction("--dropout", args.dropout, allow_zero=True)
    args.bad_batches = bad_batches(args.inject_bad_batch, args.bad_batch_kind)
    return args


def setup(args):
    """Join the process group the launcher describes; returns (rank, world size, device)."""
    cuda = torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # m11_helpers.launch has joined it already
        # GPUs: NCCL for CUDA tensors, gloo beside it for CPU ones (DCP's planning, small flags)
        backend, timeout = "cpu:gloo,cuda:nccl" if cuda else "gloo", timedelta(seconds=args.timeout)
        if "WORLD_SIZE" in os.environ:  # torchrun / accelerate launch
            dist.init_process_group(backend, timeout=timeout)
        else:  # plain `python train.py`: a group of one
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


def build_model(args, device, world):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT, dropout=args.dropout)  # shapes only: nothing allocated, no random number drawn
    if args.ac:  # before sharding (torchtitan's order); the blocks' state-dict keys stay unchanged
        for block in model.blocks[::args.ac_every]:  # keep each block's input only, recompute the rest in backward
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    if args.parallel == "fsdp2":
        mesh = init_device_mesh(device.type, (world,))
        # bf16 copies for compute, fp32 shards kept by the optimizer, gradients reduced in fp32
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.bf16 else None, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)  # one all-gather per block, just before it runs
        fully_shard(model, mesh=mesh, mp_policy=mp)  # the rest: embeddings (tied with the head), final norm
    materialize(model, device, seed=args.seed)  # this rank's shards, the weights of the whole model's init
    if args.parallel == "ddp":
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def build_optimizer(args, model, device):
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},  # matrices
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # biases, norm gains (GPT-3)
    fused = device.type in ("cuda", "cpu")  # one kernel per step for all tensors where the device has it
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=fused)
    return opt, warmup_cosine(opt, warmup=args.warmup, total=args.steps, floor=args.min_lr_ratio)


def stop_requested(notice, device) -> bool:
    """True on every rank once any rank got SIGTERM: all_reduce(MAX) of its flag, on the training device
    (an NCCL-only group, as m11_helpers.launch makes on GPUs, cannot reduce the CPU tensor of notice.agreed())."""
    flag = torch.tensor([1.0 if notice.received else 0.0], device=device)  # (1,)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main(argv=None, observer=None) -> dict:
    args = parse(argv)
    notice = PreemptionNotice()  # first: a spot notice during start-up is not lost
    rank, world, device = setup(args)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # set by torchrun's agent
    fault_rank = args.fault_rank if args.fault_rank >= 0 else world - 1
    # Each drill fires on its own attempt, in step order (the first on attempt 0), so a restart gets past it.
    kinds = (("crash", args.crash_at), ("hang", args.hang_at), ("notice", args.notice_at))
    drills = dict(enumerate(sorted(((k, s) for k, s in kinds if s >= 0), key=lambda d: d[1])))
    if args.batch % (world * args.accum):
        raise ValueError(f"--batch must be divisible by processes × --accum = {world * args.accum}, got {args.batch}")
    local, K = args.batch // world, args.accum
    x_all, y_all = tokens(n=args.data_size, seed=args.seed).tensors  # (n, T) inputs, (n, T) next tokens

    def micro_batches(batch):
        rows = batch_indices(batch, args.batch, len(x_all), seed=args.seed)  # (B,) the global batch
        for idx in rows[rank * local:(rank + 1) * local].chunk(K):  # this rank's B/N rows, in K pieces
            yield x_all[idx].to(device), y_all[idx].to(device)  # (B/NK, T), (B/NK, T)

    model = build_model(args, device, world)
    opt, sched = build_optimizer(args, model, device)
    if observer is not None and hasattr(observer, "on_build"):
        observer.on_build(model)  # instrumentation beside the script (tests, harnesses)
    guard = SpikeGuard(factor=args.spike_factor)
    progress = {"step": 0, "cursor": 0, "skipped": []}  # the data position is one int (+ what to skip)
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, async_save=not args.sync_ckpt,
                        timeout=args.timeout) if args.ckpt_dir else None
    state = {"scheduler": sched, "progress": progress, "guard": guard}  # besides the model and optimizer
    resumed = ckpt.load(model, opt, **state) if ckpt else None
    if args.dropout and not resumed:
        torch.manual_seed(args.seed + rank)  # each rank its own masks, the same on every run (a resume restores them)
    if resumed and resumed["resharded"]:
        torch.manual_seed(args.seed + 1000 * progress["step"] + rank)  # no saved RNG maps to a new layout
    progress["skipped"] += [r for r in parse_batches(args.skip_batches) if r not in progress["skipped"]]
    peak, peak_source = device_peak(device, "bf16" if args.bf16 else "fp32")
    T = TINY_GPT.seq_len  # MFU counts TINY_GPT's attention at this context (compute_budget, PaLM App. B)
    if rank == 0:
        print(f"{args.parallel} on {world} × {device.type}, restart {restarts}; "
              + (f"resumed from {resumed['path']} (saved on {resumed['saved_world_size']} ranks)" if resumed
                 else "starting at step 0") + f"; MFU against {peak / 1e12:.3g} TFLOP/s ({peak_source})", flush=True)

    def train_step(batch):
        """Forward and backward over the step's K micro-batches; returns (global loss, global grad norm)."""
        total = torch.zeros((), device=device)
        for k, (x, y) in enumerate(micro_batches(batch)):
            last = k == K - 1  # reduce gradients on the last micro-batch only: the K-1 others accumulate locally
            if args.parallel == "fsdp2":
                model.set_requires_gradient_sync(last)
            with model.no_sync() if args.parallel == "ddp" and not last else contextlib.nullcontext():
                with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16 and args.parallel == "ddp"):
                    logits = model(x)  # (B/NK, T, vocab)
                # fp32 loss (a bf16 log-softmax loses digits); ÷K: the step's loss is the mean over the batch
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / K
                if batch in args.bad_batches:
                    loss = inject(loss, args.bad_batches[batch])  # DRILL: a simulated corrupted batch
                loss.backward()
            total += loss.detach()
        # the global norm (all ranks' shards); max_norm=inf measures without clipping
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip if args.clip > 0 else math.inf)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        dist.all_reduce(total)  # every rank sees the same loss, so every rank reaches the same verdict
        return total.item() / world, norm.item()

    history, rollbacks, preempted_at, saved_at = [], [], None, resumed["step"] if resumed else None
    while progress["step"] < args.steps:
        step = progress["step"]
        if stop_requested(notice, device):  # every rank leaves at this same step
            if ckpt:
                ckpt.save(step, model, opt, **state)
                ckpt.wait()
            preempted_at = step
            break
        if rank == fault_rank and drills.get(restarts) == ("notice", step):  # DRILL: a real SIGTERM, via the launcher
            notice.drill()  # back here before this step runs: the ranks agree at the next one
        if rank == fault_rank and drills.get(restarts) in (("crash", step), ("hang", step)):  # DRILLS
            if drills[restarts][0] == "crash":
                raise RuntimeError(f"injected crash on rank {rank} at step {step} (a drill)")
            print(f"rank {rank}: injected hang at step {step}; peers time out after {args.timeout:g} s", flush=True)
            notice.wait()  # silent until the launcher's SIGTERM
            raise SystemExit(143)
        batch = next_batch(progress["cursor"], progress["skipped"])
        t0 = time.perf_counter()
        loss, grad_norm = train_step(batch)
        reason = None if args.no_guard else guard.check(loss, grad_norm)
        if reason:  # nothing applied yet: the weights are still good
            opt.zero_grad(set_to_none=True)
            guard.rolled_back(reason)  # raises RepeatedSpikes after too many
            back = ckpt.load(model, opt, **state) if ckpt else None  # the newest complete one, if any
            window = skip_window(progress["cursor"], batch)  # PaLM: from the checkpoint through the bad batch
            progress["skipped"].append(window)
            rollbacks.append({"step": step, "batch": batch, "reason": reason, "to_step": progress["step"],
                              "skipped": window})
            if rank == 0:
                print(f"step {step}: {reason} → " + (f"rolled back to step {back['step']}" if back else "no checkpoint")
                      + f", skipping batches {window[0]}-{window[1]}", flush=True)
            continue
        lr = sched.get_last_lr()[0]  # this step's learning rate
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        guard.accept(loss)
        progress.update(step=step + 1, cursor=batch + 1)
        synchronize()  # the step's kernels have finished (a no-op on CPU)
        seconds = time.perf_counter() - t0
        rate = step_throughput(args.batch * T, seconds, TINY_GPT, world, peak, "full" if args.ac else "none",
                               share=len(range(0, TINY_GPT.layers, args.ac_every)) / TINY_GPT.layers)
        record = {"step": step, "batch": batch, "loss": loss, "grad_norm": grad_norm, "lr": lr, "seconds": seconds,
                  **rate}
        history.append(record)
        if rank == 0 and step % args.log_every == 0:
            print(f"step {step:4d} | loss {loss:.4f} | lr {record['lr']:.2e} | grad norm {grad_norm:.3f} | "
                  f"{rate['tokens_per_s']:,.0f} tok/s | MFU {100 * rate['mfu']:.2f} %", flush=True)
        saving = ckpt is not None and progress["step"] % args.ckpt_every == 0
        if saving:
            ckpt.save(progress["step"], model, opt, **state)  # async: training goes on while it is written
            saved_at = progress["step"]
        if observer is not None and hasattr(observer, "on_step"):
            observer.on_step({**record, "saved": saving})
    if ckpt and preempted_at is None and progress["step"] != saved_at:
        ckpt.save(progress["step"], model, opt, **state)  # the end of training is always checkpointed
    if ckpt:
        ckpt.wait()  # the last save lands before the process ends
    steady = history[1:] or history  # the first step pays for lazy initialisation
    result = {"rank": rank, "world": world, "restarts": restarts, "start_step": resumed["step"] if resumed else 0,
              "final_loss": history[-1]["loss"] if history else None,
              "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady) if history else None,
              "mfu": statistics.median(r["mfu"] for r in steady) if history else None,
              "resumed": resumed, "steps": [r["step"] for r in history], "losses": [r["loss"] for r in history],
              "history": history, "rollbacks": rollbacks, "skipped": progress["skipped"], "preempted_at": preempted_at,
              "peak_flops": peak, "peak_source": peak_source, "checksum": weights_checksum(model),
              "last_checkpoint": ckpt.last_complete if ckpt else None}
    if observer is not None and hasattr(observer, "on_end"):
        observer.on_end(model)
    report(**result)
    return result


if __name__ == "__main__":
    exit_on_failure(main)  # a failed rank prints its traceback and leaves with its code at once (procs.py)
    gc.collect()  # a live DDP model at interpreter exit can abort the process
    dist.destroy_process_group()  # before the interpreter exits
