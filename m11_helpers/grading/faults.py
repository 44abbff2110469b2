"""Checks that provoke the failure a mechanism must survive: a large message, a SIGKILL in mid-save.

Two helpers for check cells (each raises `AssertionError` worded like `checks`: "Exercise 2.5: ..."):

    out = expect_no_deadlock(my_exchange, exercise="2.5", nbytes=8 << 20, timeout=15)
    # runs my_exchange(message) on 2 real ranks with an 8 MiB float32 message per rank; ranks stuck
    # in send/recv (every rank idle for 4 s, or still running after `timeout` s) fail the check
    # as "deadlock: a blocking send before the matching receive"; otherwise each rank's return value,
    # for the check to compare

    report = expect_atomic_save(my_atomic_save, tmp / "ckpt.pt", exercise="10.2")
    # runs my_atomic_save(obj, path) in forked children and SIGKILLs each at a random moment of the
    # write (and, on Linux, the moment it opens `path` itself for writing); after every kill `path`
    # must still load, as the previous checkpoint or the new one, never torn, never missing

`crash_during_save` is the observation behind the second one, for checks that want the details.
Why a large message: NCCL and MPI complete small sends eagerly (buffered), so "send, then receive"
on every rank only deadlocks once the message is too big to buffer; gloo blocks at any size. Kill
moments are random but reproducible (`seed`); on Linux the child's open files are also watched
(/proc/PID/fd), so a save that writes `path` in place is caught every time, not by luck (a save
that renames a file it still holds open for writing counts as writing in place: the close that
follows writes into the target).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable

from m11_helpers.grading.checks import fail
from m11_helpers.launch.base import LaunchError, LaunchTimeout
from m11_helpers.launch.fork import launch
from m11_helpers.procs import die_with_parent

__all__ = ["DEADLOCK", "expect_no_deadlock", "SaveCrash", "crash_during_save", "expect_atomic_save"]

DEADLOCK = "deadlock: a blocking send before the matching receive"
# Seconds in which no rank still running computes: a deadlock then (each waits on another, none will move).
# Far above a scheduler's slice on a loaded machine, far below `timeout`, which still bounds a busy loop.
STALL_S = 4.0
_P2P = {"send", "recv", "isend", "irecv", "wait", "batch_isend_irecv", "sendrecv"}


def _message(nbytes: int):
    import torch
    import torch.distributed as dist

    from m11_helpers.launch.base import rank_device

    n = max(1, nbytes // 4)  # on the rank's device: NCCL sends no CPU tensor
    return torch.arange(n, dtype=torch.float32, device=rank_device()) + 1e6 * dist.get_rank()  # (nbytes/4,)


def _with_message(fn: Callable, nbytes: int, args: tuple, kwargs: dict):
    return fn(_message(nbytes), *args, **kwargs)


def expect_no_deadlock(fn: Callable, *args: Any, exercise: str, nbytes: int = 8 << 20, num_processes: int = 2,
                       timeout: float = 15.0, hint: str = "", stall_timeout: float = STALL_S, **kwargs: Any) -> list[Any]:
    """Run `fn(message, *args)` on real ranks; fail as a deadlock when they are still stuck after `timeout` s,
    or sooner, when every rank still running sat idle for `stall_timeout` s (each waits on another)."""
    try:
        return launch(_with_message, fn, nbytes, args, kwargs, num_processes=num_processes, timeout=timeout,
                      stall_timeout=stall_timeout, show_output=False)
    except LaunchTimeout as e:
        where = dict(re.findall(r"rank (\d+) was at .* in (\w+)", str(e)))
        stuck = ", ".join(f"rank {r} in {f}" for r, f in sorted(where.items())) or "no stack"
        what = DEADLOCK if not where or set(where.values()) <= _P2P else "the ranks hung (a deadlock or a loop)"
        waited = (f"every rank sat idle, waiting, for {stall_timeout:g} s" if set(e.failures.values()) == {"stalled"}
                  else f"still waiting after {timeout:g} s")
        fail(exercise, f"{what}: {waited} with a {nbytes / 2**20:g} MiB message "
              f"({stuck})", hint=hint or "post the receive first, or use dist.isend and wait after the "
                                           "receive, or pair the ranks: even ranks send first, odd ranks receive first",
              show_values=False)
    except LaunchError as e:
        if "NotImplementedError" in str(e):  # a stub inside a rank: `checking` says "not implemented yet"
            raise NotImplementedError("not implemented yet") from None
        raise


@dataclasses.dataclass
class SaveCrash:
    """What SIGKILLs during a save left at `path`: one outcome per kill, and whether `path` was written in place."""

    path: str
    outcomes: list[str]  # per kill: "old" | "new" (loads, complete) | "torn" (does not load) | "missing"
    in_place: bool  # the child opened `path` itself for writing (seen in /proc on Linux)
    clean_run: str  # what an uninterrupted save left: "new" when it works at all
    leftovers: list[str]  # files the save left beside `path` after an uninterrupted run

    @property
    def ok(self) -> bool:
        return self.clean_run == "new" and not self.in_place and all(o in ("old", "new") for o in self.outcomes)

    def explain(self) -> str:
        name = Path(self.path).name
        if self.clean_run != "new":
            return f"an uninterrupted save left {name} {self.clean_run}"
        if self.in_place:
            return (f"the save opened {name} itself for writing: a crash in mid-write tears the only checkpoint "
                    f"(after {len(self.outcomes)} kills: {', '.join(self.outcomes)})")
        bad = [o for o in self.outcomes if o not in ("old", "new")]
        if bad:
            return f"{len(bad)} of {len(self.outcomes)} kills in mid-save left {name} {bad[0]}"
        return f"every kill left {name} loadable ({', '.join(self.outcomes)})"


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _state(path: Path, load: Callable, old: Any, new: Any) -> str:
    if not path.exists():
        return "missing"
    try:
        got = load(path)
    except Exception:  # noqa: BLE001 - any failure to load is a torn file
        return "torn"
    return "new" if _same(got, new) else "old" if _same(got, old) else "torn"


def _writes_target(pid: int, target: str) -> bool:
    """Linux: `pid` holds `target` open for writing (a save in place)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                flags = open(f"/proc/{pid}/fdinfo/{fd}").read().split("flags:")[1].split()[0]
                if int(flags, 8) & (os.O_WRONLY | os.O_RDWR):
                    return True
        except (OSError, IndexError, ValueError):
            continue
    return False


def _run_child(save: Callable, obj: Any, path: Path, kill_after: float | None,
               limit: float) -> tuple[bool, float, str]:
    """Fork a child that saves; SIGKILL it after `kill_after` s, or the moment it opens `path` for writing
    (`kill_after=None`: an uninterrupted run, only watched).

    Returns (opened `path` for writing, seconds, the exception the save raised or "").
    """
    start = time.monotonic()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(err_r)
            die_with_parent()  # the kernel gone, no orphan finishes its save later
            import torch

            torch.set_num_threads(1)  # a forked child of a process that computed with threads may hang
            save(obj, path)
            status = 0
        except BaseException as e:  # noqa: BLE001 - the parent reports it
            os.write(err_w, f"{type(e).__name__}: {e}".encode()[:2000])
        finally:
            os._exit(status)
    os.close(err_w)
    in_place, target = False, str(path.resolve())
    try:
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return in_place, time.monotonic() - start, os.read(err_r, 2000).decode(errors="replace")
            elapsed = time.monotonic() - start
            if _writes_target(pid, target):
                in_place = True
            if (in_place and kill_after is not None) or (kill_after is not None and elapsed >= kill_after) \
                    or elapsed > limit:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return in_place, elapsed, ""
            time.sleep(0.0005)
    finally:
        os.close(err_r)


def crash_during_save(save: Callable, path: str | os.PathLike, obj: Any = None, *, kills: int = 6, seed: int = 0,
                      load: Callable | None = None, timeout: float = 60.0) -> SaveCrash:
    """SIGKILL `save(obj, path)` at `kills` random moments of its run, each over a previous checkpoint."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    load = load or (lambda p: torch.load(p, weights_only=True))
    new = obj if obj is not None else {"w": torch.arange(1 << 23, dtype=torch.float32), "step": 2}  # 32 MiB
    old = {"w": torch.zeros(4), "step": 1}
    before = set(os.listdir(path.parent))
    torch.save(old, path)
    in_place, took, error = _run_child(save, new, path, None, timeout)
    if error.startswith("NotImplementedError"):  # the exercise's stub: `checking` says "not implemented yet"
        raise NotImplementedError("not implemented yet")
    clean = _state(path, load, old, new) if not error else f"as before: the save raised {error.splitlines()[0]}"
    leftovers = sorted(set(os.listdir(path.parent)) - before - {path.name})
    rng, outcomes = random.Random(seed), []
    for _ in range(kills):
        torch.save(old, path)
        hit, _, _ = _run_child(save, new, path, rng.uniform(0.0, max(took, 1e-3)), timeout)
        in_place |= hit
        outcomes.append(_state(path, load, old, new))
    return SaveCrash(str(path), outcomes, in_place, clean, leftovers)


def expect_atomic_save(save: Callable, path: str | os.PathLike, *, exercise: str, obj: Any = None, kills: int = 6,
                       seed: int = 0, load: Callable | None = None, hint: str = "") -> SaveCrash:
    """Fail the check unless every SIGKILL during `save` leaves `path` loadable (old or new), never torn."""
    report = crash_during_save(save, path, obj, kills=kills, seed=seed, load=load)
    if not report.ok:
        fail(exercise, f"not crash-safe: {report.explain()}.", show_values=False,
              hint=hint or "write a temporary file in the same folder, flush and fsync it, then os.replace it "
                           "over the target")
    return report
