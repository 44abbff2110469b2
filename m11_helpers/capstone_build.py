"""The capstone build: the reference script's pieces, with the training step and the loop left to you.

    run = CapstoneRun("--parallel", "fsdp2", "--accum", 2, "--ckpt-dir", d)   # on each rank (inside launch)
    run.model, run.optimizer, run.scheduler, run.ckpt     # built exactly as scripts/train.py builds them
    CapstoneRun(*argv, build=my_build)                    # ... or by my_build(args, device, world) (exercise 11.2)
    run.micro_batches(step)   # this rank's K micro-batches (x, y) of global batch `step`
    run.stop_requested()      # True on every rank once any rank got SIGTERM (one all_reduce(MAX))
    steps_done = my_loop(run, my_step)                    # exercise 11.3, with my_step from exercise 11.1

`scripts/train.py` is the reference solution; `reference_step` and `reference_loop` are its step and its
loop without the spike guard, the drills and the logging — the same operations in the same order, so
`reference_loop(run, reference_step)` ends in the same weights as the script, bit for bit
(tests/test_capstone.py). `single_process_step` is the one-process reference a data-parallel step must
equal; `step_trial` runs a step on real ranks and returns what a check needs. `CapstoneRun(*argv,
build=fn)` takes its model, optimizer, scheduler and checkpointer from `fn(args, device, world)` instead
(exercise 11.2); `capstone_assembly` runs such a build, a loop and the levers on real ranks.
bf16 here is FSDP2's MixedPrecisionPolicy only (the build leaves autocast, lesson 06's lever, out).
Lesson 11.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from m11_helpers.config import TINY_GPT
from m11_helpers.data import tokens
from m11_helpers.fault_tolerance import PreemptionNotice, batch_indices
from m11_helpers.reference_run import script_module
from m11_helpers.sharded_checkpoint import Checkpointer

__all__ = ["CapstoneRun", "reference_step", "reference_loop", "single_process_step", "full_grads", "step_trial"]


class CapstoneRun:
    """One rank's pieces of the reference script for these command-line flags (call it on every rank)."""

    def __init__(self, *argv, build: Callable | None = None, autocast: bool = False):
        script = script_module()
        self.args = args = script.parse([str(a) for a in argv])
        if args.bf16 and args.parallel == "ddp" and not (autocast and build is None):  # the caller autocasts
            raise ValueError("--bf16 needs --parallel fsdp2 in the build (MixedPrecisionPolicy; no autocast here)")
        self._notice = PreemptionNotice()  # first, as in the script: a notice during start-up is not lost
        self.rank, self.world, self.device = script.setup(args)
        if args.batch % (self.world * args.accum):
            raise ValueError(f"--batch must be divisible by processes × --accum = {self.world * args.accum}")
        if build is None:  # the script's own pieces
            self.model = script.build_model(args, self.device, self.world)
            self.optimizer, self.scheduler = script.build_optimizer(args, self.model, self.device)
            self.ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, async_save=not args.sync_ckpt,
                                     timeout=args.timeout) if args.ckpt_dir else None
        else:  # exercise 11.2: build(args, device, world) -> (model, optimizer, scheduler, checkpointer or None)
            self.model, self.optimizer, self.scheduler, self.ckpt = build(args, self.device, self.world)
        if args.dropout:  # as the script does: each rank its own masks, the same on every start (a resume restores)
            torch.manual_seed(args.seed + self.rank)
        self.steps, self.ckpt_every = args.steps, args.ckpt_every
        self.clip = args.clip if args.clip > 0 else math.inf  # the max_norm a step clips to
        self._x, self._y = tokens(n=args.data_size, seed=args.seed).tensors  # (n, T), (n, T)
        self.requested: list[int] = []  # the global batches read, in order (what a check looks at)

    def micro_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's K micro-batches of global batch `step`: rows [r·B/N, (r+1)·B/N), in K pieces."""
        self.requested.append(step)
        local = self.args.batch // self.world
        rows = batch_indices(step, self.args.batch, len(self._x), seed=self.args.seed)  # (B,)
        mine = rows[self.rank * local:(self.rank + 1) * local]  # (B/N,)
        return [(self._x[i].to(self.device), self._y[i].to(self.device)) for i in mine.chunk(self.args.accum)]

    def stop_requested(self) -> bool:
        """The agreed stop: True on every rank once any rank got SIGTERM (a collective: call it on every rank)."""
        return script_module().stop_requested(self._notice, self.device)


def reference_step(model, micro_batches, max_norm: float) -> tuple[float, float]:
    """The script's step: K forward/backward passes, gradients reduced on the last only, clipped; (loss, norm)."""
    K = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter after the last backward only
            model.set_requires_gradient_sync(last)
        with model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext():
            logits = model(x)  # (b, T, vocab)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / K  # fp32; ÷K: the window's mean
            loss.backward()
        total += loss.detach()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # the global norm, every rank's shards
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    dist.all_reduce(total)  # every rank reports the same loss: the mean over the global batch
    return total.item() / dist.get_world_size(), norm.item()


def reference_loop(run: CapstoneRun, train_step: Callable) -> int:
    """The script's loop: resume, then per step agree → (save and stop) or step → apply → checkpoint; the steps done."""
    resumed = run.ckpt.load(run.model, run.optimizer, scheduler=run.scheduler)  # None: nothing saved yet
    step = resumed["step"] if resumed else 0  # step_N holds the state after N steps: N is the next to run
    saved = step
    while step < run.steps:
        if run.stop_requested():  # every rank leaves at this same step boundary
            run.ckpt.save(step, run.model, run.optimizer, scheduler=run.scheduler)
            run.ckpt.wait()  # it lands before the process exits
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0:
            run.ckpt.save(step, run.model, run.optimizer, scheduler=run.scheduler)  # async
            saved = step
    if saved != step:
        run.ckpt.save(step, run.model, run.optimizer, scheduler=run.scheduler)  # the end is always checkpointed
    run.ckpt.wait()
    return step


def single_process_step(*argv, step: int = 0, world_size: int = 1) -> dict:
    """One process, the whole global batch of `step`: the loss, the global norm, the clipped gradients by name,
    and each of `world_size` ranks' own mean loss over its rows (what a rank sees before any all-reduce)."""
    from m11_helpers.meta_init import materialize
    from m11_helpers.models import TinyGPT

    args = script_module().parse([str(a) for a in argv])
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT)
    materialize(model, "cpu", seed=args.seed)  # the same initial weights as the script at any world size
    x_all, y_all = tokens(n=args.data_size, seed=args.seed).tensors
    rows = batch_indices(step, args.batch, len(x_all), seed=args.seed)  # (B,)
    logits = model(x_all[rows])  # (B, T, vocab)
    per_token = F.cross_entropy(logits.flatten(0, 1), y_all[rows].flatten(), reduction="none")  # (B·T,)
    loss = per_token.mean()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip if args.clip > 0 else math.inf)
    return {"loss": loss.item(), "norm": norm.item(), "grads": {n: p.grad for n, p in model.named_parameters()},
            "rank_losses": [c.mean().item() for c in per_token.detach().chunk(world_size)]}


def full_grads(model) -> dict:
    """Every parameter's gradient in full, by the unwrapped model's names (collective under FSDP2)."""
    inner = model.module if isinstance(model, DDP) else model
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for n, p in inner.named_parameters() if p.grad is not None}


def _reductions(model):
    """A live count of gradient reductions: FSDP2's reduce-scatters or DDP's bucket all-reduces."""
    if isinstance(model, DDP):
        from m11_helpers.gradient_accumulation import count_allreduces

        counter = count_allreduces(model)
        return lambda: counter[0]
    from m11_helpers.fsdp import TrafficCounter

    traffic = TrafficCounter().attach(model)
    return lambda: traffic.calls("reduce_scatter")


def step_trial(train_step: Callable, cases: list[list], watch: Callable = contextlib.nullcontext) -> list[dict]:
    """On each rank, per argv in `cases`: the script's step 0, then `train_step` on the same weights and batch
    (inside `watch()`); the reference's and the learner's loss, norm and gradient reductions, and the gradients."""
    out = []
    for argv in cases:
        run = CapstoneRun(*argv)
        count = _reductions(run.model)
        ref_loss, ref_norm = reference_step(run.model, run.micro_batches(0), run.clip)
        ref_syncs = count()
        run.optimizer.zero_grad(set_to_none=True)  # no optimizer step: the weights are unchanged
        try:
            with watch():
                got = train_step(run.model, run.micro_batches(0), run.clip)
        except Exception as e:  # noqa: BLE001 - reported by the check, with a hint (a stub's NotImplementedError too)
            out.append({"argv": argv, "error": f"{type(e).__name__}: {e}"})
            continue
        loss, norm = (got if isinstance(got, (tuple, list)) and len(got) == 2 else (None, None))
        out.append({"argv": argv, "error": None, "returned": repr(got)[:200], "loss": loss, "norm": norm,
                    "syncs": count() - ref_syncs, "ref_syncs": ref_syncs, "ref_loss": ref_loss, "ref_norm": ref_norm,
                    "grads": full_grads(run.model)})
        del run
    return out
