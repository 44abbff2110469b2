"""Every lesson's exercises end to end: solutions score full marks, generated exercises score zero.

Each notebook runs under the real grader (nbval in a separate process, hidden tests restored from
the solution), exactly as an instructor's CI would grade a class.
"""

from pathlib import Path

import pytest

from m11_helpers.grading.exercises import main as make_exercises
from m11_helpers.grading.grader import grade_notebook

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def test_exercises_are_in_sync_with_solutions():
    assert make_exercises(["--check"]) == 0, "run `m11 make-exercises` and commit exercises/"


@pytest.mark.slow
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_scores_full_marks(solution):
    result = grade_notebook(solution, ROOT / "solutions", cell_timeout=120, notebook_timeout=600)
    failed = [(e.exercise, e.why) for e in result.exercises if e.points < e.max_points]
    assert len(result.exercises) >= 3, "each lesson has at least three graded exercises"
    assert not failed and result.score == result.max_score > 0, failed


@pytest.mark.slow
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_generated_exercise_scores_zero_and_is_graded_to_the_end(solution):
    exercise = ROOT / "exercises" / solution.name
    result = grade_notebook(exercise, ROOT / "solutions", cell_timeout=120, notebook_timeout=600)
    assert result.max_score > 0 and result.score == 0
    assert all(e.status == "failed" for e in result.exercises), [(e.exercise, e.status) for e in result.exercises]
