"""Process cleanup, the one way: nothing the course starts may outlive the one who started it.

Used by the launcher (`launch`, `launch_script`), the grader and its pytest plugin, and the tests'
browser driver. Seven tools, each for one situation:

- `die_with_parent()` in a child (Linux `PR_SET_PDEATHSIG`): the kernel SIGKILLs it the moment the
  thread that forked it dies, even when that parent was SIGKILLed and ran no cleanup at all.
  Pass `parent=` (the forking process's pid, read before the fork) to close the race where the
  parent dies between the fork and the call: the child then exits at once.
- `kill_tree(pids)`: SIGKILL each process and every descendant it started, then reap them.
- `kill_groups(pgids)`: SIGKILL every member of each process group, including what a group leader
  started and left behind after it exited (its orphans are no longer its descendants).
- `subreaper()`: while it is active, orphans (double-forked daemons) re-parent to us instead of
  init, so `kill_descendants()` still finds them.
- `stop(popen, grace)`: ask a child and its tree to stop (SIGTERM), wait `grace` seconds, then SIGKILL.
- `kill_descendants()`: kill everything below this process (in a subreaper: orphans included).
- `on_stop_signals(handler, signals)`: stop on SIGINT/SIGTERM/SIGHUP, but leave a SIGHUP that was ignored
  when we started ignored (`nohup m11 grade …` must outlive the terminal that started it).
- `exit_on_failure(main)` in a training script's rank: a failure prints its traceback and the process
  leaves with its own exit code at once, instead of unwinding past live gloo and checkpoint threads.

`death_signal_preexec()` is `die_with_parent` for a child started with `subprocess.Popen`.
For programs whose descendants escape all of these (torchrun's ranks), run them tethered:
`m11_helpers.tether` (a supervisor that kills the whole tree once the caller is gone).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

if TYPE_CHECKING:
    import psutil
# psutil is imported where used: the tethered supervisor (m11_helpers.tether) loads this file by path
# and wants it only once its program runs

__all__ = ["die_with_parent", "death_signal_preexec", "kill_tree", "kill_groups", "subreaper", "kill_descendants",
           "stop", "on_stop_signals", "exit_on_failure"]

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL, *, parent: int | None = None) -> None:
    """Linux: get `sig` when the parent dies (call in the child; a no-op elsewhere).

    `parent`: the pid that forked us (`os.getpid()` read before the fork). If it died between the
    fork and this call, nobody will ever send `sig`: exit at once (status 1) instead of running on.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if parent is not None and os.getppid() != parent:
            os._exit(1)


def death_signal_preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when the calling thread dies (Linux).

    Made in the parent (no library loading between fork and exec); if the parent is already gone
    when the child gets there, the child exits at once: nobody would ever send the signal.
    """
    prctl, parent = _prctl(), os.getpid()

    def preexec() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

    return preexec


def _tree(pids: Sequence[int]) -> list[psutil.Process]:
    import psutil

    procs: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            procs += p.children(recursive=True) + [p]
    return procs


def kill_tree(pids: Sequence[int], grace: float = 0.0) -> None:
    """SIGKILL each pid and everything it started, then reap; `grace` seconds of SIGTERM first."""
    import psutil

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


def kill_groups(pgids: Sequence[int]) -> None:
    """SIGKILL every process in each process group; a group whose leader exited lives on while a member does.

    Safe after the leader was reaped: the kernel never hands out a pid that is still some group's id.
    """
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


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
    import psutil

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


def on_stop_signals(handler: Callable, signals: Sequence[int]) -> dict[int, object]:
    """Install `handler` for each of `signals`; return the handlers it replaced (to put back afterwards).

    A SIGHUP ignored on entry stays ignored: that is `nohup`'s promise (the job outlives the terminal),
    which a handler of our own would break. SIGINT and SIGTERM are always ours: a script started in the
    background inherits SIGINT ignored, yet a `kill -INT` sent to it means stop.
    """
    return {s: signal.signal(s, handler) for s in signals
            if not (s == getattr(signal, "SIGHUP", None) and signal.getsignal(s) == signal.SIG_IGN)}


def exit_on_failure(main: Callable[[], object]) -> None:
    """Run `main()`; if it raises, print the traceback and `os._exit` with its code (SystemExit's, else 1).

    A rank that fails while gloo and checkpoint threads still run can abort in the interpreter's exit
    ("terminate called without an active exception": exit -6, about once in four crash drills on a
    loaded machine), which hides the failure from torchrun's report. Returns normally when `main` does.
    """
    import traceback

    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - a failed rank exits with its own code, whatever still runs
        code = 1
        if not isinstance(exc, SystemExit):
            traceback.print_exc()
        elif exc.code is None or isinstance(exc.code, int):  # as the interpreter reads SystemExit
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
