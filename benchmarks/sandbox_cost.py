"""The grading sandbox's cost: seconds per graded notebook with and without it, side by side in one run.

    python benchmarks/sandbox_cost.py [--repeats 3] [--notebooks 00_demo 00_welcome 01_hardware]

Each notebook is graded by `grade_notebook` (nbval in a child process, hidden tests restored) with
M11_GRADE_SANDBOX=off and =require, interleaved so both see the same machine load; the script prints
each one's median, the difference (the sandbox's cost per notebook) and the ratio. `00_demo` is the
grader's fixture (a kernel and two cells: almost pure overhead), `00_welcome` starts 4-rank launches,
`01_hardware` is formulas only. A last line times the sandbox's fixed start alone: `python -c pass`
through `sandbox.popen` against a plain `subprocess.Popen`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from m11_helpers.grading.engine.grader import grade_notebook
from m11_helpers.grading.sandbox import isolate as sandbox
from m11_helpers.timing import time_it

ROOT = Path(__file__).resolve().parents[1]
WHERE = {"00_demo": ROOT / "tests" / "data" / "grading" / "solutions"}


def grade_seconds(path: Path, mode: str) -> float:
    os.environ[sandbox.MODE_ENV] = mode
    result = {}
    timing = time_it(lambda: result.setdefault("r", grade_notebook(path, path.parent)), repeats=1, warmup=0)
    r = result["r"]
    assert r.score == r.max_score > 0, f"{path.name} ({mode}): {[(e.exercise, e.why) for e in r.exercises]}"
    return timing.median


def start_seconds(mode: str, work: Path) -> float:
    def run() -> None:
        if mode == "plain":
            subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
        else:
            proc = sandbox.popen([sys.executable, "-S", "-c", "pass"], cwd=work, env={"PATH": os.environ["PATH"],
                                 sandbox.CWD_ENV: str(work / "folder")})
            assert proc.wait() == 0
    return time_it(run, repeats=5, warmup=1).median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--notebooks", nargs="*", default=["00_demo", "00_welcome", "01_hardware"])
    args = ap.parse_args()
    ok, why = sandbox.available()
    if not ok:
        raise SystemExit(f"no sandbox on this machine ({why}): nothing to compare")
    print(f"sandbox: {why}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"median of {args.repeats}, interleaved")
    print(f"{'notebook':<14} {'off':>8} {'sandbox':>8} {'cost':>8} {'ratio':>6}")
    for name in args.notebooks:
        path = WHERE.get(name, ROOT / "solutions") / f"{name}.ipynb"
        off, on = [], []
        for _ in range(args.repeats):
            off.append(grade_seconds(path, "off"))
            on.append(grade_seconds(path, "require"))
        a, b = statistics.median(off), statistics.median(on)
        print(f"{name:<14} {a:7.2f}s {b:7.2f}s {b - a:+7.2f}s {b / a:6.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "folder").mkdir()
        plain, boxed = start_seconds("plain", Path(tmp)), start_seconds("sandbox", Path(tmp))
    print(f"start alone:   python -c pass {plain * 1000:.0f} ms, in the sandbox {boxed * 1000:.0f} ms "
          f"({(boxed - plain) * 1000:+.0f} ms)")


if __name__ == "__main__":
    main()
