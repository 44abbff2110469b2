"""Every lesson's generated exercise notebook, graded end to end as a learner's untouched copy: zero.

Each notebook runs under the real grader (`m11 grade`: nbval in a separate process, hidden tests
restored from the solution, the sandbox), exactly as an instructor's CI would grade a class. That the
solutions score full marks is proven once per lesson by tests/test_wrong_answers.py, whose graded run
starts with the whole solution notebook (every check, hidden ones included) before it substitutes each
wrong answer; a sample there proves that run gives `m11 grade`'s verdict.
"""

from pathlib import Path

import pytest

from m11_helpers.grading.authoring.exercises import main as make_exercises
from m11_helpers.grading.engine.grader import grade_notebook

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def test_exercises_are_in_sync_with_solutions():
    assert make_exercises(["--check"]) == 0, "run `m11 make-exercises` and commit exercises/"


@pytest.mark.slow
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_generated_exercise_scores_zero_and_is_graded_to_the_end(solution):
    exercise = ROOT / "exercises" / solution.name
    result = grade_notebook(exercise, ROOT / "solutions", cell_timeout=120, notebook_timeout=600)
    assert len(result.exercises) >= 3, "each lesson has at least three graded exercises"
    assert result.max_score > 0 and result.score == 0
    assert all(e.status == "failed" for e in result.exercises), [(e.exercise, e.status) for e in result.exercises]
