"""The grader's core: run one graded copy of a notebook under nbval, turn its cell records into scores.

`prepare` builds the copy (the source's check cells, hidden tests included, in place of the
learner's); `run_cells` runs it in a `python -m pytest --nbval-lax` child process with the grading
plugin (every cell's outcome recorded as it completes; check cells guarded against tampering, see
guard/driver.py), rerunning past a cell that killed the kernel; `score` turns the records into one
`ExerciseResult` per exercise. `m11 grade` (engine/grader.py) and the wrong-answer runner
(authoring/wrong_answers.py) both go through here, so their verdicts come from one mechanism.

Nothing outlives a run: the child gets SIGKILL when the thread that started it dies (even by
SIGKILL: `procs.death_signal_preexec`), the kernel dies with the child (its guard sets the same),
ranks die with the kernel (`launch`), and after each run every descendant left is killed while
this process is a child subreaper, so double-forked daemons are caught too.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
from nbformat import NotebookNode

from m11_helpers.grading.cells import CHECK, COURSE, META, SOLUTION, exercise_of, m11_meta, role_of
from m11_helpers.grading.engine.results import ExerciseResult
from m11_helpers.grading.runenv import CWD_ENV, LOG_ENV, RUN_ENV, TIMEOUT_ENV
from m11_helpers.grading.sandbox import isolate as sandbox
from m11_helpers.procs import death_signal_preexec, kill_descendants, subreaper

__all__ = ["MAX_ATTEMPTS", "RUN_ENV", "PLUGIN", "CellMap", "prepare", "run_cells", "score", "why"]

PLUGIN = "m11_helpers.grading.engine.plugin"  # given to pytest by name: importing it here would import pytest

MAX_ATTEMPTS = 4  # one run, plus a rerun per cell that killed (or had to kill) the kernel


@dataclass
class CellMap:
    """Which cells of the graded copy belong to which exercise."""
    exercise: str
    max_points: float = 0.0
    checks: list[int] = field(default_factory=list)
    solutions: list[int] = field(default_factory=list)


def prepare(nb: NotebookNode, source: NotebookNode | None) -> tuple[NotebookNode, list[CellMap]]:
    """The copy to run (outputs stripped, the source's check cells in place) and its exercises."""
    graded = copy.deepcopy(nb)
    for cell in graded.cells:
        if cell.cell_type == "code":  # stored outputs are the learner's; never compare them
            cell.outputs, cell.execution_count = [], None
    placed: list[NotebookNode] = []
    if source is None:
        placed = [c for c in graded.cells if role_of(c) == CHECK]
    else:
        theirs: dict[str, list[int]] = {}
        for i, c in enumerate(graded.cells):
            if role_of(c) == CHECK:
                theirs.setdefault(exercise_of(c), []).append(i)
        used: set[int] = set()
        missing: list[tuple[str, NotebookNode]] = []
        for src in (c for c in source.cells if role_of(c) == CHECK):
            ex, new = exercise_of(src), copy.deepcopy(src)
            new.outputs, new.execution_count = [], None
            slots = [i for i in theirs.get(ex, []) if i not in used]
            if slots:
                used.add(slots[0])
                new["id"] = graded.cells[slots[0]].get("id", new.get("id"))
                graded.cells[slots[0]] = new
            else:
                missing.append((ex, new))
            placed.append(new)
        for i in set(sum(theirs.values(), [])) - used:  # extra "checks" earn nothing
            graded.cells[i].metadata[META] = {}
        for ex, new in missing:  # the learner deleted it: put it back after the exercise's cells
            mine = [i for i, c in enumerate(graded.cells) if exercise_of(c) == ex]
            graded.cells.insert(mine[-1] + 1 if mine else len(graded.cells), new)
        _course_cells(graded, source)
    seen: set[str] = set()
    for i, cell in enumerate(graded.cells):  # nbformat rejects duplicate ids on write
        if cell.get("id") in seen or not cell.get("id"):
            cell["id"] = f"graded-{i}"
        seen.add(cell["id"])
    plans: dict[str, CellMap] = {}
    ids = {id(c) for c in placed}
    for i, cell in enumerate(graded.cells):
        meta = m11_meta(cell)
        ex = str(meta.get("exercise"))
        if id(cell) in ids:
            plan = plans.setdefault(ex, CellMap(ex))
            plan.checks.append(i)
            plan.max_points += float(meta.get("points") or 0)
        elif meta.get("role") == SOLUTION:
            plans.setdefault(ex, CellMap(ex)).solutions.append(i)
    return graded, [p for p in plans.values() if p.checks]


def _course_cells(graded: NotebookNode, source: NotebookNode) -> None:
    """Mark the course's own code cells `course` (the guard keeps what they define); re-run edited ones.

    A course cell the learner edited keeps its edits, and the course's version runs right after it;
    one the learner deleted comes back where it was. So the helpers a check relies on (a launcher
    wrapper, an import) are the course's, whatever the notebook did to them before.
    """
    for cell in graded.cells:
        if role_of(cell) == COURSE:  # only the grader marks cells as the course's
            cell.metadata[META] = {}
    anchor = -1  # where the next deleted course cell goes back
    for src in (c for c in source.cells if c.cell_type == "code"):
        j = next((k for k, c in enumerate(graded.cells) if c.get("id") and c.get("id") == src.get("id")), None)
        if role_of(src):
            anchor = anchor if j is None else j
            continue
        if j is None or graded.cells[j].source != src.source:
            j = next((k for k, c in enumerate(graded.cells) if k > anchor and c.cell_type == "code"
                      and c.source == src.source and not m11_meta(c)), j)
        if j is not None and graded.cells[j].source == src.source:
            graded.cells[j].metadata[META] = {"role": COURSE}
            anchor = j
            continue
        new = copy.deepcopy(src)
        new.outputs, new.execution_count, new.metadata[META] = [], None, {"role": COURSE}
        new["id"] = f"{src.get('id') or 'course'}-course"
        anchor = (anchor if j is None else j) + 1
        graded.cells.insert(anchor, new)


def _run_once(nb: NotebookNode, cwd: Path, cell_timeout: float, limit: float,
              work: Path) -> tuple[list[dict], str]:
    """Run `nb` under nbval in a child process; return the plugin's records and a note."""
    path, log = work / "graded.ipynb", work / "cells.jsonl"
    nbformat.write(nb, path)
    log.write_text("")
    (work / "pytest.ini").write_text("[pytest]\n")  # keep the course's own pytest config out
    # Only the plugins named here: one installed beside the course (pytest-randomly reorders items: a notebook's
    # cells) must not change how a notebook is graded, and loading the others cost 0.2 s of 0.6 s at start.
    env = dict(os.environ, **{LOG_ENV: str(log), CWD_ENV: str(cwd),
                              TIMEOUT_ENV: str(cell_timeout), "PYTHONDONTWRITEBYTECODE": "1",
                              "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                              RUN_ENV: os.environ.get(RUN_ENV) or uuid.uuid4().hex})
    cmd = [sys.executable, "-m", "pytest", str(path), "-p", PLUGIN, "-p", "nbval.plugin", "--nbval-lax",
           "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}", "-p", "no:cacheprovider",
           "-c", str(work / "pytest.ini"), "--rootdir", str(work), "-q"]
    note = ""
    with open(work / "pytest.out", "wb") as out:
        # in a sandbox (sandbox/isolate.py): a private copy of the submission, no repository, no network, limits
        proc = sandbox.popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=death_signal_preexec())
        try:
            proc.wait(timeout=max(limit, 1))
        except subprocess.TimeoutExpired:
            note = "killed at the notebook's wall-clock limit (--notebook-timeout)"
            proc.kill()
            proc.wait()
    records = []
    if not log.read_text(encoding="utf-8", errors="replace").strip() and not note:
        tail = (work / "pytest.out").read_bytes()[-1500:].decode("utf-8", "replace")
        note = f"nbval ran no cell; its output ends with: {tail.strip()}"
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut short by the kill
    return records, note


def why(rec: dict | None) -> str:
    """The first line(s) a report shows for a cell's record."""
    if rec is None:
        return "not run"
    if rec.get("tampering"):
        return "tampering: " + "; ".join(rec["tampering"])
    ename, evalue = rec.get("ename", ""), rec.get("evalue", "")
    if "Timeout" in rec.get("message", ""):  # nbval's own words, with the limit in seconds
        return rec["message"].strip().splitlines()[0]
    if ename == "NotImplementedError":
        return f"not implemented yet ({evalue or ename})"
    if ename == "AssertionError" and evalue:
        return "\n".join(evalue.splitlines()[:4])
    if ename:
        return f"{ename}: {evalue.splitlines()[0] if evalue else ''}".strip()
    msg = rec.get("message", "").strip().splitlines()
    return msg[0] if msg else rec.get("outcome", "")


def run_cells(graded: NotebookNode, cwd: Path, cell_timeout: float, deadline: float,
              notes: list[str]) -> dict[int, dict]:
    """Run the graded copy (kernel cwd `cwd`) until `deadline` (monotonic); {cell index: its record}."""
    code = [i for i, c in enumerate(graded.cells) if c.cell_type == "code"]
    cells: dict[int, dict] = {}
    skip: set[int] = set()
    spared = {p.pid for p in psutil.Process().children(recursive=True)}
    with subreaper(), tempfile.TemporaryDirectory(prefix="m11-grade-") as tmp:
        for _attempt in range(MAX_ATTEMPTS):
            run = copy.deepcopy(graded)
            for i in skip:
                run.cells[i].metadata["tags"] = list(run.cells[i].metadata.get("tags", [])) + ["nbval-skip"]
            try:
                records, note = _run_once(run, cwd, cell_timeout, deadline - time.monotonic(), Path(tmp))
            finally:
                kill_descendants(spared)
            started = [r["cell"] for r in records if r.get("event") == "start"]
            done = {r["cell"]: r for r in records if r.get("event") == "result"}
            for n, rec in done.items():
                if code[n] not in skip:
                    cells[code[n]] = rec
            fatal = [n for n, r in done.items() if r.get("fatal")]
            if note:
                notes.append(note)
                hung = [n for n in started if n not in done]
                if hung:
                    cells[code[hung[-1]]] = {"outcome": "failed", "message": note}
                break
            if not fatal or time.monotonic() > deadline - 2:
                break
            later = [n for n in done if n > fatal[0] and done[n].get("dead_at_start")]
            notes.append(f"cell {code[fatal[0]]} stopped the kernel: {why(done[fatal[0]])}")
            if not later:
                break
            skip.add(code[fatal[0]])  # rerun without it so the exercises after it are graded
    return cells


def score(plans: list[CellMap], cells: dict[int, dict]) -> list[ExerciseResult]:
    """An exercise scores its points iff every check cell passed (untampered); else 0, and why."""
    out: list[ExerciseResult] = []
    for plan in plans:
        recs = [cells.get(i) for i in plan.checks]
        if all(r and r.get("outcome") == "passed" for r in recs):
            out.append(ExerciseResult(plan.exercise, plan.max_points, plan.max_points, "passed"))
            continue
        tampered = next((r for r in recs if r and r.get("tampering")), None)
        if tampered:  # scored 0 and named, whatever else happened
            out.append(ExerciseResult(plan.exercise, 0.0, plan.max_points, "failed", why(tampered),
                                      list(tampered["tampering"])))
            continue
        failed_solution = next((cells[i] for i in plan.solutions
                                if cells.get(i, {}).get("outcome") == "failed"), None)
        first_bad = next((r for r in recs if not r or r.get("outcome") != "passed"), None)
        status = "not run" if first_bad is None or first_bad.get("dead_at_start") else "failed"
        text = why(failed_solution or first_bad)
        if first_bad and first_bad.get("dead_at_start") and not failed_solution:
            text = "not run: the kernel had died in an earlier cell"
        out.append(ExerciseResult(plan.exercise, 0.0, plan.max_points, status, text))
    return out
