"""Sharded, asynchronous checkpoints that resume on any number of ranks (torch.distributed.checkpoint).

    ckpt = Checkpointer("ckpt", keep=3)                               # every rank (it makes a gloo group)
    info = ckpt.load(model, opt, scheduler=sched, progress=progress)  # newest complete step_N/, or None
    ckpt.save(step, model, opt, scheduler=sched, progress=progress)   # async: returns once staged in memory
    ckpt.wait()                                                       # the save in flight lands (before exit)

What it writes, and why (Lesson 10; the PyTorch DCP and FSDP2 docs; torchtitan's checkpointer):
- **Each rank writes its own shards**, `step_N/__r_0.distcp`: `get_state_dict(model, optimizer)` gives
  FSDP2's DTensor shards (or DDP's replicated tensors, written once), keyed by parameter name, never
  gathered on rank 0. A rank-0 `torch.save` of a full state dict funnels every byte of the model
  states (AdamW's 16 per parameter in mixed precision) through one process, and every rank reads
  all of it back; a rank-0 `torch.save` of FSDP2's shards holds rank 0's quarter of the model (4
  ranks), cannot load on 2, and on 4 gives every rank rank 0's rows without an error.
- **Resharding is free**: `.metadata` records which slice of each tensor each file holds, so a
  `dcp.load` on M ranks reads exactly the slices its new shards need. Save on 4, load on 2 (or 8).
- **Async**: `dcp.async_save` copies the state into CPU memory (the only part training waits for)
  and writes the files in a background thread. Its collectives run on a dedicated gloo group, as
  torchtitan's do: two threads issuing collectives on one group would interleave them.
- **Complete only when whole**: files go to `step_N.tmp/`; rank 0 renames it to `step_N/` once the
  save's future is done — DCP's coordinator writes `.metadata` only after every rank reported its
  files written, so the rename follows every byte. A kill at any moment leaves at worst a `*.tmp`
  folder (deleted at the next start); older checkpoints are never touched until a newer one is whole.
- **Everything to continue exactly**: model, optimizer, scheduler, any other `state_dict()`-able
  object or plain dict (data position, loss-spike history) and **every rank's RNG state** (rank r
  writes `rng.rank{r}`). RNG states are restored when the world size is unchanged; on a new world
  size there is no rank-to-rank mapping, so they are not (the caller reseeds).
- **Retention**: keep the newest `keep`; an old one is first renamed to `*.tmp`, then deleted.
"""

from __future__ import annotations

import os
import shutil
import threading
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from m11_helpers.fault_tolerance import fsync_dir, rng_state, set_rng_state
from m11_helpers.validate import non_negative_int, positive_int, positive_real

__all__ = ["Checkpointer", "step_dir", "complete_steps", "latest_complete", "saved_world_size",
           "retained", "weights_checksum"]

_PREFIX = "step_"


def step_dir(folder: str | os.PathLike, step: int) -> Path:
    """`folder/step_00000012`: zero-padded, so names sort like steps."""
    return Path(folder) / f"{_PREFIX}{non_negative_int('step', step):08d}"


def complete_steps(folder: str | os.PathLike) -> list[int]:
    """Steps whose checkpoint is complete: a `step_N/` folder (not `.tmp`) holding DCP's `.metadata`."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    steps = [int(p.name[len(_PREFIX):]) for p in folder.glob(f"{_PREFIX}*")
             if p.name[len(_PREFIX):].isdigit() and (p / ".metadata").is_file()]
    return sorted(steps)


def latest_complete(folder: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    steps = complete_steps(folder)
    return step_dir(folder, steps[-1]) if steps else None


def retained(steps: list[int], keep: int) -> list[int]:
    """The steps a keep-the-last-`keep` policy keeps (the others may be deleted)."""
    positive_int("keep", keep)
    return sorted(steps)[-keep:]


def saved_world_size(path: str | os.PathLike) -> int:
    """How many ranks wrote a checkpoint: the distinct `rng.rank{r}` entries of its metadata."""
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    return len({key.split(".")[1] for key in meta.state_dict_metadata if key.startswith("rng.rank")})


def weights_checksum(model: torch.nn.Module) -> str | None:
    """sha256 of the full weights, by name, on rank 0 (None elsewhere): equal iff bitwise equal.

    Collective: every rank gathers its shards to rank 0's CPU memory (cpu_offload), never to a GPU.
    """
    import hashlib

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if _rank() != 0:
        return None
    digest = hashlib.sha256()
    for name, t in sorted(full.items()):
        digest.update(name.encode() + t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


class Checkpointer:
    """Saves and loads `step_N/` checkpoints in `folder` with DCP. Construct it on every rank (collective)."""

    def __init__(self, folder: str | os.PathLike, *, keep: int = 3, async_save: bool = True,
                 timeout: float | None = None):
        self.folder, self.keep, self.async_save = Path(folder), positive_int("keep", keep), bool(async_save)
        # A group of its own for the background writer (see the module docstring); gloo: a CPU
        # backend, which async_save requires even when training runs on NCCL. `timeout` (seconds): how
        # long its collectives wait for a silent peer (the default group's default is 30 minutes).
        kw = {} if timeout is None else {"timeout": timedelta(seconds=positive_real("timeout", timeout))}
        self.group = dist.new_group(backend="gloo", **kw) if dist.is_initialized() else None
        self._future = None
        self._landed_event = threading.Event()
        self._error: BaseException | None = None
        self.last_complete: int | None = None
        if _rank() == 0 and self.folder.is_dir():
            for stale in self.folder.glob("*.tmp"):  # a save killed before its metadata landed: never complete
                shutil.rmtree(stale, ignore_errors=True)
        if self.group is not None:
            dist.barrier(group=self.group)  # nobody writes into a folder rank 0 is still cleaning

    # ------------------------------------------------------------------ save
    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **others) -> None:
        """Checkpoint `step` (async unless constructed with async_save=False); waits for the previous save first."""
        self.wait()  # one save in flight: its staged copy is the memory we can afford for checkpoints
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "rng": {f"rank{_rank()}": rng_state()},
                 "others": {k: _state_of(v) for k, v in others.items()}}
        tmp = step_dir(self.folder, step).with_suffix(".tmp")
        # The in-progress folder exists from this call on, not from whenever the writer thread gets to it:
        # a kill right after save() began (a loaded machine delays that thread) leaves the *.tmp that says so.
        tmp.mkdir(parents=True, exist_ok=True)
        if self.async_save:
            self._landed_event.clear()
            self._future = dcp.async_save(state, checkpoint_id=tmp, process_group=self.group)
            self._future.add_done_callback(lambda f: self._landed(step, f))  # runs in the writer thread
        else:
            dcp.save(state, checkpoint_id=tmp, process_group=self.group)
            self._landed(step, None)
            self._agree()

    def _landed(self, step: int, future) -> None:
        try:
            if future is not None:
                future.result()  # re-raises the writer's error, if any
            if _rank() == 0:  # every rank's files and the metadata are on disk: make it visible, atomically
                final = step_dir(self.folder, step)
                if final.exists():  # the same step again (after a rollback): the new one replaces it
                    _discard(final)
                os.replace(final.with_suffix(".tmp"), final)
                fsync_dir(self.folder)
                for old in set(complete_steps(self.folder)) - set(retained(complete_steps(self.folder), self.keep)):
                    _discard(step_dir(self.folder, old))
            self.last_complete = step
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = exc
        finally:
            self._landed_event.set()

    def wait(self) -> None:
        """Block until the save in flight has landed (renamed); raise its error if it failed."""
        if self._future is not None:
            # not future.result(): a waiter may wake before the done-callback (the rename) has run
            self._landed_event.wait()
            self._future = None
            self._agree()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the previous checkpoint save failed") from error

    def _agree(self) -> None:
        """Every rank past rank 0's rename: afterwards all ranks see the same complete checkpoints."""
        if self.group is not None:
            dist.barrier(group=self.group)

    # ------------------------------------------------------------------ load
    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **others) -> dict | None:
        """Restore the newest complete checkpoint in place (any world size); None when there is none.

        `others` are objects with state_dict()/load_state_dict() (a scheduler) or plain dicts, updated
        in place. Returns {"step", "path", "saved_world_size", "world_size", "resharded"}.
        """
        self.wait()
        path = latest_complete(self.folder)
        if path is None:
            return None
        saved = saved_world_size(path)
        model_sd, optim_sd = get_state_dict(model, optimizer)  # the target layout: THIS run's shards
        state = {"model": model_sd, "optim": optim_sd, "others": {k: _state_of(v) for k, v in others.items()}}
        same = saved == _world()
        if same:  # rank r continues rank r's random stream
            state["rng"] = {f"rank{_rank()}": rng_state()}
        dcp.load(state, checkpoint_id=path, process_group=self.group)  # reads only the slices this rank needs
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        for name, obj in others.items():
            if isinstance(obj, dict):
                obj.clear()
                obj.update(state["others"][name])
            else:
                obj.load_state_dict(state["others"][name])
        if same:
            set_rng_state(state["rng"][f"rank{_rank()}"])
        step = int(path.name[len(_PREFIX):])
        return {"step": step, "path": str(path), "saved_world_size": saved, "world_size": _world(),
                "resharded": not same}


def _state_of(obj):
    return dict(obj) if isinstance(obj, dict) else obj.state_dict()


def _discard(path: Path) -> None:
    """Out of the complete set first (an atomic rename to *.tmp), then deleted: a kill in between leaves only *.tmp."""
    doomed = path.with_name(path.name + ".old.tmp")
    shutil.rmtree(doomed, ignore_errors=True)  # left by an earlier discard of the same step
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
