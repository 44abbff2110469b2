"""Lesson 10 — exercise 10.7's drill: a learner's async, atomic, resharding DCP checkpointer on real ranks.

    outs = launch(save_run, folder, expect, save_async, num_processes=2)   # train, save at SAVE_AT: what ranks did
    launch(save_run, folder2, expect2, save_async, kill_at=3, num_processes=2)  # SIGKILL all at a save's 4th file op
    launch(resume_run, [(folder, expect), …], load_newest, num_processes=3)   # load on 3 ranks, compare, train on

What it observes, and how (by the order of events, not by timings a loaded machine would stretch):
- **Every file operation** of the save, from an audit hook in each rank (PEP 578 events `open`,
  `os.rename`, `os.mkdir`, `os.remove`, `shutil.rmtree`): where each file was written and in which
  thread, and when rank 0 published `step_N.tmp/` as `step_N/`, in one sequence with the training
  steps' own marks.
- **Asynchrony**: the first data file (`*.distcp`) a save opens is held until a training step has run
  from start to end. On the training thread, or with no step begun within a grace time, the save was
  synchronous: the one wall-clock bound, GRACE_S (2.5 s) for a step to *begin* (no collective needed), where a
  right answer's training thread gets there as soon as save_async returns.
- **Crashes**: `kill_at=k` SIGKILLs every rank (as a reclaimed machine) just before rank 0's k-th file
  operation of the last save, or after the run when k is past them; the check picks k at seeded random.
- **Resharding**: `resume_run` loads on another world size and gathers the full state (model and
  AdamW's moments) to compare bitwise with what the saving run held at that step, then trains on to
  STEPS; the kernel compares that with a one-process run (`reference`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

from m11_helpers.data import regression
from m11_helpers.launch import rank_device
from m11_helpers.models import mlp

__all__ = ["STEPS", "SAVE_AT", "GRACE_S", "build", "train_step", "full_state", "reference", "save_run", "resume_run",
           "trace_run", "kill_moments"]

STEPS, SAVE_AT, GLOBAL_BATCH = 6, (2, 4), 12  # 12 rows: an equal share on 1, 2, 3 or 4 ranks
# how long a held write waits for the training thread to begin a step: a right answer's begins within
# milliseconds, 2.5 s leaves a busy CI worker room to be descheduled, and it stays under the 4 s for which
# 10.7's check lets every rank sit idle before it calls the run a deadlock (launch's stall_timeout)
GRACE_S = 2.5
_X, _Y = regression(n=72, seed=7).tensors  # (72, 16), (72, 4)


def build(seed: int = 0):
    """The tiny MLP, FSDP2-sharded over every rank (each Linear, then the root), and its AdamW."""
    model = mlp((16, 32, 32, 4), seed=seed).to(rank_device())
    if dist.is_initialized():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _rows(step: int) -> torch.Tensor:
    return (torch.arange(GLOBAL_BATCH) + GLOBAL_BATCH * step) % len(_X)  # (12,) the global batch of `step`


def train_step(model, opt, step: int) -> None:
    """One step on this rank's contiguous share of the global batch (FSDP2 averages the gradients)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = _rows(step).chunk(world)[rank]  # (12/world,)
    dev = rank_device()
    F.mse_loss(model(_X[mine].to(dev)), _Y[mine].to(dev)).backward()
    opt.step()
    opt.zero_grad()


def full_state(model, opt) -> dict:
    """The full model and optimizer state on rank 0's CPU ({} elsewhere). Collective."""
    m, o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": m, "optim": o} if not dist.is_initialized() or dist.get_rank() == 0 else {}


def reference(steps: int = STEPS) -> dict:
    """One process, the whole global batch each step: the weights after `steps` steps."""
    model, opt = build()
    for step in range(steps):
        train_step(model, opt, step)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _differs(a: Any, b: Any, where: str = "") -> list[str]:
    """The keys where two nested state dicts are not bitwise equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and torch.equal(a.cpu(), b.cpu())
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        missing = [f"{where}.{k}" for k in a.keys() ^ b.keys()]
        return missing + [d for k in a.keys() & b.keys() for d in _differs(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differs(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]


class _Probe:
    """One rank's record of the save: file operations under `root` and the training loop's marks, in one order."""

    def __init__(self, root: Path, rank: int, kill_at: int | None):
        self.root, self.rank, self.kill_at = str(root.resolve()), rank, kill_at
        self.seq, self.events, self.gates = itertools.count(), [], []
        self.main = threading.main_thread()
        self.step_begun, self.step_done = threading.Event(), threading.Event()
        self.gate_open = self.watching = self.counting = False
        self.counted, self.pids = 0, [os.getpid()]

    def mark(self, kind: str, detail: Any = None) -> None:
        self.events.append((next(self.seq), kind, detail, threading.current_thread() is self.main))
        if kind == "step_start" and self.watching:
            self.step_begun.set()
        elif kind == "step_end" and self.step_begun.is_set():
            self.step_done.set()

    def arm(self, gate: bool, count: bool) -> None:
        self.step_begun.clear()
        self.step_done.clear()
        self.gate_open = self.watching = gate
        self.counting = count

    def hook(self, event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[1], str) and any(c in args[1] for c in "wax+"):
            kind, paths = "write", [args[0]]
        elif event == "open" and args[1] is None and isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR):
            kind, paths = "write", [args[0]]
        elif event in ("os.rename", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree"):
            kind, paths = event.split(".")[-1], list(args[:2] if event == "os.rename" else args[:1])
        else:
            return
        if not all(isinstance(p, (str, bytes, os.PathLike)) for p in paths):
            return
        paths = [os.path.abspath(os.fsdecode(p)) for p in paths]
        if not any(p.startswith(self.root) for p in paths):
            return
        if self.counting and self.rank == 0:
            if self.counted == self.kill_at:
                self.kill()
            self.counted += 1
        self.mark(kind, paths if len(paths) > 1 else paths[0])
        if kind == "write" and paths[0].endswith(".distcp") and self.gate_open:
            self.gate_open = False
            self.gates.append(self._hold())

    def _hold(self) -> str:
        """Keep the first data write of a save waiting until a training step has run while it waits."""
        if threading.current_thread() is self.main:
            return "training thread"
        try:
            if not self.step_begun.wait(GRACE_S):
                return "no step began"
            self.step_done.wait(60)
            return "overlapped"
        finally:
            self.watching = False

    def kill(self) -> None:
        for pid in self.pids:  # every rank at once, as a machine that is gone; this one last
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def _install(root: Path, kill_at: int | None) -> _Probe:
    probe = _Probe(root, dist.get_rank(), kill_at)
    sys.addaudithook(probe.hook)  # a forked rank's own: the kernel never gets it
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    probe.pids = pids
    return probe


def _forbid(fns: tuple):
    """The course's own checkpointer refused inside the learner's calls (no profiler at all when there is none)."""
    from m11_helpers.grading.observe import forbid

    return forbid(*fns, why="write the checkpointer yourself") if fns else contextlib.nullcontext()


class _Checkpointer:
    """The loop's side of the learner's `save_async`: one save in flight, waited for before the next and at the end."""

    def __init__(self, folder: Path, save_async: Callable, forbidden: tuple):
        self.folder, self.save_async, self.forbidden, self.pending = folder, save_async, forbidden, None
        self.group = dist.new_group(backend="gloo")  # the writer thread's collectives, apart from training's

    def save(self, step: int, model, opt) -> None:
        self.wait()
        with _forbid(self.forbidden):
            self.pending = self.save_async(self.folder, step, model, opt, self.group)

    def wait(self) -> None:
        if self.pending is not None:
            future, self.pending = self.pending, None
            future.result()  # the learner's future: done once step_N/ is published
            dist.barrier()  # on the training group: the writer's may still be busy if that future came early


def save_run(folder: str, expect: str, save_async: Callable, save_at: tuple[int, ...] = SAVE_AT,
             kill_at: int | None = None, forbidden: tuple = ()) -> dict:
    """Train STEPS steps, calling `save_async` after each step in `save_at`; what the rank did (see the docstring)."""
    folder, rank = Path(folder), dist.get_rank()
    probe = _install(folder, kill_at)
    model, opt = build()
    ckpt = _Checkpointer(folder, save_async, forbidden)
    for step in range(STEPS):
        probe.mark("step_start", step)
        train_step(model, opt, step)
        probe.mark("step_end", step)
        if step + 1 in save_at:
            held = full_state(model, opt)
            if rank == 0:
                torch.save(held, Path(expect) / f"step{step + 1}.pt")
            ckpt.wait()  # the previous save published first: what follows is this save's alone
            probe.arm(gate=step + 1 < STEPS and not probe.gates, count=step + 1 == save_at[-1])
            probe.mark("save_call", step + 1)
            ckpt.save(step + 1, model, opt)
            probe.mark("save_return", step + 1)
    ckpt.wait()
    probe.mark("wait_return")
    if kill_at is not None and rank == 0:
        probe.kill()  # the moment after the last save: it must be whole, and published
    return {"events": probe.events, "gates": probe.gates, "counted": probe.counted}


def resume_run(cases: list[tuple[str, str]], load_newest: Callable, forbidden: tuple = ()) -> list[dict]:
    """For each (folder, expect): `load_newest` on this world size, compare with what was saved, train on to STEPS."""
    group, outs = dist.new_group(backend="gloo"), []
    for folder, expect in cases:
        model, opt = build(seed=1)  # other weights than the saved run's: a load that reads nothing shows
        with _forbid(forbidden):
            step = load_newest(Path(folder), model, opt, group)
        out = {"step": step}
        if step is not None:
            got = full_state(model, opt)
            if dist.get_rank() == 0:
                want = torch.load(Path(expect) / f"step{step}.pt", weights_only=True)
                out["model_diff"] = _differs(want["model"], got["model"], "model")
                out["optim_diff"] = _differs(want["optim"], got["optim"], "optim")
            for s in range(step, STEPS):
                train_step(model, opt, s)
            out["final"] = full_state(model, opt).get("model")
        outs.append(out)
    return outs


def trace_run(folder: str) -> dict:
    """The course's Checkpointer, async then sync: rank's file operations in order, and how long save() held the loop."""
    from m11_helpers.sharded_checkpoint import Checkpointer

    probe = _install(Path(folder), None)
    model, opt = build()
    train_step(model, opt, 0)
    held = {}
    for mode in ("async", "sync"):
        ckpt = Checkpointer(Path(folder) / mode, async_save=mode == "async")
        probe.mark("save_call", mode)
        start = time.perf_counter()
        ckpt.save(1, model, opt)
        held[mode] = time.perf_counter() - start  # what training waited for
        probe.mark("save_return", mode)
        ckpt.wait()
    return {"held_s": held, "events": probe.events}


def kill_moments(counted: int, n: int, seed: int) -> list[int]:
    """`n` seeded moments among rank 0's `counted` file operations of the last save, and the moment after it."""
    import random

    return random.Random(seed).sample(range(counted + 1), min(n, counted + 1))
