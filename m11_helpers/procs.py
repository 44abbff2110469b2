"""Process cleanup, the one way: nothing the course starts may outlive the one who started it.

Used by the launcher (`launch`, `launch_script`), the grader and its pytest plugin, and the tests'
browser driver. Four tools, each for one situation:

- `die_with_parent()` in a child (Linux `PR_SET_PDEATHSIG`): the kernel SIGKILLs it the moment the
  thread that forked it dies, even when that parent was SIGKILLed and ran no cleanup at all.
- `kill_tree(pids)`: SIGKILL each process and every descendant it started, then reap them.
- `subreaper()`: while it is active, orphans (double-forked daemons) re-parent to us instead of
  init, so `kill_descendants()` still finds them.
- `stop(popen, grace)`: ask a child and its tree to stop (SIGTERM), wait `grace` seconds, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import Iterator, Sequence

import psutil

__all__ = ["die_with_parent", "kill_tree", "subreaper", "kill_descendants", "stop"]

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: get `sig` when the parent dies (call in the child; a no-op elsewhere)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _tree(pids: Sequence[int]) -> list[psutil.Process]:
    procs: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            procs += p.children(recursive=True) + [p]
    return procs


def kill_tree(pids: Sequence[int], grace: float = 0.0) -> None:
    """SIGKILL each pid and everything it started, then reap; `grace` seconds of SIGTERM first."""
    procs = _tree(pids)
    if grace > 0:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, procs = psutil.wait_procs(procs, timeout=grace)
        procs += [q for q in _tree(pids) if q not in procs]  # children started during the grace period
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)
    for pid in pids:  # reap our own children so none stays a zombie
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Be a child subreaper meanwhile: orphans re-parent to this process, not init.

    The previous setting comes back afterwards, so a host process (a test session) does not keep
    collecting other programs' orphans.
    """
    prctl = _prctl()
    before = ctypes.c_int(0)
    if prctl is not None:
        prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        if prctl is not None:
            prctl(_PR_SET_CHILD_SUBREAPER, before.value, 0, 0, 0)


def kill_descendants(spared: set[int] = frozenset()) -> None:
    """Kill every descendant of this process not in `spared`, repeatedly, until none is left; reap them."""
    me = psutil.Process()
    for _ in range(10):
        procs = [p for p in me.children(recursive=True) if p.pid not in spared]
        if not procs:
            return
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(procs, timeout=3)


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a child and its tree politely: SIGTERM to all, up to `grace` seconds to exit, then SIGKILL."""
    kill_tree([proc.pid], grace=grace)  # the tree is listed before the signal: orphans are not missed
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
