"""Has the graded kernel stopped answering? Asked on its control channel while the grader waits for a reply.

A kernel answers its control channel from a thread of its own, also while a cell computes (a busy
loop, a sleep, torch matmuls: a kernel_info reply within 0.1 s, measured on ipykernel 7.4); one whose
builtins a cell broke (`builtins.isinstance = None`) answers nothing, not its cell, not the guard.
Silent for STALL_S, the plugin stops it (engine/plugin.py) and the cell fails with the reason, instead
of every later cell and guard call waiting out its timeout. Used by the plugin's kernel and by the
guard's driver; imports nothing of the course.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["PROBE_S", "STALL_S", "Quiet"]

PROBE_S = 2.0  # ask once a reply is this late, and at most this often
STALL_S = 15.0  # silent this long (each question waits up to 5 s): stalled


class Quiet:
    """How long a kernel has not answered its control channel, asked at most every PROBE_S while waiting."""

    def __init__(self, answering: Callable[[], bool]) -> None:
        self.answering, self.since, self.asked = answering, None, 0.0

    def stalled(self, waiting_since: float) -> bool:
        now = time.monotonic()
        if now - waiting_since < PROBE_S or now - self.asked < PROBE_S:
            return False
        self.asked = now
        if self.answering():
            self.since = None
            return False
        self.since = self.since or now
        return time.monotonic() - self.since >= STALL_S
