"""A pytest plugin for `m11 grade`: record each nbval cell's outcome the moment it completes.

Loaded in the grading subprocess with `-p m11_helpers.grading.engine.plugin`; it does nothing unless
`M11_GRADE_LOG` names a file. Then it:

- appends one JSON line per cell (`start`, then `result` with outcome, error name/value, and
  whether the kernel died in it), flushed at once, so the outcomes survive the run being killed;
- starts the kernel in `M11_GRADE_CWD` (the submitted notebook's folder, not the temp copy's);
- notices a dead kernel (`os._exit`, SIGKILL, a crash) within half a second instead of waiting
  out the cell timeout (nbval only waits for a reply that will never come);
- kills the kernel when a cell outlives `M11_GRADE_CELL_TIMEOUT` plus a grace period, which is
  what a cell that ignores the interrupt and keeps printing needs (nbval would read forever);
- guards every check cell (`metadata.m11.role == "check"`, see guard/driver.py): before it, restores what
  learner code bent and binds pristine check functions; after it, a check cell passes only if the
  guard saw its own code reach `passed(...)` with nothing bent. What it found is recorded as
  `tampering` (the grader scores that exercise 0 and says so); a guard that cannot run fails closed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from queue import Empty
from typing import Any

import pytest

from m11_helpers.grading.cells import CHECK, COURSE, exercise_of, role_of
from m11_helpers.grading.guard.driver import Guard, GuardReport
from m11_helpers.grading.guard.quiet import Quiet
from m11_helpers.grading.runenv import CWD_ENV, LOG_ENV, TIMEOUT_ENV
from m11_helpers.procs import kill_descendants
from m11_helpers.tools.fast_start import skip_iri_grammar

__all__ = ["LOG_ENV", "CWD_ENV", "TIMEOUT_ENV", "GRACE_S", "KernelDied", "KernelStalled"]
GRACE_S = 10.0  # nbval interrupts at the timeout and gives up 5 s later; we step in after that
MAX_TEXT = 4000  # a megabyte of output must not become a megabyte of report

if os.environ.get(LOG_ENV):
    skip_iri_grammar()  # `-p` plugins load before nbval, which imports nbformat (fast_start.py)

_state: dict[str, Any] = {"log": None, "running": None, "alive_at_start": {}, "guarded": {}}


class KernelDied(RuntimeError):
    """The kernel process exited while a cell was running."""


class KernelStalled(KernelDied):
    """The kernel stopped answering even its control channel: stopped, so the run goes on without it."""


def _write(record: dict) -> None:
    log = _state["log"]
    if log is not None:
        log.write(json.dumps(record) + "\n")
        log.flush()  # a SIGKILL of this process must not lose what was already decided


def _patch_nbval() -> None:
    """Point nbval at a kernel that starts in the right folder and notices its own death."""
    import nbval.plugin
    from nbval.kernel import RunningKernel

    class GradedKernel(RunningKernel):
        def __init__(self, kernel_name, cwd=None, startup_timeout=60):
            guard = Guard(None)  # reads what it compares against now, before the kernel runs anything
            super().__init__(kernel_name, cwd=os.environ.get(CWD_ENV) or cwd,
                             startup_timeout=startup_timeout)
            guard.kc = self.kc
            self.m11_guard = guard
            # Scores read an error's name and value only: a plain traceback spares formatting each failing
            # cell's source with context and colour (a tenth of the kernel's time in a run of wrong answers).
            self.kc.execute_interactive("get_ipython().InteractiveTB.set_mode('Plain')", silent=True,
                                        store_history=False, timeout=startup_timeout)
            guard.answering = self.answering
            guard.baseline()

        def answering(self, timeout: float = 5.0) -> bool:
            """Does the kernel answer a kernel_info request on its control channel within `timeout`?"""
            request = self.kc.session.msg("kernel_info_request")
            self.kc.control_channel.send(request)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                try:
                    reply = self.kc.control_channel.get_msg(timeout=left)
                except Empty:
                    break
                if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                    return True
            return False

        def await_reply(self, msg_id, timeout=None):
            start = time.monotonic()
            deadline, quiet = None if timeout is None else start + timeout, Quiet(self.answering)
            while True:
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    raise Empty
                try:
                    return super().await_reply(msg_id, timeout=left)
                except Empty:
                    if not self.is_alive():
                        raise KernelDied("the kernel died while running this cell "
                                         "(os._exit, a signal, a crash or out of memory)") from None
                    if quiet.stalled(start):
                        kill_descendants()  # the kernel (and its ranks): later cells find it dead, the runner reruns
                        raise KernelStalled(f"the kernel stopped answering after {time.monotonic() - start:.0f} s "
                                            "(not even its control channel, which answers while a cell computes): "
                                            "the cell broke the kernel itself, e.g. its builtins") from None

    nbval.plugin.RunningKernel = GradedKernel


def _watchdog(limit: float) -> None:
    """Kill the kernel (this process's children) when one cell runs far past its timeout."""
    while True:
        time.sleep(0.5)
        running = _state["running"]
        if running and time.monotonic() - running[1] > limit:
            _write({"event": "watchdog", "cell": running[0]})
            kill_descendants()
            _state["running"] = None


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    _state["log"] = open(path, "a", encoding="utf-8")
    # The kernel starts after this and inherits our environment: take the log's path out of it, and
    # close our /proc/PID/{fd,environ,mem} to same-uid processes (PR_SET_DUMPABLE = 0) so a notebook
    # cannot find the open log through us. It can still search the file system for it: only the
    # sandbox (grading/sandbox/isolate.py), where the log is not a file at all, closes that (instructor guide).
    os.environ.pop(LOG_ENV, None)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
        except (OSError, AttributeError):
            pass
    _patch_nbval()
    timeout = float(os.environ.get(TIMEOUT_ENV) or 0)
    if timeout > 0:
        threading.Thread(target=_watchdog, args=(timeout + GRACE_S,), daemon=True).start()


def _kernel_alive(item: pytest.Item) -> bool:
    kernel = getattr(item.parent, "kernel", None)
    return bool(kernel is not None and kernel.is_alive())


def _role_of(item: pytest.Item) -> tuple[str | None, str | None]:
    """(role, exercise) of a graded notebook's cell: ("check", "0.2"), ("course", None) or (None, None)."""
    cell = getattr(item, "cell", None) or {}
    if role_of(cell) not in (CHECK, COURSE):
        return None, None
    return role_of(cell), exercise_of(cell)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    cell = getattr(item, "cell_num", None)
    (role, exercise), guard = _role_of(item), getattr(getattr(item.parent, "kernel", None), "m11_guard", None)
    if _state["log"] is not None and cell is not None:
        _state["alive_at_start"][cell] = _kernel_alive(item)
        _write({"event": "start", "cell": cell})
        _state["running"] = (cell, time.monotonic())
        if role == CHECK and guard is not None and _kernel_alive(item):
            _state["guarded"][cell] = [guard.before(exercise, item.cell.source)]
            _stop_if_stalled(guard)
    try:
        yield
    finally:
        if cell in _state["guarded"] and _kernel_alive(item):
            _state["guarded"][cell].append(guard.after(exercise))
            _stop_if_stalled(guard)
        elif role == COURSE and guard is not None and _kernel_alive(item):
            guard.mark(item.cell.source)  # what the course's own cell defined stays the course's
        _state["running"] = None


def _stop_if_stalled(guard: Guard) -> None:
    """A kernel that stopped answering the guard is stopped: the cells after it fail at once, not at their timeouts."""
    if guard.stalled:
        kill_descendants()


def _verdict(reports: list[GuardReport], nbval_passed: bool) -> dict[str, Any]:
    """What the guard adds to a check cell's record: tampering found, or why it could not judge."""
    found = list(dict.fromkeys(t for r in reports for t in r.tampering))
    error = next((r.error for r in reports if r.error), "")
    after = reports[-1] if len(reports) == 2 else None
    if nbval_passed and not error and after is not None and not found:
        if after.fails:  # the cell "passed", yet a check its own code called had failed
            found.append(f"a failing check was hidden: {after.fails[0]}")
        elif not after.passed:
            found.append("the check cell reported success, but its own passed(...) line never ran")
    if nbval_passed and not error and after is None:
        error = "the kernel died before the guard could read the check's result"
    if error:  # fail closed: a check the guard could not watch does not score
        found.append(f"the grader's guard could not check this cell: {error}")
    return {"tampering": found} if found else {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    yield
    cell = getattr(item, "cell_num", None)
    if _state["log"] is None or cell is None:
        return
    exc = call.excinfo
    if call.when == "setup" and exc is None or call.when == "teardown":
        return
    record: dict[str, Any] = {"event": "result", "cell": cell, "when": call.when,
                              "seconds": round(call.duration, 3)}
    guarded = _state["guarded"].pop(cell, None) if call.when == "call" else None
    extra = _verdict(guarded, exc is None) if guarded else {}
    if exc is None and not extra:
        record["outcome"] = "passed"
    elif exc is None:
        record.update(outcome="failed", message="; ".join(extra["tampering"]))
    elif exc.errisinstance(pytest.skip.Exception):
        record["outcome"] = "skipped"
    else:
        record["outcome"] = "failed"
        errors = [o for o in (getattr(item, "test_outputs", None) or []) if o.get("output_type") == "error"]
        if errors:
            record["ename"] = str(errors[-1].get("ename", ""))[:200]
            record["evalue"] = str(errors[-1].get("evalue", ""))[:MAX_TEXT]
        record["message"] = str(exc.value)[:MAX_TEXT]
        alive_before = _state["alive_at_start"].get(cell, True)
        record["fatal"] = call.when == "call" and alive_before and not _kernel_alive(item)
        record["dead_at_start"] = call.when == "call" and not alive_before
    record.update(extra)
    _write(record)
