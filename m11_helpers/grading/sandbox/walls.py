"""The grading sandbox's walls: its limits, and which of them stopped a cell, named in the report.

`Limits` are what sandbox/isolate.py sets per process (RLIMIT_DATA, RLIMIT_NPROC, RLIMIT_FSIZE, tmpfs sizes).

`annotate(log, limits)` runs when the sandboxed run has ended (sandbox/isolate.py): a failed cell whose error
is what a limit or a missing permission produces (MemoryError, EAGAIN from fork, ENETUNREACH, EROFS…)
gets `[sandbox: stopped by …]` after its first error line and a `sandbox` field. Unisolated runs name
only the limits prlimit set (the first `walls` entries).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from m11_helpers.validate import positive_int, positive_real

__all__ = ["GIB", "Limits", "WALLS", "annotate"]

GIB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Per-process limits inside the sandbox (setrlimit: without cgroups there is no per-tree total)."""
    memory: int = 4 * GIB        # RLIMIT_DATA: heap and anonymous mappings of one process
    processes: int = 512         # RLIMIT_NPROC: processes and threads of the sandbox's uid
    file_size: int = GIB         # RLIMIT_FSIZE: the largest file it may write
    tmpfs: int = GIB             # size of each private tmpfs (/tmp, /dev/shm, HOME)

    @classmethod
    def from_env(cls) -> "Limits":
        """Defaults, or `M11_GRADE_MEMORY_GIB` / `M11_GRADE_PROCESSES` when set (an instructor's knobs)."""
        env, base = os.environ, cls()
        memory = positive_real("M11_GRADE_MEMORY_GIB", float(env.get("M11_GRADE_MEMORY_GIB") or base.memory / GIB))
        procs = positive_int("M11_GRADE_PROCESSES", int(env.get("M11_GRADE_PROCESSES") or base.processes))
        return cls(memory=int(memory * GIB), processes=procs)

    def text(self) -> str:
        return (f"{self.memory / GIB:g} GiB of memory per process (RLIMIT_DATA), {self.processes} processes "
                f"(RLIMIT_NPROC), {self.file_size / GIB:g} GiB per file (RLIMIT_FSIZE)")


# errors whose cause is one of the sandbox's walls, and how the report names it (the last two need bwrap)
WALLS = [
    (re.compile(r"MemoryError|[Cc]annot allocate memory|can't allocate memory|std::bad_alloc|Errno 12\b"),
     lambda lim: f"stopped by the sandbox's memory limit: {lim.memory / GIB:g} GiB per process (RLIMIT_DATA)"),
    (re.compile(r"File too large|Errno 27\b"),
     lambda lim: f"stopped by the sandbox's file-size limit: {lim.file_size / GIB:g} GiB (RLIMIT_FSIZE)"),
    (re.compile(r"^BlockingIOError: \[Errno 11\]|can't start new thread|fork.*Resource temporarily unavailable"),
     lambda lim: f"stopped by the sandbox's process limit: {lim.processes} processes (RLIMIT_NPROC)"),
    (re.compile(r"Network is unreachable|Temporary failure in name resolution|Name or service not known|Errno 101\b"),
     lambda lim: "blocked: the sandbox has no network (loopback only)"),
    (re.compile(r"Read-only file system|Errno 30\b|Permission denied|Errno 13\b"),
     lambda lim: "blocked: read-only inside the sandbox"),
]


def annotate(log: Path, limits: Limits, walls: int = len(WALLS)) -> None:
    """Append to each failed cell's first error line which of the first `walls` walls stopped it, if one did."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            out.append(line)
            continue
        text = f"{rec.get('ename', '')}: {rec.get('evalue', '')}"  # the error itself, not the cell's code
        wall = next((why(limits) for pattern, why in WALLS[:walls] if pattern.search(text)), None)
        if rec.get("outcome") == "failed" and wall and "[sandbox:" not in rec.get("evalue", ""):
            first, _, rest = (rec.get("evalue") or "").partition("\n")
            rec["evalue"] = f"{first} [sandbox: {wall}]".lstrip() + (f"\n{rest}" if rest else "")
            rec["sandbox"] = wall
        out.append(json.dumps(rec))
    log.write_text("".join(f"{line}\n" for line in out), encoding="utf-8")
