"""The course itself on GPUs: every course notebook under nbval, every solution notebook through the grader.

One check per notebook, so the report gives each its own line, result and seconds: `nbval-NN` runs
course/NN_*.ipynb under nbval-lax (the figures differ from a CPU's, the code must not fail), `grade-NN`
grades solutions/NN_*.ipynb with the real grader and passes only at full marks. Both run with
M11_STRICT=1, so every rank also carries the device check (m11_helpers.device_check). The notebooks'
`launch(..., num_processes=N)` puts one rank on each GPU when there are N, with NCCL (device="auto"),
and falls back to CPU ranks with gloo where there are fewer. The grader runs without its bwrap sandbox
here: the sandbox's private /dev has no /dev/nvidia*, so a graded run inside it never sees a GPU.

All of them together take longer than the default budget; split the run:
`m11 gpu-check --only notebooks --budget 1500`, `m11 gpu-check --only grading --budget 1800`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

from m11_helpers.tools.gpu_check.checks import Check, Outcome, Skip

__all__ = ["GROUPS", "course_checks", "check_nbval", "check_grading"]

GROUPS = {"notebooks": "nbval-", "grading": "grade-"}  # --only notebooks / grading: every check of the kind


def _lesson(notebook: str) -> str:
    return notebook.split("_", 1)[0]


def course_checks(repo: Path | None) -> list[Check]:
    """nbval-NN and grade-NN for every lesson found in `repo` (none outside the course repository)."""
    if repo is None:
        return []
    nbval = [Check(f"nbval-{_lesson(p.name)}", f"course/{p.name} under nbval-lax, ranks on GPUs (NCCL)",
                   functools.partial(check_nbval, notebook=p.name))
             for p in sorted((Path(repo) / "course").glob("[0-9][0-9]_*.ipynb"))]
    grade = [Check(f"grade-{_lesson(p.name)}", f"solutions/{p.name} through the grader: full marks, ranks on GPUs",
                   functools.partial(check_grading, notebook=p.name))
             for p in sorted((Path(repo) / "solutions").glob("[0-9][0-9]_*.ipynb"))]
    return nbval + grade


def _left(ctx: dict) -> int:
    return max(60, int(ctx.get("deadline", time.monotonic() + 600) - time.monotonic()))


def _gpus() -> str:
    from m11_helpers.launch.base import gpu_count

    n = gpu_count()
    return f"{n} GPU{'s' if n != 1 else ''} visible"


def check_nbval(ctx: dict, notebook: str) -> Outcome:
    root = ctx.get("repo")
    if root is None:
        raise Skip("not inside the course repository (the notebooks are in course/)")
    budget = _left(ctx)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval-lax", "-p", "no:cacheprovider",
                          f"--timeout={budget}", str(Path(root) / "course" / notebook)], cwd=root,
                         capture_output=True, text=True, timeout=budget + 60, env=dict(os.environ, M11_STRICT="1"))
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
    if out.returncode != 0:
        raise AssertionError(f"nbval: {summary}")
    return Outcome(f"course/{notebook}: {summary} in {time.monotonic() - start:.0f} s, {_gpus()}")


def check_grading(ctx: dict, notebook: str) -> Outcome:
    root = ctx.get("repo")
    if root is None:
        raise Skip("not inside the course repository (the solutions are in solutions/)")
    from m11_helpers.grading.grader import grade_notebook
    from m11_helpers.grading.runenv import MODE_ENV

    os.environ[MODE_ENV] = "off"  # the sandbox's /dev has no GPU (module docstring); these are our own solutions
    os.environ["M11_STRICT"] = "1"
    solutions = Path(root) / "solutions"
    res = grade_notebook(solutions / notebook, solutions, cell_timeout=300, notebook_timeout=_left(ctx))
    if res.score != res.max_score or not res.exercises:
        lost = "; ".join(f"{e.exercise} {e.points:g}/{e.max_points:g} {e.why[:120]}" for e in res.exercises
                         if e.points != e.max_points)
        raise AssertionError(f"{res.score:g}/{res.max_score:g} points: {lost or '; '.join(res.notes)[:300]}")
    return Outcome(f"solutions/{notebook}: {res.score:g}/{res.max_score:g} points in {res.seconds:g} s, {_gpus()}")
