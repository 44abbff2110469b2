"""Print the pytest arguments that test one lesson: `make test-lesson N=05` runs them (about a minute).

Its module tests (from CONTRIBUTING.md's lesson table), its notebook under nbval (copied alone into an
empty folder, the package from a wheel: tests/conftest.py), its solution and generated exercise
graded, its recorded wrong answers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lesson_args(number: str) -> list[str]:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    body = text.split("<!-- lesson-table:start -->")[1].split("<!-- lesson-table:end -->")[0]
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith(f"{number}_"):
            stem, tests = cells[0], re.findall(r"`([\w.]+)`", cells[2])
            return [*(f"tests/{t}" for t in tests), "tests/test_wrong_answers.py", "tests/test_lessons_graded.py",
                    "tests/test_repo.py", "tests/test_quizzes.py", "-k", f"{stem} or not ({_others(body, stem)})",
                    "--nbval-lax", "tests/test_course_notebooks.py"]  # its notebook, from a copy with the wheel
    raise SystemExit(f"no lesson {number!r} in CONTRIBUTING.md's lesson table (give N=05 style numbers)")


def _others(body: str, stem: str) -> str:
    stems = [c.strip().strip("|").split("|")[0].strip() for c in body.splitlines() if re.match(r"\| \d\d_", c)]
    return " or ".join(s for s in stems if s != stem)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not re.fullmatch(r"\d\d", sys.argv[1]):
        raise SystemExit("usage: python tests/support/lesson_tests.py NN   (e.g. 05)")
    print(" ".join(f"'{a}'" if " " in a else a for a in lesson_args(sys.argv[1])))
