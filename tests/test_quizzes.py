"""Every lesson's quiz: four or more questions kept out of the notebook, at least half of them transfer questions
whose right answer is a number (or a fact) the lesson did not print: checked against the committed notebook's
markdown and checked outputs here, and against this session's executed copy after the course has run."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

import m11_helpers.quizzes  # noqa: F401 - the package of every lesson's questions
from m11_helpers.pipeline import bubble_fraction
from m11_helpers.quiz import Question, Quiz, QuizState, as_markdown, lesson_questions
from support.printed_numbers import distinctive, notebook_text, numbers, printed_answers

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.stem for p in (ROOT / "course").glob("[0-9][0-9]_*.ipynb"))
EXECUTED = ROOT / "build" / "test-artifacts" / "executed"  # tests/conftest.py's copies of this session's runs


def _already_answered_in(questions: list[Question], shown) -> list[str]:
    """Each transfer question whose right answer has a number the lesson shows, with those numbers."""
    return [f"Q{i} {q.prompt[:70]!r}…: {hits}" for i, q in enumerate(questions, 1)
            if q.transfer and (hits := printed_answers(q, shown))]


def _already_answered(lesson: str, shown) -> list[str]:
    return _already_answered_in(lesson_questions(lesson), shown)


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_quiz_is_in_the_package_with_transfer_questions(lesson):
    nb = nbformat.read(ROOT / "course" / f"{lesson}.ipynb", as_version=4)
    calls = [c.source for c in nb.cells if c.cell_type == "code" and "quiz(" in c.source]
    assert calls and all(re.search(rf"quiz\(\s*[\"']{lesson}[\"']\s*\)", s) for s in calls), \
        f"the quiz cell should be quiz({lesson!r}) with the questions in m11_helpers/quizzes/q{lesson}.py"
    questions = lesson_questions(lesson)
    assert len(questions) >= 4 and all(isinstance(q, Question) for q in questions)
    assert 2 * sum(q.transfer for q in questions) >= len(questions), \
        "at least half the questions put the idea in a situation the lesson did not compute (transfer=True)"
    assert len({q.prompt for q in questions}) == len(questions)
    # the lesson as committed: its markdown and its checked outputs (# NBVAL_CHECK_OUTPUT cells)
    answered = _already_answered(lesson, numbers(notebook_text(nb)))
    assert not answered, f"transfer questions whose answer the lesson's text already prints: {answered}"


@pytest.mark.after_course  # reads the executed copies the course notebooks' run leaves (tests/conftest.py)
@pytest.mark.parametrize("lesson", LESSONS)
def test_transfer_answers_are_not_printed_by_the_executed_lesson(lesson):
    path = EXECUTED / f"{lesson}.ipynb"
    if not path.exists():
        pytest.skip(f"no executed copy at {path.relative_to(ROOT)}: run the course notebooks in the same session "
                    f"(make test, or make test-lesson N={lesson[:2]})")
    nb = nbformat.read(path, as_version=4)
    if not nb.metadata.get("m11_executed", {}).get("complete"):
        pytest.skip(f"{path.relative_to(ROOT)} is from a run that stopped early: its outputs are partial")
    answered = _already_answered(lesson, numbers(notebook_text(nb)))
    assert not answered, f"transfer questions whose answer the executed lesson prints: {answered}"


def test_the_printed_answer_check_sees_a_planted_question():
    """A transfer question whose answer the lesson prints is caught, however the number is written."""
    nb = nbformat.read(ROOT / "course" / "04_model_parallel.ipynb", as_version=4)
    text = notebook_text(nb)
    bubble = bubble_fraction(8, 64)  # 7/71: the interleaving cell's checked output prints it
    assert f"{bubble:.1%}" in text
    shown = numbers(text)
    for written in (f"{bubble:.1%}", f"{bubble:.0%}", f"{bubble:.3f}", f"{100 * bubble:.1f} percent"):
        planted = Question("8 stages, 64 micro-batches: the idle share?", [written, "50 %"], 0, ["…", "…"],
                           transfer=True)
        assert printed_answers(planted, shown), written
        assert _already_answered_in([*lesson_questions("04_model_parallel"), planted], shown)  # what the tests see
    fresh = Question("8 stages, 24 micro-batches: the idle share?", [f"{bubble_fraction(8, 24):.1%}", "9.9 %"], 0,
                     ["…", "…"], transfer=True)
    assert not printed_answers(fresh, shown)  # 22.6 % is nowhere in lesson 04
    given = Question("From 27 % idle, you double the micro-batches: the idle share?", ["27 % → 16 %", "x"], 0,
                     ["…", "…"], transfer=True)
    assert [round(v, 2) for v, _ in distinctive(given)] == [0.16]  # the prompt's 27 % is not the answer
    assert printed_answers(Question("?", ["3/11", "x"], 0, ["…", "…"], transfer=True), numbers("idle: 27.3 %"))
    assert not printed_answers(Question("?", ["52.2 GB", "x"], 0, ["…", "…"], transfer=True), numbers("52 ms"))


def test_unknown_lesson_quiz_says_where_it_should_be():
    with pytest.raises(ValueError, match="m11_helpers/quizzes/q99_nothing.py"):
        lesson_questions("99_nothing")


def test_quiz_state_and_static_form():
    q = [Question("2+2?", ["3", "4"], 1, ["no", "yes"], transfer=True)]
    s = QuizState(q)
    assert s.pick(0, 0) == (False, "no") and s.pick(0, 1) == (True, "yes") and s.score == 0  # first pick counts
    assert "<details>" in as_markdown(q) and isinstance(Quiz(q)._repr_markdown_(), str)
