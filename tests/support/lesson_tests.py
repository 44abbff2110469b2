"""Print the pytest arguments that test one lesson: `make test-lesson N=05` runs them (about a minute).

Its module tests (from the lesson table, m11_helpers/lessons.py), its notebook under nbval (copied alone
into an empty folder, the package from a wheel: tests/conftest.py), its solution and generated exercise
graded, its recorded wrong answers; and the tests of those files that name no lesson (the repository's
setup cells, quiz and wrong-answer file rules, exercises in sync), but for the few in `NOT_A_LESSON`,
which test no lesson's code and only `make test` runs: the grader on its own fixture (`00_demo`: its
wrong answers and a sample graded both ways, ~4 s of CPU and 14 s of wall time) and the wheel's
packaging (a notebook opened alone finding what it needs, a kernel stuck at start-up saying where; 15 s).
"""

from __future__ import annotations

import re
import sys

from m11_helpers import lessons

# keywords (pytest -k) of tests that name no lesson and test none: `make test` runs them, `make test-lesson` not
NOT_A_LESSON = ("00_demo", "test_the_wheel_ships_what_a_notebook_opened_alone_needs",
                "test_a_kernel_that_hangs_before_its_first_cell_says_where")


def lesson_args(number: str) -> list[str]:
    try:
        row = lessons.lesson(number)
    except ValueError as e:
        raise SystemExit(f"no lesson {number!r} in the lesson table (give N=05 style numbers): {e}") from None
    others = " or ".join(r.name for r in lessons.LESSONS if r is not row)
    return [*(f"tests/{t}" for t in row.tests), "tests/test_wrong_answers.py", "tests/test_lessons_graded.py",
            "tests/test_repo.py", "tests/test_quizzes.py",
            "-k", f"({row.name} or not ({others})) and not ({' or '.join(NOT_A_LESSON)})",
            "--nbval-lax", "tests/test_course_notebooks.py"]  # its notebook, from a copy with the wheel


if __name__ == "__main__":
    if len(sys.argv) != 2 or not re.fullmatch(r"\d\d", sys.argv[1]):
        raise SystemExit("usage: python tests/support/lesson_tests.py NN   (e.g. 05)")
    print(" ".join(f"'{a}'" if " " in a else a for a in lesson_args(sys.argv[1])))
