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

`run_wrong_answers(solution)` grades them all in **one graded run** through the grader's own
machinery (engine/runner.py: nbval in a child process, the grading plugin, the tamper guard around every
check cell, the same scoring): it builds one notebook, the solution top to bottom (every check
cell must pass: full marks), then for each wrong answer its code in place of the solution cell, the
exercise's check cells (hidden tests included), and the correct solution cell again so the
exercises after it start from a right answer. One kernel per lesson instead of one full grading run
per wrong answer; `tests/test_wrong_answers.py` shows on a sample that the verdicts equal
`m11 grade`'s on the solution notebook with that one answer substituted. The kernel runs in a
temporary copy of the solution's folder (nothing is written into the repository).

A lesson whose one run is too long for one test is graded in parts (`exercises=`): each part is the
solution with only its exercises' check cells (the others' become plain comment cells; `m11 grade` of the whole
solution is tests/test_lessons_graded.py's), then those exercises' wrong answers. A check's cost is paid
once per lesson, not once per part, as splitting the answers alone would.

    python -m m11_helpers.grading.authoring.wrong_answers solutions/00_welcome.ipynb
    python -m m11_helpers.grading.authoring.wrong_answers solutions/11_capstone.ipynb --exercises 11.3
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from m11_helpers.grading.cells import AUTHOR_ROLES, CHECK, SOLUTION, m11_meta
from m11_helpers.grading.engine.runner import CellMap, prepare, run_cells, score, why

__all__ = ["NOTEBOOK_TIMEOUT", "WrongAnswer", "Verdict", "parse", "wrong_answers_path", "run_wrong_answers", "main"]

# One lesson's run: its solution, then each wrong answer with its exercise's checks. Measured on the project's
# 2-core machine at load average 9-16 (`python -m m11_helpers.grading.authoring.wrong_answers solutions/NN_*.ipynb`),
# the six heaviest lessons: 11_capstone 243 s (17 answers), 03 172 s (29), 10 153 s, 12 116 s, 04 97 s,
# 09 63 s. The limit leaves 3.7x room over the slowest; pytest's per-test limit for these runs is derived
# from it (the course's pytest config gives every other test 300 s, which the slowest run would exceed when
# busier).
NOTEBOOK_TIMEOUT = 900.0

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
    scored_zero: bool  # the exercise scored 0, exactly as `m11 grade` scores it
    message: str  # the first failure, as the learner would read it
    hint_ok: bool  # `expect` appears in the message
    why: str = ""  # what `m11 grade`'s report would say


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


def _index(nb) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    sol: dict[str, list[int]] = {}
    chk: dict[str, list[int]] = {}
    for i, cell in enumerate(nb.cells):
        meta = m11_meta(cell)
        if cell.cell_type == "code" and meta.get("role") in AUTHOR_ROLES:
            (sol if meta["role"] == SOLUTION else chk).setdefault(str(meta["exercise"]), []).append(i)
    return sol, chk


def _build(nb, answers: list[WrongAnswer], sol: dict, chk: dict):
    """The solution, then per answer: its code, the exercise's checks, the right solution again."""
    graded, _ = prepare(nb, nb)  # what `m11 grade` runs for this notebook: outputs stripped, checks in place
    plans = []
    for n, a in enumerate(answers):
        target = sol[a.exercise][a.cell]
        wrong = copy.deepcopy(graded.cells[target])
        wrong.source, wrong["id"] = a.source, f"wrong-{n}"
        checks = [copy.deepcopy(graded.cells[c]) for c in chk[a.exercise]]
        for k, c in enumerate(checks):
            c["id"] = f"wrong-{n}-check-{k}"
        again = copy.deepcopy(graded.cells[target])
        again["id"] = f"wrong-{n}-again"
        first = len(graded.cells)
        graded.cells += [wrong, *checks, again]
        points = sum(float(m11_meta(c).get("points") or 0) for c in checks)
        plans.append(CellMap(a.exercise, points, list(range(first + 1, first + 1 + len(checks))), [first]))
    return graded, plans


def run_wrong_answers(solution: Path, answers: list[WrongAnswer] | None = None, *, cell_timeout: float = 120,
                      extra_paths: tuple[Path, ...] = (), exercises: tuple[str, ...] | None = None,
                      notebook_timeout: float = NOTEBOOK_TIMEOUT) -> tuple[list[str], list[Verdict]]:
    """Grade `answers` (default: the lesson's file) in one graded run; return (solution failures, verdicts).

    The notebook runs from a copy of itself in a temporary folder (with `extra_paths` copied beside
    it). The first list holds the cells of the correct solution that failed (empty: full marks).
    `exercises` (a part of the lesson): only their checks run in the solution pass, only their answers after it.
    """
    solution = Path(solution)
    if answers is None:
        answers = parse(wrong_answers_path(solution).read_text(encoding="utf-8"), str(wrong_answers_path(solution)))
    nb = nbformat.read(solution, as_version=4)
    sol, chk = _index(nb)
    if exercises is not None:
        unknown = sorted(set(exercises) - set(chk))
        if unknown or not exercises:
            raise ValueError(f"exercises must name exercises of {solution.name} ({', '.join(sorted(chk))}); "
                             f"got {', '.join(exercises) or 'none'}")
        answers = [a for a in answers if a.exercise in exercises]
        chk = {ex: ids for ex, ids in chk.items() if ex in exercises}
    for a in answers:
        if a.exercise not in chk or a.cell >= len(sol.get(a.exercise, [])):
            raise ValueError(f"line {a.line}: exercise {a.exercise} (cell={a.cell}) has no such solution cell "
                             f"in {solution.name}; exercises: {', '.join(sorted(chk))}")
    graded, plans = _build(nb, answers, sol, chk)
    kept = {i for ids in chk.values() for i in ids}
    for i, cell in enumerate(nb.cells):  # another part's checks: that part runs them
        if m11_meta(cell).get("role") == CHECK and i not in kept:
            graded.cells[i].source = f"# exercise {m11_meta(cell).get('exercise')}'s checks run in another part"
            graded.cells[i].metadata.pop("m11", None)  # a plain cell now: the guard expects a check's passed() line
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="m11-wrong-") as tmp:
        # a folder of its own inside the private one: the sandbox treats a submission's parent as the class
        # folder (nothing in it is bound), which must not be /tmp, where the grader's packages may lie
        folder = Path(tmp) / "submission"
        folder.mkdir()
        shutil.copy(solution, folder / solution.name)
        for extra in extra_paths:
            (shutil.copytree if extra.is_dir() else shutil.copy)(extra, folder / extra.name)
        cells = run_cells(graded, folder, cell_timeout, time.monotonic() + notebook_timeout, notes)
    checks = {i for ids in chk.values() for i in ids}
    failures = [f"note: {n.splitlines()[0][:300]}" for n in notes]
    for i, cell in enumerate(nb.cells):
        rec = cells.get(i)
        if cell.cell_type != "code" or (i not in checks and (rec or {}).get("outcome") != "failed"):
            continue
        if rec is None or rec.get("outcome") != "passed":
            kind = f"({m11_meta(cell).get('exercise')})" if i in checks else "(not a check cell) failed"
            failures.append(f"cell {i} {kind}: {why(rec).splitlines()[0][:300]}")
    verdicts = []
    for a, plan, result in zip(answers, plans, score(plans, cells)):
        bad = next((cells.get(i) for i in [*plan.solutions, *plan.checks]
                    if (cells.get(i) or {}).get("outcome") != "passed"), None)
        message = _full(bad) if result.points == 0 else ""
        verdicts.append(Verdict(a, result.points == 0, message, a.expect.lower() in message.lower(), result.why))
    return failures, verdicts


def _full(rec: dict | None) -> str:
    """The whole failure a learner would read (the report shows its first lines)."""
    if not rec:
        return "not run"
    if rec.get("tampering"):
        return why(rec)
    return f"{rec.get('ename', '')}: {rec.get('evalue', '')}".strip(": ") or why(rec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m m11_helpers.grading.authoring.wrong_answers",
                                 description="grade a lesson's recorded wrong answers in one kernel")
    ap.add_argument("solutions", nargs="+", type=Path)
    ap.add_argument("--cell-timeout", type=float, default=120)
    ap.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT, help="seconds for one lesson's run")
    ap.add_argument("--exercises", nargs="+", help="grade one part: these exercises' checks and answers only")
    args = ap.parse_args(argv)
    bad = 0
    for sol in args.solutions:
        failures, verdicts = run_wrong_answers(sol, cell_timeout=args.cell_timeout, exercises=args.exercises and
                                               tuple(args.exercises), notebook_timeout=args.notebook_timeout)
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
