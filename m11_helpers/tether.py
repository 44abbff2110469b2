"""Run a program tethered to this process: a supervisor kills its whole tree once we are gone.

    argv = tethered(["jupyter", "kernel", ...])        # a command line (for a tool that starts it itself)
    proc = tethered_popen(["accelerate", "launch", ...], stdout=subprocess.PIPE)

The supervisor is a small interpreter between the caller and the program: a child subreaper (orphans
re-parent to it) in a session of its own (a signal to the caller's process group does not kill it
before it cleans up), polling its parent every 20 ms. It SIGKILLs the whole tree once the caller is
gone, however the caller ended (SIGKILL included), or when told to stop (SIGTERM/SIGHUP); when the
program ends by itself it kills what the program left and exits with the program's status. For
programs whose descendants escape `m11_helpers.procs`' tools, as torchrun's ranks do
(`m11_helpers.launch.script` says why): `launch_script`'s `accelerate launch` and the m11 tools'
notebook kernels (`m11_helpers.tools.kernels`).

`end_descendants()`: stop everything this process started; tethered supervisors among them stop
their own trees and remove their folders first.

The supervisor loads this file, and `procs.py` next to it, by path: it starts in ~0.1 s without
importing the package, and with cwd dropped from sys.path nothing in the caller's folder can shadow
a module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

__all__ = ["tethered", "tethered_popen", "end_descendants"]

_POLL_S = 0.02  # how often the supervisor looks at its parent and its child
_TAG = "m11_supervisor"  # in every supervisor's command line: how end_descendants() recognises one


def tethered(argv: Sequence[str], *, remove_if_abandoned: Sequence[str | os.PathLike] = ()) -> list[str]:
    """The command line that runs `argv` under a supervisor tied to this process (see the module docstring).

    `remove_if_abandoned`: folders the supervisor deletes after the kill when the program did not end
    by itself (this process died, or the supervisor got SIGTERM): what our own cleanup would remove.
    """
    # Load this file by path (the module docstring says why).
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

    def record(signum: int, _frame) -> None:
        stopped.append(signum)

    signal.signal(signal.SIGTERM, record)  # the caller's "stop": taken before anything that takes time
    procs = _sibling_procs()
    procs.on_stop_signals(record, (signal.SIGHUP,))  # a closed terminal, unless we run under nohup
    prctl = procs._prctl()
    if prctl is not None:
        prctl(procs._PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    code = None
    if os.getppid() == parent:  # else the caller is already gone: start nothing
        die = procs.death_signal_preexec()  # the program dies with us, whoever kills us

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


def _sibling_procs():
    """`m11_helpers.procs`, loaded by path from the file next to this one (the supervisor imports no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        _TAG + "_procs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "procs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
