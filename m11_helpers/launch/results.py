"""What comes back from a script's ranks: `report()` inside the script, and reading the run's output and logs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS_ENV = "M11_RESULTS_DIR"  # where `report()` writes when a script runs under `launch_script`


def report(**values: Any) -> None:
    """Called inside a launched script: hand JSON-able values (tensors become lists) back to `launch_script`."""
    folder = os.environ.get(RESULTS_ENV)
    if not folder:
        return  # run by hand, outside launch_script: nothing to report to
    rank = int(os.environ.get("RANK", "0"))
    path = Path(folder) / f"rank{rank}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(values)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(old, default=_jsonable))
    tmp.replace(path)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"report() values must be JSON-serialisable (numbers, strings, lists, tensors), got {type(x).__name__}")


def read_results(folder: Path) -> list[dict]:
    """What each rank passed to report(), in rank order."""
    files = sorted(Path(folder).glob("rank*.json"), key=lambda f: int(f.stem[4:]))
    return [json.loads(f.read_text()) for f in files]


def count_restarts(log_dir: Path) -> int:
    """Restarts that happened: the highest `attempt_N` folder an agent wrote (N = its restart count).

    torchrun's agent tees every rank's output into `<log_dir>/<run>/attempt_<restart count>/`.
    """
    attempts = [int(d.name[8:]) for d in Path(log_dir).glob("*/attempt_*") if d.name[8:].isdigit()]
    return max(attempts, default=0)


def pump(stream, lines: list[str], echo: bool) -> None:
    """Read a launcher's output line by line, retagged, into `lines` (and to stdout when `echo`)."""
    for raw in iter(stream.readline, b""):
        line = retag(raw.decode(errors="replace"))
        lines.append(line)
        if echo:
            print(line, end="", flush=True)


def retag(line: str) -> str:
    """torchrun writes "[rank0]:text"; show it like launch() does: "[rank 0] text"."""
    if line.startswith("[rank") and "]:" in line[:12]:
        tag, rest = line.split("]:", 1)
        return f"[rank {tag[5:]}] {rest}"
    return line


def failed_ranks(out: str) -> dict[int, str]:
    """rank -> its lines from the first error or traceback on."""
    failures: dict[int, str] = {}
    for line in out.splitlines():
        if line.startswith("[rank ") and ("Error" in line or "Traceback" in line):
            r = int(line[6:line.index("]")])
            failures.setdefault(r, "")
        if line.startswith("[rank "):
            r = int(line[6:line.index("]")])
            if r in failures:
                failures[r] += line + "\n"
    return failures


def script_failure(name: str, code: int, out: str) -> str:
    """The message of a failed run: the failing ranks and the end of the first one's traceback."""
    failed = failed_ranks(out)
    if failed:
        first = min(failed)
        tb = failed[first].strip().splitlines()[-12:]
        return f"{name} failed (exit code {code}) on rank {', '.join(map(str, sorted(failed)))}:\n" + "\n".join(tb)
    return f"{name} failed (exit code {code}):\n" + "\n".join(out.strip().splitlines()[-15:])
