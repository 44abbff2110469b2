"""Grade a class: each submission checked for integrity, graded in the sandbox, in shards, then merged.

A class folder holds one folder per student (and `manifest.csv` from `classroom/collect.py`: the graded commit,
whether pushes came after the deadline). For each expected notebook (default: every course notebook
some student handed in) a student gets one row of class.csv: `graded`, or a clear `missing`, `not a
notebook`, `wrong lesson` (scored 0, never a crash; see classroom/integrity.py, which also notes every check
cell that differs from the course's: the grader runs the course's in its place).

`grade_class` grades one shard (`shard_of`: round-robin) with the grading function it is given
(`grader.grade_notebook`, which runs each notebook in the sandbox); `merge` joins the shards'
class.csv and reports, giving a `not graded` row to anyone no shard reported; `summary` is the table
for the run's page. `m11 grade --class` calls `main_class`; the CI's commands are in classroom/ci.py.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

from m11_helpers.grading.classroom import collect
from m11_helpers.grading.classroom.integrity import inspect, read_notebook
from m11_helpers.grading.engine import report
from m11_helpers.grading.engine.results import ExerciseResult, NotebookResult
from m11_helpers.grading.engine.runner import prepare
from m11_helpers.grading.sandbox import isolate as sandbox
from m11_helpers.validate import one_of, positive_int

__all__ = ["Row", "GradeFn", "students", "shard_of", "grade_class", "write_csv", "read_csv", "plan", "merge", "summary",
           "main_class"]

GradeFn = Callable[[Path, "Path | None", float, float], NotebookResult]  # grader.grade_notebook


@dataclass
class Row:
    """One line of class.csv: a student's notebook."""
    student: str
    notebook: str
    score: float
    max: float
    status: str  # graded | missing | not a notebook | wrong lesson | not graded
    commit: str = ""
    late: str = ""
    seconds: float = 0.0
    notes: str = ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def students(folder: Path) -> list[str]:
    """The students of a class folder: its subfolders (hidden ones skipped) and its manifest's rows, sorted."""
    folders = {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    return sorted(folders | set(collect.read_manifest(folder)))


def shard_of(names: list[str], shard: int, shards: int) -> list[str]:
    """Shard `shard` of `shards` (1-based), round-robin so that every shard gets a similar share."""
    one_of("shard", shard, range(1, positive_int("shards", shards) + 1))
    return names[shard - 1::shards]


def _zero(expected: str, source_dir: Path | None, why: str) -> NotebookResult:
    result = NotebookResult(expected, notes=[why])
    if source_dir and (source_dir / expected).is_file():
        src = read_notebook(source_dir / expected)
        result.exercises = [ExerciseResult(p.exercise, 0, p.max_points, "not run", why) for p in prepare(src, src)[1]]
    return result


def grade_class(klass: Path, source: Path | None, out: Path, grade: GradeFn, notebooks: list[str] | None = None,
                shard: tuple[int, int] = (1, 1), cell_timeout: float = 120,
                notebook_timeout: float = 900) -> list[Row]:
    """Grade (a shard of) a class folder with `grade` (grader.grade_notebook); write out/<student>/report.*,
    out/class.csv and out/shard.json."""
    if sandbox.mode() == "require" and not sandbox.available()[0]:
        raise sandbox.SandboxUnavailable(f"{sandbox.MODE_ENV}=require, but {sandbox.available()[1]}")
    everyone, manifest = students(klass), collect.read_manifest(klass)
    if not notebooks:  # every course notebook somebody handed in
        handed = {p.name for s in everyone for p in (klass / s).rglob("*.ipynb")}
        notebooks = sorted(n for n in handed if source is None or (source / n).is_file())
    mine, rows = shard_of(everyone, *shard), []
    for student in mine:
        results, info = [], manifest.get(student, {})
        for expected in notebooks:
            status, path, notes = inspect(klass / student, expected, source)
            if path is None:
                result = _zero(expected, source, "; ".join(notes))
            else:
                result = grade(path, source, cell_timeout, notebook_timeout)
                result.notes = [*notes, sandbox.describe(), *result.notes]
            results.append(result)
            notes = [n for n in [info.get("notes", ""), *notes] if n]  # e.g. "not collected: …" from the manifest
            rows.append(Row(student, expected, result.score, result.max_score, status, info.get("commit", ""),
                            info.get("late", ""), result.seconds, "; ".join(notes)))
        if not notebooks:  # nobody handed in a course notebook and none was named: still one row each
            rows.append(Row(student, "*", 0, 0, "missing", info.get("commit", ""), info.get("late", ""),
                            notes="no course notebook handed in by anyone (name them with --notebooks)"))
        report.write_reports(results, out / student)
    write_csv(rows, out / "class.csv")
    (out / "shard.json").write_text(json.dumps({"shard": shard[0], "shards": shard[1], "students": mine,
                                                "notebooks": notebooks, "sandbox": sandbox.describe()}, indent=1))
    return rows


def write_csv(rows: list[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(Row)])
        w.writeheader()
        w.writerows({**asdict(r), "score": _num(r.score), "max": _num(r.max)} for r in rows)


def read_csv(path: Path) -> list[Row]:
    with open(path, newline="", encoding="utf-8") as f:
        return [Row(**{**r, "score": float(r["score"]), "max": float(r["max"]), "seconds": float(r["seconds"])})
                for r in csv.DictReader(f)]


def plan(klass: Path, shard_size: int) -> dict:
    """The CI matrix: enough shards of at most `shard_size` students (at least one, even for an empty class)."""
    positive_int("shard_size", shard_size)
    n = max(1, math.ceil(len(students(klass) if klass.is_dir() else []) / shard_size))
    return {"shard": list(range(1, n + 1)), "shards": [n]}


def merge(shards_dir: Path, out: Path, klass: Path | None = None) -> list[Row]:
    """Merge the shards' class.csv and reports into out/; a student no shard reported gets a `not graded` row."""
    rows: list[Row] = []
    for csv_path in sorted(shards_dir.rglob("class.csv")):
        rows += read_csv(csv_path)
        for student in {r.student for r in read_csv(csv_path)}:
            if (csv_path.parent / student).is_dir():
                shutil.copytree(csv_path.parent / student, out / student, dirs_exist_ok=True)
    expected = students(klass) if klass is not None else []
    info = collect.read_manifest(klass) if klass is not None else {}
    rows += [Row(s, "*", 0, 0, "not graded", info.get(s, {}).get("commit", ""), info.get(s, {}).get("late", ""),
                 notes="no shard reported this student (see the grade jobs' logs)")
             for s in expected if s not in {r.student for r in rows}]
    rows.sort(key=lambda r: (r.student, r.notebook))
    write_csv(rows, out / "class.csv")
    (out / "summary.md").write_text(summary(rows), encoding="utf-8")
    return rows


def summary(rows: list[Row]) -> str:
    """The Markdown table for the run's page ($GITHUB_STEP_SUMMARY): one line per student and notebook."""
    graded = [r for r in rows if r.status == "graded"]
    mean = 100 * sum(r.score for r in rows) / sum(r.max for r in rows) if sum(r.max for r in rows) else 0.0
    per = sum(r.seconds for r in graded) / len(graded) if graded else 0.0
    head = (f"{len({r.student for r in rows})} students · {len(graded)} notebooks graded · "
            f"{sum(r.status != 'graded' for r in rows)} missing or unusable · "
            f"{sum('integrity' in r.notes for r in rows)} with edited checks · "
            f"{sum(r.late.startswith('yes') for r in rows)} late · class mean {mean:.0f} % · "
            f"{per:.1f} s per graded notebook")
    lines = ["# Class grades", "", head, "", "| student | notebook | score | status | commit | late | notes |",
             "|---|---|---:|---|---|---|---|"]
    for r in rows:
        notes = " ".join(r.notes.split()).replace("|", "\\|")[:300]  # one table row, whatever a file is named
        lines.append(f"| {r.student} | {r.notebook} | {_num(r.score)} / {_num(r.max)} | {r.status} "
                     f"| {r.commit[:10]} | {r.late} | {notes} |")
    return "\n".join(lines) + "\n"


def main_class(klass: Path, source: Path | None, out: Path, cell_timeout: float, notebook_timeout: float,
               min_score: float | None, grade: GradeFn) -> int:
    """`m11 grade --class`: the whole class in one process; exit 1 when a student is below `min_score`."""
    try:
        rows = grade_class(klass, source, out, grade, None, (1, 1), cell_timeout, notebook_timeout)
    except sandbox.SandboxUnavailable as e:
        print(f"m11 grade: {e}", file=sys.stderr)
        return 2
    (out / "summary.md").write_text(summary(rows), encoding="utf-8")
    print(report.class_table([(r.student, r.notebook, r.score, r.max) for r in rows]))
    low = set()
    for s in {r.student for r in rows}:
        mine = [r for r in rows if r.student == s]
        top = sum(r.max for r in mine)
        if min_score is not None and (100 * sum(r.score for r in mine) / top if top else 100) < min_score:
            low.add(s)
    return 1 if low else 0
