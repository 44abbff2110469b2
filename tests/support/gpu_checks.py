"""Stand-in GPU checks for tests/test_gpu_check.py: module-level, so a spawned process imports them by name.

Light on purpose (no torch at import): each runs in a fresh interpreter, which imports this module.
"""

from __future__ import annotations

import os
import signal
import time

from m11_helpers.tools.gpu_check.checks import Outcome, Skip


def reports_its_pid(ctx: dict) -> Outcome:
    return Outcome(str(os.getpid()))


def fails(ctx: dict) -> Outcome:
    raise RuntimeError("CUDA error: out of memory")


def skips(ctx: dict) -> Outcome:
    raise Skip("needs 2 GPUs, found 1")


def dies(ctx: dict) -> Outcome:
    os.kill(os.getpid(), signal.SIGKILL)  # as a CUDA fault or the OOM killer would
    raise AssertionError("unreachable")


def hangs(ctx: dict) -> Outcome:
    time.sleep(600)
    return Outcome("never")
