"""Every exercise's recorded wrong answers score 0 with a hint that names the mistake; the solution scores full marks.

One graded run per lesson (`m11_helpers.grading.authoring.wrong_answers.run_wrong_answers`, through the grader's
own runner, plugin and tamper guard): the solution notebook runs top to bottom once (every check
passes), then each wrong answer replaces its exercise's solution cell and the exercise's checks
(hidden tests included) must fail with the recorded hint. A sample proves that this gives `m11
grade`'s verdict on the solution with that one answer substituted; wrong answers never ship.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import nbformat
import pytest

from m11_helpers.grading.authoring.wrong_answers import NOTEBOOK_TIMEOUT, parse, run_wrong_answers, wrong_answers_path
from m11_helpers.grading.cells import CHECK, SOLUTION, exercise_of, role_of
from m11_helpers.grading.engine.grader import grade_notebook

ROOT = Path(__file__).resolve().parents[1]


def lessons(root: Path) -> list[Path]:
    """Every lesson's solution notebook: each must record its wrong answers (a missing file fails, never skips)."""
    return sorted((root / "solutions").glob("[0-9][0-9]_*.ipynb"))


SOLUTIONS = lessons(ROOT)
# pytest's own limit (pyproject: 300 s) would cut a lesson's run short on a loaded machine: each test gets the
# runner's limit (NOTEBOOK_TIMEOUT per graded run it makes) plus a minute to start the kernel and clean up
MARGIN_S = 60
DEMO = Path(__file__).parent / "data" / "grading" / "solutions" / "00_demo.ipynb"
# the equivalence sample: the grader's fixture, lesson 00, and the first of these lessons
CHEAP = ("01_hardware", "08_activation_checkpointing", "07_gradient_accumulation", "03_data_parallel",
         "06_mixed_precision", "09_efficiency", "02_collectives", "05_zero_fsdp", "04_model_parallel")
# lessons graded in parts (run_wrong_answers(exercises=...)): lesson 11's one run was 97 s in CI, over the
# 90 s a test may take (11.3's check alone, a real 4-process accelerate launch, is a third of it); lesson 10's
# took 120 s in `make test-lesson N=10` once 10.7's drills (kills, a resharded resume) joined it; lessons 03's and
# 05's single runs (47 and 41 s of CPU, 76 and 57 s in CI) were each the longest path of its `make test-lesson`.
# Each part pays a kernel start and the setup cells (~7 s of CPU), so a lesson has as few parts as keep its
# longest one short: lesson 11's 11.3 (~50 s of CPU, its real launch) stands alone, and so on. In CI three workers
# share two cores and the runs' own ranks, so a run takes ~2.5x its idle time: lesson 07's one run (44 s idle,
# 48 answers) took 106 s there and lesson 11's 11.1+11.2+11.4 took 92 s; a part is kept under ~35 s idle where its
# exercises allow it (11.3 alone is ~37 s: one exercise is never split)
PARTS = {"11_capstone": (("11.1",), ("11.2", "11.4"), ("11.3",)),
         "07_gradient_accumulation": (("7.1", "7.2", "7.3", "7.4"), ("7.5", "7.6")),
         "10_cloud_spot": (("10.1", "10.2", "10.3", "10.4"), ("10.5", "10.6", "10.7")),
         "03_data_parallel": (("3.1", "3.2"), ("3.3", "3.4")),
         "05_zero_fsdp": (("5.1", "5.2"), ("5.3", "5.4"))}
RUNS = [(DEMO, None), *((p, part) for p in SOLUTIONS for part in PARTS.get(p.stem, (None,)))]
_runs: dict[tuple, tuple] = {}  # one graded run per lesson (or part), shared by the tests below


def _answers(solution: Path):
    path = wrong_answers_path(solution)
    assert path.is_file(), f"{solution.name} records no wrong answers: write {path.parent.name}/{path.name}"
    return parse(path.read_text(encoding="utf-8"), str(path))


def _run(solution: Path, part: tuple[str, ...] | None = None) -> tuple[list[str], list]:
    if (solution, part) not in _runs:
        _runs[solution, part] = run_wrong_answers(solution, exercises=part)
    return _runs[solution, part]


def _run_id(solution: Path, part: tuple[str, ...] | None) -> str:
    return solution.stem + (f"_part{PARTS[solution.stem].index(part) + 1}" if part else "")


def test_parse_reads_headers_and_rejects_malformed_ones():
    text = "# %% 3.2 | forgets ÷N | expect: divide\ndef f():\n    return 1\n\n# %% 3.2 cell=1 | x | expect: y\npass\n"
    a, b = parse(text)
    assert (a.exercise, a.mistake, a.expect, a.cell, a.source) == ("3.2", "forgets ÷N", "divide", 0,
                                                                   "def f():\n    return 1")
    assert (b.cell, b.line) == (1, 5)
    with pytest.raises(ValueError, match="line 1"):
        parse("# %% 3.2 forgot the bars\nx = 1\n")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_exercise_records_two_wrong_answers(solution):
    nb = nbformat.read(solution, as_version=4)
    exercises = {exercise_of(c) for c in nb.cells if role_of(c) == CHECK}
    answers = _answers(solution)
    counts = {ex: sum(a.exercise == ex for a in answers) for ex in exercises}
    assert all(n >= 2 for n in counts.values()), f"fewer than two wrong answers: {counts}"


def test_a_lesson_without_a_wrong_answers_file_fails(tmp_path):
    (tmp_path / "solutions").mkdir()
    lone = tmp_path / "solutions" / "99_lone.ipynb"
    lone.write_bytes(DEMO.read_bytes())
    assert lessons(tmp_path) == [lone]  # listed like every lesson, not dropped for lacking its file
    with pytest.raises(AssertionError, match="99_lone.ipynb records no wrong answers: write wrong_answers/99_lone.py"):
        test_every_exercise_records_two_wrong_answers(lone)


def test_a_lesson_in_parts_grades_each_exercise_in_exactly_one_part():
    for stem, parts in PARTS.items():
        nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
        exercises = sorted({exercise_of(c) for c in nb.cells if role_of(c) == CHECK})
        assert sorted(ex for part in parts for ex in part) == exercises, f"{stem}'s parts: {parts}"
    with pytest.raises(ValueError, match=r"exercises must name exercises of 00_demo.ipynb \(.*\); got 9.9"):
        run_wrong_answers(DEMO, exercises=("9.9",))


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT + MARGIN_S)
@pytest.mark.parametrize("solution, part", RUNS, ids=[_run_id(*r) for r in RUNS])
def test_wrong_answers_score_zero_with_their_hint(solution, part):
    failures, verdicts = _run(solution, part)
    assert not failures, f"the solution itself does not score full marks: {failures}"
    bad = [(v.answer.exercise, v.answer.mistake, v.message.splitlines()[0] if v.message else "passed")
           for v in verdicts if not (v.scored_zero and v.hint_ok)]
    assert not bad, "wrong answers that scored, or whose failure does not name the mistake: " + repr(bad)


def _sample() -> list[tuple[Path, int]]:
    third = next((p for name in CHEAP for p in SOLUTIONS if p.stem == name), None)
    return [(DEMO, 2), *((p, 0) for p in (ROOT / "solutions" / "00_welcome.ipynb", third) if p in SOLUTIONS)]


@pytest.mark.slow
@pytest.mark.timeout(2 * NOTEBOOK_TIMEOUT + MARGIN_S)  # one answer's graded run, then `m11 grade` of the notebook
@pytest.mark.parametrize("solution, index", _sample(), ids=[f"{p.stem}-{i}" for p, i in _sample()])
def test_one_kernel_verdict_equals_m11_grade_on_the_substituted_notebook(solution, index, tmp_path):
    answer = _answers(solution)[index]
    verdicts = _runs[solution, None][1] if (solution, None) in _runs else run_wrong_answers(solution, [answer])[1]
    verdict = next(v for v in verdicts if v.answer == answer)
    nb = nbformat.read(solution, as_version=4)
    cells = [c for c in nb.cells if role_of(c) == SOLUTION and exercise_of(c) == answer.exercise]
    cells[answer.cell].source = answer.source
    nbformat.write(nb, tmp_path / solution.name)
    graded = grade_notebook(tmp_path / solution.name, solution.parent, cell_timeout=120,
                            notebook_timeout=NOTEBOOK_TIMEOUT)
    result = next(e for e in graded.exercises if e.exercise == answer.exercise)
    assert verdict.scored_zero == (result.points == 0), (verdict, result)
    assert verdict.why.splitlines()[0] == result.why.splitlines()[0], (verdict.why, result.why)


def test_wrong_answers_never_ship(wheel):
    from support.wheel import wheel_file

    for solution in SOLUTIONS:
        shipped = nbformat.read(ROOT / "exercises" / solution.name, as_version=4)
        text = "\n".join(c.source for c in shipped.cells)
        assert "wrong_answers" not in text and "# %%" not in text, solution.name
        leaked = [a.mistake for a in _answers(solution) if len(a.source) > 30 and a.source in text]
        assert not leaked, f"{solution.name}: wrong answers copied into exercises/: {leaked}"
    names = zipfile.ZipFile(wheel_file(wheel)).namelist()
    assert not [n for n in names if n.startswith(("solutions/", "exercises/")) or "wrong_answers/" in n]
