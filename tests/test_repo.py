"""The course's structure: every lesson in its four places, on the README, with the checklist's parts."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from m11_helpers.tools.setup_cell import readme_row, setup_cell_source

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.stem for p in (ROOT / "course").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_lessons():
    assert "00_welcome" in LESSONS


@pytest.mark.parametrize("stem", LESSONS)
def test_lesson_has_solutions_exercises_and_a_readme_row(stem):
    assert (ROOT / "solutions" / f"{stem}.ipynb").exists(), "every lesson has graded exercises"
    assert (ROOT / "exercises" / f"{stem}.ipynb").exists(), "run `m11 make-exercises`"
    readme = (ROOT / "README.md").read_text()
    row = next((line for line in readme.splitlines() if line.startswith(f"| {stem[:2]} | ")), None)
    assert row, f"the README's lesson table has no row for {stem}"
    title = re.match(r"\| \d\d \| \[(.+?)\]\(", row)[1]
    assert row == readme_row(stem[:2], stem[3:], title), "README rows come from m11_helpers.tools.setup_cell.readme_row"


@pytest.mark.parametrize("folder", ["course", "solutions", "exercises"])
def test_every_notebook_starts_with_the_same_setup_cell(folder):
    for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
        code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert code[0] == setup_cell_source(), f"{folder}/{path.name}: the setup cell differs"


@pytest.mark.parametrize("stem", LESSONS)
def test_lesson_follows_the_checklist(stem):
    nb = nbformat.read(ROOT / "course" / f"{stem}.ipynb", as_version=4)
    missing = [i for i, c in enumerate(nb.cells) if "slide_type" not in c.metadata.get("slideshow", {})]
    assert not missing, f"cells without slideshow metadata: {missing}"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), "title first"
    assert "You will be able to" in nb.cells[0].source or "you will be able to" in nb.cells[0].source
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert code[0] == setup_cell_source(), "the first code cell is the setup cell (m11_helpers.tools.setup_cell)"
    text = "\n".join(c.source for c in nb.cells)
    assert "quiz(" in text, "a four-question quiz"
    assert "takeaways" in text.lower(), "key takeaways"
    assert any(c.metadata["slideshow"]["slide_type"] == "notes" for c in nb.cells), "speaker notes"
    # the checklist's "no code cell over about 25 lines": counted without blank and nbval marker lines
    long = {i: n for i, c in enumerate(nb.cells) if c.cell_type == "code" and "quiz(" not in c.source
            and (n := sum(bool(ln.strip()) and not ln.startswith("# NBVAL") for ln in c.source.splitlines())) > 25}
    assert not long, f"code cells over 25 lines (cell: lines); move the code into a helper: {long}"


def test_refresh_rewrites_an_old_setup_cell_and_nothing_else(tmp_path):
    from m11_helpers.tools.notebooks import dumps
    from m11_helpers.tools.setup_refresh import refresh_notebooks

    src = ROOT / "course" / f"{LESSONS[0]}.ipynb"
    nb = nbformat.read(src, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    first.source = setup_cell_source("0.0.1")  # the cell of an older release
    old, current = tmp_path / "old.ipynb", tmp_path / "current.ipynb"
    old.write_text(dumps(nb), encoding="utf-8")
    current.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    assert refresh_notebooks([old, current]) == [old]
    assert old.read_text(encoding="utf-8") == src.read_text(encoding="utf-8")  # only the setup cell changed


def test_scheduler_units_go_costliest_first_and_keep_each_units_order(tmp_path, monkeypatch):
    from support import units
    from support.units import cost_order, record, unit_of, unit_seconds

    wa = "tests/test_wrong_answers.py::test_{}[{}]"
    assert unit_of(wa.format("wrong_answers_score_zero_with_their_hint", "11_capstone")) == \
        unit_of(wa.format("one_kernel_verdict", "11_capstone-0")) == "tests/test_wrong_answers.py::11_capstone"
    assert unit_of("course/04_model_parallel.ipynb::Cell 3") == unit_of("tests/test_browser.py::test_x") == "course"
    ids = ["tests/test_a.py::t1", "tests/test_b.py::t1", "tests/test_a.py::t2", "tests/test_c.py::t1",
           "tests/test_c.py::t2", "tests/test_c.py::t3"]
    seconds = {"tests/test_b.py::t1": 90.0, "tests/test_a.py::t1": 3.0, "tests/test_a.py::t2": 2.0}
    ordered = sorted(ids, key=cost_order(ids, seconds))
    # b (90 s), a (5 s), then c (no seconds recorded) by its number of tests; each unit's tests in file order
    assert ordered == ["tests/test_b.py::t1", "tests/test_a.py::t1", "tests/test_a.py::t2",
                       "tests/test_c.py::t1", "tests/test_c.py::t2", "tests/test_c.py::t3"]
    # a slice of a unit (one lesson's notebook of the course) is priced by the tests selected, not the unit's total
    course = {f"course/{n:02d}_x.ipynb::Cell 0": 30.0 for n in range(13)}
    lesson = ["course/04_x.ipynb::Cell 0", "tests/test_wrong_answers.py::test_w[04_x]"]
    priced = {**course, lesson[1]: 40.0}
    assert sorted(lesson, key=cost_order(lesson, priced)) == lesson[::-1]  # the 40 s run before the 30 s notebook
    assert sorted([*course, lesson[1]], key=cost_order([*course, lesson[1]], priced))[-1] == lesson[1]  # all 390 s
    # a run's seconds replace those of the tests it ran; the others' stay; quick ones are not kept
    monkeypatch.setattr(units, "MEASURED", tmp_path / "m.json")
    monkeypatch.setattr(units, "COMMITTED", tmp_path / "c.json")
    (tmp_path / "c.json").write_text(json.dumps(priced))
    record({lesson[0]: 25.0, "tests/test_a.py::t1": 0.01}, tmp_path / "m.json")
    assert units.known_seconds() == {**priced, lesson[0]: 25.0}
    # a lesson's wrong-answer run and its sample check are one unit's seconds, the course with its deck tests
    assert unit_seconds({wa.format("a", "11_capstone"): 60.0, wa.format("b", "11_capstone-0"): 1.5,
                         "course/00_welcome.ipynb::Cell 0": 2.0, "tests/test_browser.py::test_x": 3.0}) == \
        {"tests/test_wrong_answers.py::11_capstone": 61.5, "course": 5.0}
