"""Every lesson's generated exercise notebook, graded end to end as a learner's untouched copy: zero.

Each notebook runs under the real grader (`m11 grade`: nbval in a separate process, hidden tests
restored from the solution, the sandbox), exactly as an instructor's CI would grade a class. That the
solutions score full marks is proven once per lesson by tests/test_wrong_answers.py, whose graded run
starts with the whole solution notebook (every check, hidden ones included) before it substitutes each
wrong answer; a sample there proves that run gives `m11 grade`'s verdict.
"""

import copy
from pathlib import Path

import nbformat
import pytest

from m11_helpers.grading.authoring.exercises import main as make_exercises
from m11_helpers.grading.authoring.kinds import MAX_TRANSCRIPTION, points_by_kind, transcription_share
from m11_helpers.grading.cells import CHECK, KIND, role_of
from m11_helpers.grading.engine.grader import grade_notebook

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def test_exercises_are_in_sync_with_solutions():
    assert make_exercises(["--check"]) == 0, "run `m11 make-exercises` and commit exercises/"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_each_exercise_declares_its_kind_and_transcription_is_at_most_a_tenth(solution):
    nb = nbformat.read(solution, as_version=4)
    points = points_by_kind(nb)  # raises, naming the exercise, when a check cell declares no kind or an unknown one
    share = transcription_share(nb)
    assert share <= MAX_TRANSCRIPTION, f"{solution.stem}: {share:.0%} of its points are transcription ({points})"


def test_kinds_are_refused_when_missing_unknown_or_mixed_and_the_share_counts_points():
    nb = nbformat.read(SOLUTIONS[0], as_version=4)
    checks = [c for c in nb.cells if role_of(c) == CHECK]
    planted = copy.deepcopy(nb)
    [c for c in planted.cells if role_of(c) == CHECK][0].metadata["m11"].pop(KIND, None)
    with pytest.raises(ValueError, match=r"exercise .*: kind=None; every check cell declares one of"):
        points_by_kind(planted)
    planted = copy.deepcopy(nb)
    [c for c in planted.cells if role_of(c) == CHECK][0].metadata["m11"][KIND] = "copy"
    with pytest.raises(ValueError, match="kind='copy'"):
        points_by_kind(planted)
    planted = copy.deepcopy(nb)
    for cell in planted.cells:  # every check of the lesson made transcription: the share is all its points
        if role_of(cell) == CHECK:
            cell.metadata["m11"][KIND] = "transcribe"
    assert transcription_share(planted) == 1.0
    assert sum(points_by_kind(planted).values()) == sum(c.metadata["m11"].get("points", 0) for c in checks)


@pytest.mark.slow
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_generated_exercise_scores_zero_and_is_graded_to_the_end(solution):
    exercise = ROOT / "exercises" / solution.name
    result = grade_notebook(exercise, ROOT / "solutions", cell_timeout=120, notebook_timeout=600)
    assert len(result.exercises) >= 3, "each lesson has at least three graded exercises"
    assert result.max_score > 0 and result.score == 0
    assert all(e.status == "failed" for e in result.exercises), [(e.exercise, e.status) for e in result.exercises]
