"""Grade one notebook: run it under nbval (runner.py), score each exercise, rerunning past fatal cells.

`grade_notebook(path, source)` is what `m11 grade` (classroom/command.py), a class run
(classroom/grade_class.py, ci.py), the wrong-answer tests and the benchmarks call. When `source`
holds a notebook of the same name, its check cells, hidden tests included, replace the submitted
ones: learners cannot edit or drop the tests. An exercise scores its points iff all its check cells
passed (its maximum is their sum), and a check cell passes only if the tamper guard
(guard/driver.py) saw its own code pass with nothing bent; what the guard caught scores 0 and is
named in the report ("tampering: ...").

A score is always reported: `plugin.py` records each cell as it completes; a cell that hangs is
interrupted (cell timeout) or its kernel killed; a cell that kills the kernel, or has to be
killed, is skipped on a rerun so later exercises are still graded, all within the notebook's
wall-clock limit (runner.py); a kernel that stops answering the guard ends the run at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

from m11_helpers.grading.engine.results import ExerciseResult, NotebookResult
from m11_helpers.grading.engine.runner import prepare, run_cells, score
from m11_helpers.tools.notebooks import find_notebooks

__all__ = ["ExerciseResult", "NotebookResult", "prepare", "grade_notebook", "grade"]


def grade_notebook(path: Path, source: Path | None = None, cell_timeout: float = 120,
                   notebook_timeout: float = 900) -> NotebookResult:
    """Grade one notebook: run it (rerunning past fatal cells) and score each exercise."""
    start = time.monotonic()
    result = NotebookResult(str(path))
    src_path = source / path.name if source else None
    src = nbformat.read(src_path, as_version=4) if src_path and src_path.is_file() else None
    try:
        graded, plans = prepare(nbformat.read(path, as_version=4), src)
    except Exception as e:  # noqa: BLE001 - an unreadable submission still gets a (zero) score
        result.notes.append(f"could not read the notebook: {e}")
        if src is not None:
            _, plans = prepare(src, src)
            result.exercises = [ExerciseResult(p.exercise, 0, p.max_points, "not run", "unreadable notebook")
                                for p in plans]
        return result
    cells = run_cells(graded, path.parent.resolve(), cell_timeout, start + notebook_timeout, result.notes)
    result.exercises = score(plans, cells)
    for e in result.exercises:
        if e.tampering:
            result.notes.append(f"TAMPERING in exercise {e.exercise} (scored 0): {'; '.join(e.tampering)}")
    result.seconds = round(time.monotonic() - start, 1)
    return result


def grade(paths: list[Path], source: Path | None, cell_timeout: float,
          notebook_timeout: float) -> list[NotebookResult]:
    """Grade every notebook under `paths` (files or folders), in order."""
    return [grade_notebook(p, source, cell_timeout, notebook_timeout) for p in find_notebooks(paths)]
