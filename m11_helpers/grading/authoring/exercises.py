"""`m11 make-exercises`: generate `exercises/` from `solutions/`, the one source (nbgrader style).

    m11 make-exercises                  solutions/*.ipynb -> exercises/*.ipynb (repo root from cwd up)
    m11 make-exercises --check          write nothing; exit 1 listing exercises that are out of date

In a solution notebook:

- a code cell with `metadata.m11 = {"exercise": "3.2", "role": "solution"}` wraps the answer in
  `### BEGIN SOLUTION` / `### END SOLUTION` lines (any indentation); the generated copy has, at
  the marker's indentation, `# YOUR CODE HERE` and `raise NotImplementedError("Exercise 3.2: ...")`.
  In a markdown cell the region becomes `YOUR ANSWER HERE`.
- a check cell, `{"exercise": "3.2", "role": "check", "points": 2}`, may hold stricter cases
  between `### BEGIN HIDDEN TESTS` / `### END HIDDEN TESTS`: removed from the learner's copy, put
  back by `m11 grade`.
- outputs are cleared, except those of `# NBVAL_CHECK_OUTPUT` cells that are neither solution nor
  check cells; everything else is copied as is (then cleaned by `m11_helpers.tools.notebooks.clean`).

Mistakes (unbalanced markers, a solution without an exercise id, an id used twice, a check cell
without points) raise `ExerciseError` naming the notebook, the cell index and the fix.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from m11_helpers.grading.cells import (
    ANSWER_STUB,
    AUTHOR_ROLES,
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    CHECK,
    CODE_STUB,
    END_HIDDEN,
    END_SOLUTION,
    SOLUTION,
    m11_meta,
)
from m11_helpers.tools.notebooks import clean, dumps
from m11_helpers.tools.paths import repo_root

__all__ = ["ExerciseError", "validate", "make_exercise", "sync", "main"]


class ExerciseError(ValueError):
    """A solution notebook breaks the exercise conventions; the message lists every problem."""


def _regions(lines: list[str], begin: str, end: str) -> list[tuple[int, int]] | str:
    """(begin, end) line index pairs of the marked regions, or a message when unbalanced."""
    found, start = [], None
    for i, line in enumerate(lines):
        mark = line.strip()
        if mark == begin:
            if start is not None:
                return f"line {i + 1}: a second '{begin}' before '{end}' (line {start + 1}); close the first region"
            start = i
        elif mark == end:
            if start is None:
                return f"line {i + 1}: '{end}' without a '{begin}' above it; add the BEGIN line or remove this one"
            found.append((start, i))
            start = None
    if start is not None:
        return f"line {start + 1}: '{begin}' is never closed; add '{end}' after the answer"
    return found


def validate(nb: NotebookNode, name: str = "notebook") -> None:
    """Raise `ExerciseError` listing every broken convention in the solution notebook `nb`."""
    problems: list[str] = []
    solutions: dict[str, int] = {}
    checks: list[tuple[int, str]] = []
    for i, cell in enumerate(nb.cells):
        meta, lines = m11_meta(cell), cell.source.splitlines()
        where = f"{name}: cell {i}"
        sol = _regions(lines, BEGIN_SOLUTION, END_SOLUTION)
        hid = _regions(lines, BEGIN_HIDDEN, END_HIDDEN)
        for r in (sol, hid):
            if isinstance(r, str):
                problems.append(f"{where}: {r}")
        role, ex = meta.get("role"), meta.get("exercise")
        if meta and role not in AUTHOR_ROLES:
            problems.append(f"{where}: metadata.m11.role={role!r}; allowed: {', '.join(AUTHOR_ROLES)}")
        if ex is not None and (not isinstance(ex, str) or not ex.strip()):
            problems.append(f"{where}: metadata.m11.exercise={ex!r}; use a string id like \"3.2\"")
            continue
        if cell.cell_type == "code" and sol and not isinstance(sol, str):
            if ex is None:
                problems.append(f"{where}: a solution region but no exercise id; set metadata.m11 = "
                                '{"exercise": "N.k", "role": "solution"}')
            elif role == CHECK:
                problems.append(f"{where}: a solution region inside a check cell; move it to the "
                                "exercise's solution cell")
        if role == SOLUTION and cell.cell_type == "code":
            if not sol:
                problems.append(f"{where}: solution cell for exercise {ex} has no '{BEGIN_SOLUTION}' "
                                "region; wrap the answer in BEGIN/END SOLUTION lines")
            if ex in solutions:
                problems.append(f"{where}: exercise id {ex} is already used by cell {solutions[ex]}; "
                                "give this exercise its own id")
            elif ex is not None:
                solutions[ex] = i
        if hid and not isinstance(hid, str) and role != CHECK:
            problems.append(f"{where}: hidden tests outside a check cell are never restored by the "
                            "grader; move them into the exercise's check cell")
        if role == CHECK:
            pts = meta.get("points")
            if ex is None:
                problems.append(f"{where}: check cell without an exercise id; set metadata.m11.exercise")
            elif isinstance(pts, bool) or not isinstance(pts, (int, float)) or pts <= 0:
                problems.append(f"{where}: check cell for exercise {ex} has points={pts!r}; set "
                                "metadata.m11.points to a positive number")
            checks.append((i, ex))
    for i, ex in checks:
        if ex is not None and ex not in solutions:
            problems.append(f"{name}: cell {i}: check cell for exercise {ex} but no solution cell has "
                            f"that id; fix the id (solution ids: {', '.join(solutions) or 'none'})")
    if problems:
        raise ExerciseError("\n".join(problems))


def _replace(source: str, begin: str, end: str, stub: list[str] | None) -> str:
    """Replace each begin..end region (markers included) by `stub` at the marker's indentation."""
    lines, out, inside = source.splitlines(), [], False
    for line in lines:
        mark = line.strip()
        if mark == begin:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + s for s in (stub or [])]
        elif mark == end:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def make_exercise(nb: NotebookNode, name: str = "notebook") -> NotebookNode:
    """The learner's copy of the solution notebook `nb` (validated first; `nb` is not changed)."""
    validate(nb, name)
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        meta = m11_meta(cell)
        if cell.cell_type == "markdown":
            cell.source = _replace(cell.source, BEGIN_SOLUTION, END_SOLUTION, [ANSWER_STUB])
        elif cell.cell_type == "code":
            stub = [CODE_STUB,
                    f'raise NotImplementedError("Exercise {meta.get("exercise")}: not implemented yet")']
            new = _replace(cell.source, BEGIN_SOLUTION, END_SOLUTION, stub)
            new = _replace(new, BEGIN_HIDDEN, END_HIDDEN, None)
            if meta.get("role") in AUTHOR_ROLES or new != cell.source:
                cell.outputs, cell.execution_count = [], None  # never leak the answer's output
            cell.source = new
    return clean(nb)


def sync(source: Path, dest: Path, check: bool = False) -> list[Path]:
    """Regenerate `dest` from `source`; return the exercise files that were (or are) out of date."""
    if not source.is_dir():
        raise ValueError(f"source={str(source)!r}: not a folder of solution notebooks")
    wanted: dict[Path, str] = {}
    owner: dict[str, str] = {}
    problems: list[str] = []
    for path in sorted(source.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        try:
            wanted[dest / path.name] = dumps(make_exercise(nb, str(path)))
        except ExerciseError as e:
            problems.append(str(e))
            continue
        for i, cell in enumerate(nb.cells):
            meta = m11_meta(cell)
            if meta.get("role") == SOLUTION:
                ex = meta.get("exercise")
                if ex in owner and owner[ex] != path.name:
                    problems.append(f"{path}: cell {i}: exercise id {ex} is also used in {owner[ex]}; "
                                    "ids are course-wide, start them with the lesson number")
                owner.setdefault(ex, path.name)
    if problems:
        raise ExerciseError("\n".join(problems))
    stale = [p for p in sorted(dest.glob("*.ipynb")) if p not in wanted] if dest.is_dir() else []
    changed = [p for p, text in wanted.items()
               if not p.is_file() or p.read_text(encoding="utf-8") != text] + stale
    if not check:
        dest.mkdir(parents=True, exist_ok=True)
        for p in changed:
            if p in stale:
                p.unlink()  # its solution is gone: a learner must not get an ungradable exercise
            else:
                p.write_text(wanted[p], encoding="utf-8")
    return changed


def main(argv: list[str]) -> int:
    """`m11 make-exercises [--check] [--source DIR] [--dest DIR]`."""
    ap = argparse.ArgumentParser(prog="m11 make-exercises", description="regenerate exercises/ from solutions/")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when out of date")
    ap.add_argument("--source", type=Path, help="solution notebooks (default: REPO/solutions)")
    ap.add_argument("--dest", type=Path, help="generated exercises (default: REPO/exercises)")
    args = ap.parse_args(argv)
    try:
        root = repo_root() if args.source is None or args.dest is None else None
        source = args.source or root / "solutions"
        dest = args.dest or root / "exercises"
        changed = sync(source, dest, check=args.check)
    except ValueError as e:  # ExerciseError included: every problem, one per line
        print(f"m11 make-exercises: {e}", file=sys.stderr)
        return 2
    if args.check:
        if changed:
            print("out of date (run `m11 make-exercises`):", *changed, sep="\n  ")
            return 1
        print(f"exercises up to date ({source} -> {dest})")
        return 0
    for p in changed:
        print(f"{'removed' if not p.exists() else 'wrote'} {p}")
    if not changed:
        print(f"exercises up to date ({source} -> {dest})")
    return 0
