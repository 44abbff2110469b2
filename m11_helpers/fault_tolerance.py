"""Fault-tolerant training: catch the spot notice, agree across ranks, checkpoint atomically, resume exactly.

    notice = PreemptionNotice()                 # SIGTERM (the spot notice) only sets a flag
    ...
    if notice.agreed(device=device):            # all_reduce(flag, MAX): every rank stops at the SAME step
        atomic_save(state, "ckpt/last.pt")      # rank 0: temp file + fsync + rename
    state = load_checkpoint("ckpt/last.pt")     # torch.load(weights_only=True): no code runs on load

One file written by rank 0 suits a small replicated model (lesson 10's exercises, `scripts/train_spot.py`);
sharded models use `m11_helpers.sharded_checkpoint` (DCP: every rank its shards, any world size on load),
which reuses `rng_state`, `set_rng_state` and `fsync_dir` from here.

Why each piece (Lesson 10):
- A signal handler must not do I/O or collectives (it runs between two bytecodes of whatever the rank
  was doing, maybe inside an all-reduce): it sets a flag; the training loop checks it at a step boundary.
- The signal reaches ranks at slightly different moments; without agreement one rank leaves the loop
  while its peers wait in the next all-reduce forever. `all_reduce(MAX)` once per step is 1 scalar.
- A preempted writer leaves a half-written file. Writing to a temporary file in the same directory,
  fsync-ing it and `os.replace`-ing it over the old name is atomic on POSIX: a reader sees the old
  checkpoint or the new one, never a torn one.
- Bit-exact resume needs more than the weights: optimizer moments, scheduler, every RNG (per rank!)
  and the position in the data stream.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from m11_helpers.device_state import rng_state, set_rng_state  # the kit's, re-exported: checkpoints use them
from m11_helpers.launch.base import rank_device
from m11_helpers.validate import non_negative_int, positive_int

__all__ = ["PreemptionNotice", "fsync_dir", "atomic_save", "naive_save", "load_checkpoint", "latest_checkpoint",
           "rng_state", "set_rng_state", "gather_rng_states", "batch_indices", "state_checksum"]


class PreemptionNotice:
    """Turn SIGTERM (the cloud's preemption notice) into a flag the ranks agree on at a step boundary."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.received = False
        self.signum: int | None = None
        for s in signals:
            signal.signal(s, self._handler)

    def _handler(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        # Only set a flag: no I/O, no collectives in a handler (it may interrupt one).
        self.received = True
        self.signum = signum

    def agreed(self, device: torch.device | str | None = None, group=None) -> bool:
        """True on every rank if ANY rank got the notice (one all_reduce(MAX) of a scalar).

        `device`: where the flag lives; the training device on GPUs (an NCCL-only group cannot reduce a
        CPU tensor); None: this rank's (`launch.rank_device()`: its GPU under NCCL, the CPU under gloo). `group`: the process group (None: the default one).
        """
        flag = torch.tensor([1.0 if self.received else 0.0], device=device or rank_device())  # (1,)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    def drill(self, wait: float = 20.0) -> None:
        """DRILL (the scripts' --preempt-at / --notice-at): a real SIGTERM, sent the way the cloud's reaches a job,
        then wait (at most `wait` s) until it is back here, so the ranks agree at the very next step.

        Under torchrun (`accelerate launch`), to the agent, which forwards it to every rank; with no agent
        above (ranks forked by `m11_helpers.launch`), to this process only.
        """
        os.kill(os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else os.getpid(), signal.SIGTERM)
        self.wait(wait)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the notice has arrived (at most `timeout` s; None: for as long as it takes); True if it has."""
        deadline = None if timeout is None else time.monotonic() + timeout  # m11: cpu-only - a wait, not a timing
        while not self.received and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return self.received


def fsync_dir(folder: str | os.PathLike) -> None:
    """fsync a directory, so a rename inside it survives a power cut (best effort: some filesystems refuse)."""
    # The rename itself lives in the directory entry, not in the file: flushing the file is not enough.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)



def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save to a temporary file in the same folder, flush + fsync, then os.replace over `path`.

    Killed at any moment, `path` holds either the previous checkpoint or the new one, whole.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # same filesystem
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()  # Python's buffer -> the kernel
            os.fsync(f.fileno())  # the kernel's page cache -> the disk
        os.replace(tmp, path)  # atomic on POSIX (and on Windows for the same volume)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def naive_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save straight over `path`: what NOT to do (a kill mid-write leaves a torn file). For the lesson."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


def load_checkpoint(path: str | os.PathLike) -> dict:
    """torch.load(path, weights_only=True): tensors, numbers, strings and containers only, no code executed."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must be an existing checkpoint file, got {str(path)!r}")
    return torch.load(path, map_location="cpu", weights_only=True)


def latest_checkpoint(folder: str | os.PathLike, pattern: str = "*.pt") -> Path | None:
    """The newest complete checkpoint in `folder` (temporary files are hidden `.name.*.tmp`), or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = [p for p in folder.glob(pattern) if not p.name.startswith(".")]
    return max(files, key=lambda p: p.stat().st_mtime_ns) if files else None


def gather_rng_states() -> list[dict]:
    """Every rank's `rng_state()`, in rank order, on every rank (ranks draw different random numbers)."""
    mine = rng_state()
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def batch_indices(step: int, global_batch: int, n: int, seed: int = 0) -> torch.Tensor:
    """Row indices of global batch `step`: a fresh seeded permutation per epoch, so the data position is one int.

    (global_batch,) int64. Resuming at `step` reads exactly the rows the uninterrupted run would have.
    """
    if positive_int("global_batch", global_batch) > n:
        raise ValueError(f"global_batch must be in 1..n={n}, got {global_batch}")
    non_negative_int("step", step)
    per_epoch = n // global_batch  # drop the last partial batch: every step has the same shape
    epoch, k = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)  # depends only on (seed, epoch)
    perm = torch.randperm(n, generator=g)  # (n,)
    return perm[k * global_batch:(k + 1) * global_batch]


def state_checksum(module: torch.nn.Module) -> str:
    """A bit-level fingerprint of the weights (sha256 of the raw bytes): equal iff bitwise equal."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
