"""Every exercise's recorded wrong answers score 0 with a hint that names the mistake; the solution scores full marks.

One kernel per lesson (`m11_helpers.grading.wrong_answers.run_wrong_answers`): the solution notebook
runs top to bottom once (every check passes), then each wrong answer replaces its exercise's solution
cell and the exercise's checks (hidden tests included) must fail with the recorded hint.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from m11_helpers.grading.exercises import m11_meta
from m11_helpers.grading.wrong_answers import parse, run_wrong_answers, wrong_answers_path

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
RECORDED = [p for p in SOLUTIONS if wrong_answers_path(p).exists()]


def test_parse_reads_headers_and_rejects_malformed_ones():
    text = "# %% 3.2 | forgets ÷N | expect: divide\ndef f():\n    return 1\n\n# %% 3.2 cell=1 | x | expect: y\npass\n"
    a, b = parse(text)
    assert (a.exercise, a.mistake, a.expect, a.cell, a.source) == ("3.2", "forgets ÷N", "divide", 0,
                                                                   "def f():\n    return 1")
    assert (b.cell, b.line) == (1, 5)
    with pytest.raises(ValueError, match="line 1"):
        parse("# %% 3.2 forgot the bars\nx = 1\n")


@pytest.mark.parametrize("solution", RECORDED, ids=[p.stem for p in RECORDED])
def test_every_exercise_records_two_wrong_answers(solution):
    nb = nbformat.read(solution, as_version=4)
    exercises = {str(m11_meta(c)["exercise"]) for c in nb.cells if m11_meta(c).get("role") == "check"}
    answers = parse(wrong_answers_path(solution).read_text(encoding="utf-8"))
    counts = {ex: sum(a.exercise == ex for a in answers) for ex in exercises}
    assert all(n >= 2 for n in counts.values()), f"fewer than two wrong answers: {counts}"


@pytest.mark.slow
@pytest.mark.parametrize("solution", RECORDED, ids=[p.stem for p in RECORDED])
def test_wrong_answers_score_zero_with_their_hint(solution):
    failures, verdicts = run_wrong_answers(solution)
    assert not failures, f"the solution itself does not score full marks: {failures}"
    bad = [(v.answer.exercise, v.answer.mistake, v.message.splitlines()[0] if v.message else "passed")
           for v in verdicts if not (v.scored_zero and v.hint_ok)]
    assert not bad, "wrong answers that scored, or whose failure does not name the mistake: " + repr(bad)
