"""`m11 new-lesson NN topic "Title"`: write a lesson skeleton that passes the suite, in its four places.

    m11 new-lesson 13 expert_routing "Expert routing"

writes `course/13_expert_routing.ipynb` (the checklist's sections, slide metadata on every cell),
`m11_helpers/expert_routing.py`, `m11_helpers/quizzes/q13_expert_routing.py`, `tests/test_expert_routing.py`,
`solutions/13_expert_routing.ipynb` with three exercises on real ranks and
`solutions/wrong_answers/13_expert_routing.py` with two recorded wrong answers each, then regenerates
`exercises/`, adds the README row, the lesson's entry in `m11_helpers/lessons.py` (the lesson table) and
CONTRIBUTING.md's table generated from it. Every file says what to replace; nothing already there is
overwritten.
"""

from __future__ import annotations

import argparse
import re
import runpy
import sys
from pathlib import Path

from m11_helpers.tools.notebooks import clean, dumps, from_percent, refresh
from m11_helpers.tools.paths import repo_root
from m11_helpers.tools.setup_cell import readme_row, setup_cell_source
from m11_helpers.tools.where import write_table

__all__ = ["create_lesson", "main"]

_TEMPLATES = Path(__file__).parent / "templates" / "lesson"


def _fill(name: str, **values: str) -> str:
    text = (_TEMPLATES / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise RuntimeError(f"template {name} has unfilled fields {left}")
    return text


def _setup_percent() -> str:
    return "# %% slide=skip\n" + setup_cell_source() + "\n"


def create_lesson(root: Path, number: str, topic: str, title: str, run: bool = True) -> list[Path]:
    """Write the skeleton of lesson `number`_`topic` under `root`; return the files written or changed.

    With `run`, the lesson notebook is executed once so its checked outputs are stored.
    """
    if not re.fullmatch(r"\d\d", number):
        raise ValueError(f"number must be two digits like '13', got {number!r}")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", topic):
        raise ValueError(f"topic must be a lower-case Python identifier like 'expert_routing', got {topic!r}")
    stem = f"{number}_{topic}"
    taken = [p.name for p in (root / "course").glob(f"{number}_*.ipynb")]
    if taken:
        raise ValueError(f"number {number} is taken by course/{taken[0]}; pick the next free number")
    module = root / "m11_helpers" / f"{topic}.py"
    targets = {
        root / "course" / f"{stem}.ipynb": None,
        root / "solutions" / f"{stem}.ipynb": None,
        root / "solutions" / "wrong_answers" / f"{stem}.py": None,
        module: None,
        root / "m11_helpers" / "quizzes" / f"q{stem}.py": None,
        root / "tests" / f"test_{topic}.py": None,
    }
    existing = [str(p.relative_to(root)) for p in targets if p.exists()]
    if existing:
        raise ValueError(f"topic {topic!r}: these files exist already: {', '.join(existing)}; choose another topic")
    values = {"NN": number, "TOPIC": topic, "STEM": stem, "TITLE": title}
    lesson = from_percent(_fill("lesson.py.txt", SETUP=_setup_percent(), **values))
    solution = from_percent(_fill("solution.py.txt", SETUP=_setup_percent(), **values))
    written = []
    for path, text in [(root / "course" / f"{stem}.ipynb", dumps(lesson)),
                       (root / "solutions" / f"{stem}.ipynb", dumps(solution)),
                       (root / "solutions" / "wrong_answers" / f"{stem}.py", _fill("wrong_answers.py.txt", **values)),
                       (module, _fill("module.py.txt", **values)),
                       (root / "m11_helpers" / "quizzes" / f"q{stem}.py", _fill("quiz.py.txt", **values)),
                       (root / "tests" / f"test_{topic}.py", _fill("test.py.txt", **values))]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if run:  # now that the module exists: store the checked cells' outputs, as `m11 nbclean --refresh` would
        course = root / "course" / f"{stem}.ipynb"
        course.write_text(dumps(clean(refresh(lesson, cwd=root / "course"))), encoding="utf-8")
    written += _add_rows(root, number, topic, stem, title)
    from m11_helpers.grading.authoring.exercises import sync

    written += sync(root / "solutions", root / "exercises")
    return written


def _add_rows(root: Path, number: str, topic: str, stem: str, title: str) -> list[Path]:
    """The README's lesson row (after the last one), the lesson's entry in lessons.py, CONTRIBUTING's table."""
    readme = root / "README.md"
    lines = readme.read_text(encoding="utf-8").splitlines()
    last = max(i for i, line in enumerate(lines) if re.match(r"\| \d\d \| ", line))
    lines.insert(last + 1, readme_row(number, topic, title))
    readme.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = root / "m11_helpers" / "lessons.py"
    text = table.read_text(encoding="utf-8")
    if text.count("\n)  # lessons: end") != 1:
        raise RuntimeError(f"{table}: the line ')  # lessons: end' that closes LESSONS is missing")
    table.write_text(text.replace("\n)  # lessons: end", f'\n    _l("{stem}", "{topic}", "{topic}"),\n)  # lessons: end'),
                     encoding="utf-8")
    rows = runpy.run_path(str(table))["ROWS"]  # the file as now written, not the module this process imported
    return [readme, table, write_table(root, rows)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="m11 new-lesson", description=__doc__.splitlines()[0])
    ap.add_argument("number", help="two digits, e.g. 13")
    ap.add_argument("topic", help="lower-case identifier, e.g. expert_routing")
    ap.add_argument("title", nargs="?", help="the lesson's title (default: from the topic)")
    ap.add_argument("--no-run", action="store_true", help="do not execute the new notebook to store its outputs")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and why: a status, as the other commands return
        return int(e.code or 0)
    try:
        root = repo_root()
        title = args.title or args.topic.replace("_", " ").capitalize()
        written = create_lesson(root, args.number, args.topic, title, run=not args.no_run)
    except ValueError as e:
        print(f"m11 new-lesson: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    print(f"next: fill in the skeleton (docs/lesson-checklist.md), then `make test-lesson N={args.number}`")
    return 0
