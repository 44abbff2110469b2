"""How long grading takes: each lesson's solution and generated exercise through the grader, and a class of 300.

    python benchmarks/grading_time.py [--lessons 00_welcome 11_capstone] [--students 300]

Each notebook is copied alone into a temporary folder and graded by `grade_notebook` (nbval in a child
process, hidden tests restored from the solution, the tamper guard, the sandbox where the machine has
one), as `m11 grade` grades a submission. The solution must score full marks and the untouched exercise
0; the script prints each one's wall-clock seconds and the CPU seconds its processes used, then the
class-time table of docs/instructor-guide.md ("How long a class takes"): wall clock ≈ collect +
install + ⌈students / jobs⌉ × seconds per submission + merge, with the solutions' mean (and the slowest
lesson's, in brackets) as the seconds per submission. Collect, install and merge are the guide's
estimates (this machine has no network), not measurements.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from m11_helpers.grading.engine.grader import grade_notebook
from m11_helpers.grading.sandbox import isolate as sandbox

ROOT = Path(__file__).resolve().parents[1]
COLLECT_MIN, INSTALL_MIN, MERGE_MIN = 2.0, 2.5, 1.0  # estimates: 300 repositories 8 at a time; CPU torch; one job
JOBS = (1, 10, 20, 50)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def grade(notebook: Path, source: Path) -> tuple[float, float, float, float]:
    """(wall s, CPU s of the grader's processes, score, max) for `notebook` graded from a private copy."""
    with tempfile.TemporaryDirectory(prefix="m11-grading-time-") as tmp:
        folder = Path(tmp) / "submission"  # its own folder: the sandbox treats the parent as the class folder
        folder.mkdir()
        shutil.copy(notebook, folder / notebook.name)
        cpu, start = children_cpu(), time.perf_counter()
        result = grade_notebook(folder / notebook.name, source)
        return time.perf_counter() - start, children_cpu() - cpu, result.score, result.max_score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lessons", nargs="*", help="lesson names (default: every lesson in solutions/)")
    ap.add_argument("--students", type=int, default=300)
    args = ap.parse_args()
    names = args.lessons or sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    ok, why = sandbox.available()
    print(f"sandbox: {why if ok else 'none (' + why + ')'}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{'lesson':<30}{'solution':>10}{'cpu':>8}{'exercise':>10}{'cpu':>8}")
    solved, blank = {}, {}
    for name in names:
        wall, cpu, score, top = grade(ROOT / "solutions" / f"{name}.ipynb", ROOT / "solutions")
        assert score == top > 0, f"{name}: the solution scored {score}/{top}"
        solved[name] = wall
        e_wall, e_cpu, e_score, e_top = grade(ROOT / "exercises" / f"{name}.ipynb", ROOT / "solutions")
        assert e_score == 0 < e_top, f"{name}: the untouched exercise scored {e_score}/{e_top}"
        blank[name] = e_wall
        print(f"{name:<30}{wall:9.1f}s{cpu:7.1f}s{e_wall:9.1f}s{e_cpu:7.1f}s", flush=True)
    mean, slowest = statistics.mean(solved.values()), max(solved.values())
    print(f"solutions: mean {mean:.1f} s ({min(solved.values()):.1f}-{slowest:.1f} s, the slowest "
          f"{max(solved, key=solved.get)}); exercises: mean {statistics.mean(blank.values()):.1f} s")
    print(f"\n{args.students} students, {mean:.1f} s per submission ({slowest:.1f} s, the slowest lesson, in brackets):")
    print(f"{'jobs':>5}{'students per job':>18}{'grading':>20}{'wall clock, all jobs':>26}")
    for jobs in JOBS:
        each = math.ceil(args.students / jobs)
        grading = [each * s / 60 for s in (mean, slowest)]
        wall = [COLLECT_MIN + INSTALL_MIN + g + MERGE_MIN for g in grading]
        print(f"{jobs:>5}{each:>18}{grading[0]:>11.1f} min ({grading[1]:.1f})"
              f"{'≈ %.0f min (≈ %.0f min)' % tuple(wall):>26}")


if __name__ == "__main__":
    main()
