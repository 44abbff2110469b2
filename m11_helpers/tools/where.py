"""`m11 where NN`: every place of one lesson's room, from the lesson table (`m11_helpers.lessons`).

    m11 where 04          # modules, notebooks with each exercise's cells, wrong-answer line ranges, quiz, tests, deck
    m11 where --table     # rewrite CONTRIBUTING.md's lesson table from m11_helpers/lessons.py

Cells are numbered from 1 in file order (the notebook JSON's `cells` list); an exercise's cells are
the ones whose `metadata.m11.exercise` names it. A wrong-answer range runs from the first
`# %% N.M | …` block of the exercise to the line before the next exercise's first block.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from m11_helpers import lessons
from m11_helpers.tools.paths import repo_root

__all__ = ["exercise_cells", "wrong_answer_ranges", "describe", "write_table", "main"]

_BLOCK = re.compile(r"^# %%\s+(\d+\.\d+[a-z]?)\b")  # a recorded wrong answer's first line (grading's format)
_MARKS = ("<!-- lesson-table:start -->", "<!-- lesson-table:end -->")


def exercise_cells(notebook: Path) -> dict[str, list[tuple[int, str]]]:
    """exercise id -> [(cell number from 1, role), …] in file order."""
    out: dict[str, list[tuple[int, str]]] = {}
    for i, cell in enumerate(json.loads(notebook.read_text(encoding="utf-8"))["cells"], start=1):
        meta = cell.get("metadata", {}).get("m11") or {}
        if "exercise" in meta:
            out.setdefault(str(meta["exercise"]), []).append((i, str(meta.get("role", "?"))))
    return out


def wrong_answer_ranges(path: Path) -> dict[str, tuple[int, int, int]]:
    """exercise id -> (first line, last line, answers recorded), lines from 1."""
    lines = path.read_text(encoding="utf-8").splitlines()
    starts = [(n, m.group(1)) for n, line in enumerate(lines, start=1) if (m := _BLOCK.match(line))]
    out: dict[str, tuple[int, int, int]] = {}
    for k, (n, ex) in enumerate(starts):
        end = starts[k + 1][0] - 1 if k + 1 < len(starts) else len(lines)
        first, _, count = out.get(ex, (n, 0, 0))
        out[ex] = (first, end, count + 1)
    return out


def _cells(cells: list[tuple[int, str]]) -> str:
    return ", ".join(f"{role} cell {n}" for n, role in cells)


def describe(root: Path, number: str) -> list[str]:
    """The lines `m11 where NN` prints."""
    row = lessons.lesson(number)
    places = row.places()
    out = [f"lesson {row.name}", "modules:"]
    for m in row.modules:
        out.append(f"  m11_helpers/{m}.py" if (root / "m11_helpers" / f"{m}.py").exists() else f"  m11_helpers/{m}/")
    out.append("notebooks:")
    for role in ("course", "solution", "exercise"):
        out.append(f"  {places[role]}")
        nb = root / places[role]
        for ex, cells in (exercise_cells(nb) if nb.exists() else {}).items():
            out.append(f"    {ex}: {_cells(cells)}")
    out.append(f"wrong answers: {places['wrong_answers']}")
    for ex, (first, last, count) in wrong_answer_ranges(root / places["wrong_answers"]).items():
        out.append(f"    {ex}: lines {first}-{last} ({count} answers)")
    out.append(f"quiz: {places['quiz']}")
    out.append("tests:")
    out += [f"  tests/{t}" for t in row.tests]
    built = "" if (root / places["deck"]).exists() else " (not built yet: m11 slides)"
    out.append(f"deck: {places['deck']}{built}")
    return out


def write_table(root: Path, rows: tuple[lessons.Row, ...] = lessons.ROWS) -> Path:
    """Rewrite CONTRIBUTING.md's lesson table (between its markers) from `rows`; return the file."""
    path = root / "CONTRIBUTING.md"
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(_MARKS[0], 1)
    _, tail = rest.split(_MARKS[1], 1)
    path.write_text(f"{head}{_MARKS[0]}\n{lessons.markdown_table(rows)}\n{_MARKS[1]}{tail}", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="m11 where", description=__doc__.splitlines()[0])
    ap.add_argument("number", nargs="?", help="the lesson's two digits, e.g. 04")
    ap.add_argument("--table", action="store_true", help="rewrite CONTRIBUTING.md's lesson table from lessons.py")
    args = ap.parse_args(argv)
    root = repo_root()
    if args.table:
        print(f"wrote {write_table(root).relative_to(root)}")
        return 0
    try:
        print("\n".join(describe(root, args.number or "")))
    except ValueError as e:
        print(f"m11 where: no such lesson: {e}", file=sys.stderr)
        return 2
    return 0
