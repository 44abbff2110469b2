"""Recorded wrong answers: the mistakes learners make, each proven to score 0 with a hint that names it.

They live beside the solutions, never in what learners get (`m11 make-exercises` reads only
`solutions/*.ipynb`), one file per lesson: `solutions/wrong_answers/NN_topic.py`::

    # %% 0.1 | forgets to divide by the world size | expect: world size
    def average(t):
        total = t.clone()
        dist.all_reduce(total)
        return total

A block starts at `# %% EXERCISE | MISTAKE | expect: TEXT`; its code replaces the exercise's
solution cell (`cell=K` after the exercise id picks the K-th solution cell of an exercise that has
several, counting from 0). TEXT must appear (case-insensitive) in the failure the check cell reports,
so the learner is told what is wrong, not only that something is.

`run_wrong_answers(solution)` grades them all in **one kernel**: it runs the solution notebook top to
bottom once (every check cell must pass: full marks), then for each wrong answer runs its code and
the exercise's check cells (hidden tests included), records the verdict, and re-runs the correct
solution cell so the exercises after it start from a right answer. One kernel per lesson instead of
one full grading run per wrong answer; `tests/test_wrong_answers.py` shows on a sample that the
verdicts equal `m11 grade`'s on the substituted notebook.

    python -m m11_helpers.grading.wrong_answers solutions/00_welcome.ipynb
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from m11_helpers.grading.exercises import m11_meta

__all__ = ["WrongAnswer", "Verdict", "parse", "wrong_answers_path", "run_wrong_answers", "main"]

_HEADER = re.compile(r"^# %%\s+(?P<ex>[0-9]+\.[0-9]+[a-z]?)(?:\s+cell=(?P<cell>\d+))?\s*\|\s*(?P<mistake>[^|]+?)"
                     r"\s*\|\s*expect:\s*(?P<expect>.+?)\s*$")


@dataclasses.dataclass(frozen=True)
class WrongAnswer:
    exercise: str
    mistake: str  # what the learner got wrong, in a few words
    expect: str  # text the check's failure message must contain
    source: str  # replaces the exercise's solution cell
    cell: int = 0  # which of the exercise's solution cells it replaces
    line: int = 0  # where it starts in its file


@dataclasses.dataclass
class Verdict:
    answer: WrongAnswer
    scored_zero: bool  # some check cell of the exercise failed
    message: str  # the first failure, as the learner would read it
    hint_ok: bool  # `expect` appears in the message


def wrong_answers_path(solution: Path) -> Path:
    """solutions/NN_topic.ipynb -> solutions/wrong_answers/NN_topic.py"""
    return solution.parent / "wrong_answers" / f"{solution.stem}.py"


def parse(text: str, name: str = "wrong answers") -> list[WrongAnswer]:
    """The blocks of a wrong-answers file; ValueError names the line of a malformed header."""
    answers: list[WrongAnswer] = []
    current: dict | None = None
    body: list[str] = []

    def close() -> None:
        if current is not None:
            src = "\n".join(body).strip("\n")
            if not src.strip():
                raise ValueError(f"{name}: line {current['line']}: wrong answer for {current['exercise']} has no code")
            answers.append(WrongAnswer(source=src, **current))

    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            close()
            m = _HEADER.match(line)
            if not m:
                raise ValueError(f"{name}: line {i}: expected '# %% EXERCISE | MISTAKE | expect: TEXT', got {line!r}")
            current = {"exercise": m["ex"], "mistake": m["mistake"], "expect": m["expect"],
                       "cell": int(m["cell"] or 0), "line": i}
            body = []
        elif current is not None:
            body.append(line)
    close()
    return answers


def _error_text(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", type(err).__name__), getattr(err, "evalue", str(err))
    return f"{ename}: {evalue}".strip()


def run_wrong_answers(solution: Path, answers: list[WrongAnswer] | None = None, *, cell_timeout: float = 120,
                      extra_paths: tuple[Path, ...] = ()) -> tuple[list[str], list[Verdict]]:
    """Grade `answers` (default: the lesson's file) in one kernel; return (solution failures, verdicts).

    The notebook runs from a copy in a temporary folder (with `extra_paths` copied beside it), so
    nothing it writes lands in the repository. The first list holds the check cells of the correct
    solution that failed (empty: full marks).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    solution = Path(solution)
    if answers is None:
        answers = parse(wrong_answers_path(solution).read_text(encoding="utf-8"), str(wrong_answers_path(solution)))
    nb = nbformat.read(solution, as_version=4)
    sol_cells: dict[str, list[int]] = {}
    check_cells: dict[str, list[int]] = {}
    for i, cell in enumerate(nb.cells):
        meta = m11_meta(cell)
        if cell.cell_type == "code" and meta.get("role") == "solution":
            sol_cells.setdefault(str(meta["exercise"]), []).append(i)
        elif cell.cell_type == "code" and meta.get("role") == "check":
            check_cells.setdefault(str(meta["exercise"]), []).append(i)
    for a in answers:
        if a.exercise not in check_cells or a.cell >= len(sol_cells.get(a.exercise, [])):
            raise ValueError(f"line {a.line}: exercise {a.exercise} (cell={a.cell}) has no such solution cell "
                             f"in {solution.name}; exercises: {', '.join(sorted(check_cells))}")
    failures: list[str] = []
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="m11-wrong-") as tmp:
        for extra in extra_paths:
            (shutil.copytree if extra.is_dir() else shutil.copy)(extra, Path(tmp) / extra.name)
        client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                                resources={"metadata": {"path": tmp}})

        def run(index: int, source: str | None = None) -> str | None:
            cell = copy.deepcopy(nb.cells[index])
            if source is not None:
                cell.source = source
            try:
                client.execute_cell(cell, index)
            except (CellExecutionError, CellTimeoutError) as err:
                return _error_text(err)
            return None

        with client.setup_kernel():
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                err = run(i)
                if err is not None and i in sum(check_cells.values(), []):
                    failures.append(f"cell {i} ({m11_meta(cell).get('exercise')}): {err.splitlines()[0][:300]}")
                elif err is not None:
                    failures.append(f"cell {i} (not a check cell) failed: {err.splitlines()[0][:300]}")
            for a in answers:
                target = sol_cells[a.exercise][a.cell]
                message = run(target, a.source) or next(
                    (e for e in (run(c) for c in check_cells[a.exercise]) if e is not None), "")
                verdicts.append(Verdict(a, bool(message), message, a.expect.lower() in message.lower()))
                run(target)  # back to the right answer for what follows
    return failures, verdicts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m m11_helpers.grading.wrong_answers",
                                 description="grade a lesson's recorded wrong answers in one kernel")
    ap.add_argument("solutions", nargs="+", type=Path)
    ap.add_argument("--cell-timeout", type=float, default=120)
    args = ap.parse_args(argv)
    bad = 0
    for sol in args.solutions:
        failures, verdicts = run_wrong_answers(sol, cell_timeout=args.cell_timeout)
        print(f"{sol.name}: solution {'full marks' if not failures else 'FAILED: ' + '; '.join(failures)}")
        for v in verdicts:
            ok = v.scored_zero and v.hint_ok
            bad += not ok
            first = v.message.splitlines()[0][:120] if v.message else "(no failure: scored the points)"
            print(f"  {'ok ' if ok else 'BAD'} {v.answer.exercise:<6}{v.answer.mistake[:50]:<52}{first}")
        bad += bool(failures)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
