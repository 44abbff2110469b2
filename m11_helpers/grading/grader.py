"""`m11 grade`: run submitted notebooks under nbval, score each exercise, write reports.

    m11 grade exercises/ [--out reports/] [--cell-timeout 120] [--notebook-timeout 900]
              [--min-score PCT] [--source solutions/]
    m11 grade --class submissions/        one subfolder per student -> class.csv + their reports

Each notebook runs in its own `python -m pytest --nbval-lax` process, with cwd = its folder.
When `--source` (default: REPO/solutions) holds a notebook of the same name, its check cells,
hidden tests included, replace the submitted ones: learners cannot edit or drop the tests.
An exercise scores its points iff all its check cells passed (its maximum is their sum).

A score is always reported: `plugin.py` records each cell as it completes; a cell that hangs is
interrupted (cell timeout) or its kernel killed; a cell that kills the kernel, or has to be
killed, is skipped on a rerun so later exercises are still graded, all within the notebook's
wall-clock limit. The grader is a child subreaper, so daemons the notebook leaves behind are
re-parented to it and killed with every other descendant after each run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
from nbformat import NotebookNode

from m11_helpers.grading import plugin, report
from m11_helpers.grading.exercises import find_repo_root, m11_meta
from m11_helpers.grading.results import ExerciseResult, NotebookResult
from m11_helpers.procs import kill_descendants, subreaper
from m11_helpers.tools.notebooks import find_notebooks

__all__ = ["ExerciseResult", "NotebookResult", "prepare", "grade_notebook", "grade", "main"]

MAX_ATTEMPTS = 4  # one run, plus a rerun per cell that killed (or had to kill) the kernel


@dataclass
class _CellMap:
    """Which cells of the graded copy belong to which exercise."""
    exercise: str
    max_points: float = 0.0
    checks: list[int] = field(default_factory=list)
    solutions: list[int] = field(default_factory=list)


def prepare(nb: NotebookNode, source: NotebookNode | None) -> tuple[NotebookNode, list[_CellMap]]:
    """The copy to run (outputs stripped, the source's check cells in place) and its exercises."""
    graded = copy.deepcopy(nb)
    for cell in graded.cells:
        if cell.cell_type == "code":  # stored outputs are the learner's; never compare them
            cell.outputs, cell.execution_count = [], None
    placed: list[NotebookNode] = []
    if source is None:
        placed = [c for c in graded.cells if m11_meta(c).get("role") == "check"]
    else:
        theirs: dict[str, list[int]] = {}
        for i, c in enumerate(graded.cells):
            if m11_meta(c).get("role") == "check":
                theirs.setdefault(str(m11_meta(c).get("exercise")), []).append(i)
        used: set[int] = set()
        missing: list[tuple[str, NotebookNode]] = []
        for src in (c for c in source.cells if m11_meta(c).get("role") == "check"):
            ex, new = str(m11_meta(src).get("exercise")), copy.deepcopy(src)
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
            graded.cells[i].metadata["m11"] = {}
        for ex, new in missing:  # the learner deleted it: put it back after the exercise's cells
            mine = [i for i, c in enumerate(graded.cells) if str(m11_meta(c).get("exercise")) == ex]
            graded.cells.insert(mine[-1] + 1 if mine else len(graded.cells), new)
    seen: set[str] = set()
    for i, cell in enumerate(graded.cells):  # nbformat rejects duplicate ids on write
        if cell.get("id") in seen or not cell.get("id"):
            cell["id"] = f"graded-{i}"
        seen.add(cell["id"])
    plans: dict[str, _CellMap] = {}
    ids = {id(c) for c in placed}
    for i, cell in enumerate(graded.cells):
        meta = m11_meta(cell)
        ex = str(meta.get("exercise"))
        if id(cell) in ids:
            plan = plans.setdefault(ex, _CellMap(ex))
            plan.checks.append(i)
            plan.max_points += float(meta.get("points") or 0)
        elif meta.get("role") == "solution":
            plans.setdefault(ex, _CellMap(ex)).solutions.append(i)
    return graded, [p for p in plans.values() if p.checks]


def _run_once(nb: NotebookNode, cwd: Path, cell_timeout: float, limit: float,
              work: Path) -> tuple[list[dict], str]:
    """Run `nb` under nbval in a child process; return the plugin's records and a note."""
    path, log = work / "graded.ipynb", work / "cells.jsonl"
    nbformat.write(nb, path)
    log.write_text("")
    (work / "pytest.ini").write_text("[pytest]\n")  # keep the course's own pytest config out
    env = dict(os.environ, **{plugin.LOG_ENV: str(log), plugin.CWD_ENV: str(cwd),
                              plugin.TIMEOUT_ENV: str(cell_timeout), "PYTHONDONTWRITEBYTECODE": "1"})
    cmd = [sys.executable, "-m", "pytest", str(path), "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={cell_timeout}", "-p", "no:cacheprovider", "-p",
           "m11_helpers.grading.plugin", "-c", str(work / "pytest.ini"), "--rootdir", str(work), "-q"]
    note = ""
    with open(work / "pytest.out", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
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


def _why(rec: dict | None) -> str:
    if rec is None:
        return "not run"
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
    code = [i for i, c in enumerate(graded.cells) if c.cell_type == "code"]
    cells: dict[int, dict] = {}
    deadline, skip = start + notebook_timeout, set()
    spared = {p.pid for p in psutil.Process().children(recursive=True)}
    with subreaper(), tempfile.TemporaryDirectory(prefix="m11-grade-") as tmp:
        for _attempt in range(MAX_ATTEMPTS):
            run = copy.deepcopy(graded)
            for i in skip:
                run.cells[i].metadata["tags"] = list(run.cells[i].metadata.get("tags", [])) + ["nbval-skip"]
            try:
                records, note = _run_once(run, path.parent.resolve(), cell_timeout,
                                          deadline - time.monotonic(), Path(tmp))
            finally:
                kill_descendants(spared)
            started = [r["cell"] for r in records if r.get("event") == "start"]
            done = {r["cell"]: r for r in records if r.get("event") == "result"}
            for n, rec in done.items():
                if code[n] not in skip:
                    cells[code[n]] = rec
            fatal = [n for n, r in done.items() if r.get("fatal")]
            if note:
                result.notes.append(note)
                hung = [n for n in started if n not in done]
                if hung:
                    cells[code[hung[-1]]] = {"outcome": "failed", "message": note}
                break
            if not fatal or time.monotonic() > deadline - 2:
                break
            later = [n for n in done if n > fatal[0] and done[n].get("dead_at_start")]
            result.notes.append(f"cell {code[fatal[0]]} stopped the kernel: {_why(done[fatal[0]])}")
            if not later:
                break
            skip.add(code[fatal[0]])  # rerun without it so the exercises after it are graded
    for plan in plans:
        recs = [cells.get(i) for i in plan.checks]
        if all(r and r.get("outcome") == "passed" for r in recs):
            result.exercises.append(ExerciseResult(plan.exercise, plan.max_points, plan.max_points, "passed"))
            continue
        failed_solution = next((cells[i] for i in plan.solutions
                                if cells.get(i, {}).get("outcome") == "failed"), None)
        first_bad = next((r for r in recs if not r or r.get("outcome") != "passed"), None)
        status = "not run" if first_bad is None or first_bad.get("dead_at_start") else "failed"
        why = _why(failed_solution or first_bad)
        if first_bad and first_bad.get("dead_at_start") and not failed_solution:
            why = "not run: the kernel had died in an earlier cell"
        result.exercises.append(ExerciseResult(plan.exercise, 0.0, plan.max_points, status, why))
    result.seconds = round(time.monotonic() - start, 1)
    return result


def grade(paths: list[Path], source: Path | None, cell_timeout: float,
          notebook_timeout: float) -> list[NotebookResult]:
    """Grade every notebook under `paths` (files or folders), in order."""
    return [grade_notebook(p, source, cell_timeout, notebook_timeout) for p in find_notebooks(paths)]


def _percent(results: list[NotebookResult]) -> float:
    top = sum(r.max_score for r in results)
    return 100.0 * sum(r.score for r in results) / top if top else 100.0


def main(argv: list[str]) -> int:
    """`m11 grade`; exit 1 below --min-score, 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="m11 grade", description="autograde notebooks, write reports")
    ap.add_argument("paths", nargs="*", type=Path, help="notebooks or folders to grade")
    ap.add_argument("--class", dest="klass", type=Path, metavar="DIR",
                    help="a folder with one subfolder of notebooks per student")
    ap.add_argument("--out", type=Path, default=Path("reports"), help="report folder (default reports/)")
    ap.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell (default 120)")
    ap.add_argument("--notebook-timeout", type=float, default=900, help="seconds per notebook (default 900)")
    ap.add_argument("--min-score", type=float, metavar="PCT", help="exit 1 when the score is below PCT")
    ap.add_argument("--source", type=Path, help="solution notebooks with the full check cells "
                    "(default: REPO/solutions when it exists)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    problems = []
    if bool(args.paths) == bool(args.klass):
        problems.append("give notebooks/folders to grade, or --class DIR, not both")
    if args.cell_timeout <= 0 or args.notebook_timeout <= 0:
        problems.append("--cell-timeout and --notebook-timeout must be > 0 seconds")
    if args.min_score is not None and not 0 <= args.min_score <= 100:
        problems.append(f"--min-score={args.min_score}: allowed 0..100 (a percentage)")
    for p in [*args.paths, *([args.klass] if args.klass else []), *([args.source] if args.source else [])]:
        if not p.exists():
            problems.append(f"{p}: no such file or folder")
    if problems:
        print("m11 grade: " + "\n  ".join(problems), file=sys.stderr)
        return 2
    source = args.source
    if source is None:
        try:
            source = find_repo_root() / "solutions"
        except ValueError:
            source = None
        source = source if source and source.is_dir() else None

    if args.klass:
        rows, low = [], False
        for student in sorted(d for d in args.klass.iterdir() if d.is_dir()):
            results = grade([student], source, args.cell_timeout, args.notebook_timeout)
            report.write_reports(results, args.out / student.name)
            rows += [(student.name, Path(r.notebook).name, r.score, r.max_score) for r in results]
            low |= args.min_score is not None and _percent(results) < args.min_score
        report.write_class_csv(rows, args.out / "class.csv")
        print(report.class_table(rows))
        return 1 if low else 0
    try:
        results = grade(args.paths, source, args.cell_timeout, args.notebook_timeout)
    except ValueError as e:
        print(f"m11 grade: {e}", file=sys.stderr)
        return 2
    report.write_reports(results, args.out)
    print(report.terminal_table(results))
    print(f"reports written to {args.out}/ (report.md, report.json, junit.xml)")
    return 1 if args.min_score is not None and _percent(results) < args.min_score else 0
