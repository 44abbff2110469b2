"""Every lesson's quiz: four or more questions kept out of the notebook, at least two of them transfer questions."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

import m11_helpers.quizzes  # noqa: F401 - the package of every lesson's questions
from m11_helpers.quiz import Question, Quiz, QuizState, as_markdown, lesson_questions

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.stem for p in (ROOT / "course").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_quiz_is_in_the_package_with_transfer_questions(lesson):
    nb = nbformat.read(ROOT / "course" / f"{lesson}.ipynb", as_version=4)
    calls = [c.source for c in nb.cells if c.cell_type == "code" and "quiz(" in c.source]
    assert calls and all(re.search(rf"quiz\(\s*[\"']{lesson}[\"']\s*\)", s) for s in calls), \
        f"the quiz cell should be quiz({lesson!r}) with the questions in m11_helpers/quizzes/q{lesson}.py"
    questions = lesson_questions(lesson)
    assert len(questions) >= 4 and all(isinstance(q, Question) for q in questions)
    assert sum(q.transfer for q in questions) >= 2, "at least two 'you change X: what happens to Y?' questions"
    assert len({q.prompt for q in questions}) == len(questions)


def test_unknown_lesson_quiz_says_where_it_should_be():
    with pytest.raises(ValueError, match="m11_helpers/quizzes/q99_nothing.py"):
        lesson_questions("99_nothing")


def test_quiz_state_and_static_form():
    q = [Question("2+2?", ["3", "4"], 1, ["no", "yes"], transfer=True)]
    s = QuizState(q)
    assert s.pick(0, 0) == (False, "no") and s.pick(0, 1) == (True, "yes") and s.score == 0  # first pick counts
    assert "<details>" in as_markdown(q) and isinstance(Quiz(q)._repr_markdown_(), str)
