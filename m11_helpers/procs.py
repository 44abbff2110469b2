"""Process cleanup, the one way: nothing the course starts may outlive the one who started it.

Used by the launcher (`launch`, `launch_script`), the grader and its pytest plugin, and the tests'
browser driver. Six tools, each for one situation:

- `die_with_parent()` in a child (Linux `PR_SET_PDEATHSIG`): the kernel SIGKILLs it the moment the
  thread that forked it dies, even when that parent was SIGKILLed and ran no cleanup at all.
- `kill_tree(pids)`: SIGKILL each process and every descendant it started, then reap them.
- `subreaper()`: while it is active, orphans (double-forked daemons) re-parent to us instead of
  init, so `kill_descendants()` still finds them.
- `stop(popen, grace)`: ask a child and its tree to stop (SIGTERM), wait `grace` seconds, then SIGKILL.
- `tethered(argv)` / `tethered_popen(argv)`: run a program under a supervisor (a child subreaper in a
  session of its own, polling its parent every 20 ms) that SIGKILLs the whole tree once the caller is
  gone, however it ended, or when told to stop (SIGTERM/SIGHUP): for programs whose descendants
  escape the tools above, as torchrun's ranks do (`m11_helpers.launch.script` says why). Used for
  `accelerate launch` and for the m11 tools' notebook kernels (`m11_helpers.tools.kernels`).
- `end_descendants()`: stop everything this process started; tethered supervisors among them stop
  their own trees and remove their folders first.

`death_signal_preexec()` is `die_with_parent` for a child started with `subprocess.Popen`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

if TYPE_CHECKING:
    import psutil
# psutil is imported where used: the supervisor loads this file, and wants it only once its program runs

__all__ = ["die_with_parent", "death_signal_preexec", "kill_tree", "subreaper", "kill_descendants", "stop",
           "tethered", "tethered_popen", "end_descendants"]

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


# ----------------------------------------------------------------------------------------------
# tethered(argv): a supervisor that outlives the caller just long enough to kill the tree
# ----------------------------------------------------------------------------------------------

_POLL_S = 0.02  # how often the supervisor looks at its parent and its child
_TAG = "m11_supervisor"  # in every supervisor's command line: how end_descendants() recognises one


def tethered(argv: Sequence[str], *, remove_if_abandoned: Sequence[str | os.PathLike] = ()) -> list[str]:
    """The command line that runs `argv` under a supervisor tied to this process (see the module docstring).

    `remove_if_abandoned`: folders the supervisor deletes after the kill when the program did not end
    by itself (this process died, or the supervisor got SIGTERM): what our own cleanup would remove.
    """
    # Load this file by path: the supervisor starts in ~0.1 s without importing the package, and
    # with cwd dropped from sys.path nothing in the caller's folder can shadow a module.
    boot = ("import sys; sys.path = [p for p in sys.path if p]; import importlib.util as u; "
            f"s = u.spec_from_file_location({_TAG!r}, {os.path.abspath(__file__)!r}); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); m._supervise(sys.argv[1:])")
    extra = [str(d) for d in remove_if_abandoned]
    return [sys.executable, "-c", boot, str(os.getpid()), *extra, "--", *argv]


def tethered_popen(argv: Sequence[str], *, remove_if_abandoned: Sequence[str | os.PathLike] = (),
                   **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(argv, ...)` under a tethered supervisor in a session of its own.

    The Popen is the supervisor's: its `returncode` is the program's, `kill_tree([p.pid])` stops all.
    """
    return subprocess.Popen(tethered(argv, remove_if_abandoned=remove_if_abandoned), start_new_session=True,
                            **popen_kwargs)


def end_descendants(timeout: float = 5.0, spared: set[int] = frozenset()) -> None:
    """Stop every descendant not in `spared`: SIGKILL now, except tethered supervisors and what they watch over.

    The outermost supervisors among them get SIGTERM and up to `timeout` s to stop their own trees
    (with the same rule, so nested ones clean up too) and remove their folders; then whatever is
    left gets SIGKILL. Call it in a subreaper (a supervisor, `m11 course`): orphans re-parent here.
    """
    import psutil

    me = psutil.Process()
    below: dict[int, set[int]] = {}  # supervisor pid -> the pids it watches over
    procs = _below(me, spared)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if any(_TAG in part for part in p.cmdline()[:3]):
                below[p.pid] = {c.pid for c in p.children(recursive=True)}
    managed = set(below).union(*below.values())
    outermost = [p for p in procs if p.pid in below and not any(p.pid in pids for pids in below.values())]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.pid not in managed:
                p.kill()
            elif p in outermost:
                p.terminate()
    deadline = time.monotonic() + timeout  # not psutil.wait_procs: it never reaps a process that
    while time.monotonic() < deadline and any([_running(p) for p in outermost]):  # re-parents here
        time.sleep(0.01)
    _kill_everything_below(spared=spared)


def _running(p) -> bool:
    """Still running? (A zombie child of ours is reaped here.)"""
    import psutil

    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(p.pid, os.WNOHANG)
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _supervise(args: list[str]) -> None:
    """The supervisor's body: start the program, watch the caller, leave nothing behind. Never returns."""
    cut = args.index("--")
    parent, folders, argv = int(args[0]), args[1:cut], args[cut + 1:]
    stopped: list[int] = []
    # An interrupt is for the program: Jupyter sends it to the whole process group, program included.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stopped.append(signum))
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    code = None
    if os.getppid() == parent:  # else the caller is already gone: start nothing
        die = death_signal_preexec()  # the program dies with us, whoever kills us

        def preexec() -> None:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # an ignored signal would stay ignored after exec
            die()

        try:
            child = subprocess.Popen(argv, preexec_fn=preexec)
        except OSError as exc:
            print(f"cannot start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
            os._exit(127)
        import psutil  # noqa: F401 - now, while the program starts, not when every millisecond counts
        while not stopped and os.getppid() == parent:
            code = child.poll()
            if code is not None:
                break
            time.sleep(_POLL_S)
    end_descendants()
    if stopped or os.getppid() != parent:  # abandoned: nobody else will remove these
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    if code is None:
        code = -(stopped[0] if stopped else signal.SIGKILL)
    if code < 0:  # end the way the program ended, so the caller's Popen.returncode is the program's
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _kill_everything_below(timeout: float = 10.0, spared: set[int] = frozenset()) -> None:
    """SIGKILL every descendant (orphans re-parent here: we are a subreaper) and reap, until none is left.

    Processes in `spared`, and what they start, are left alone.
    """
    import psutil

    me = psutil.Process()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = _below(me, spared)
        if not procs:
            return
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p.pid, os.WNOHANG)  # reap it if it is our child (killed, or re-parented here)
        time.sleep(0.01)


def _below(me, spared: set[int]) -> list:
    """Descendants of `me`, without those in `spared` and their own descendants."""
    import psutil

    found = []
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid not in spared and not spared.intersection(q.pid for q in p.parents()):
                found.append(p)
    return found
