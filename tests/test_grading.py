"""The grading pipeline: checks' messages, exercise generation, and the autograder under abuse.

Fixtures (tests/data/grading/): `solutions/00_demo.ipynb` (2 exercises: 0.1 for 2 points, 0.2 for
3, hidden tests in both checks), the generated `exercises/00_demo.ipynb`, and submissions that get
0.2 wrong (and "fix" its visible test), hang, ignore SIGINT while hanging, kill the kernel, leave a
daemon behind, or print megabytes. Each grading run costs a pytest process and a kernel (~3 s).
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from m11_helpers.grading import checks, exercises, grader
from m11_helpers.tools.notebooks import dumps, from_percent

DATA = Path(__file__).parent / "data" / "grading"
NB = "00_demo.ipynb"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A private copy of the fixtures: graded notebooks may write files next to themselves."""
    shutil.copytree(DATA, tmp_path / "grading")
    return tmp_path / "grading"


def _grade(work: Path, *args: str) -> tuple[int, dict]:
    out = work / "reports"
    rc = grader.main([*args, "--source", str(work / "solutions"), "--out", str(out)])
    data = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return rc, data


def _scores(data: dict) -> dict[str, float]:
    return {e["exercise"]: e["points"] for e in data["notebooks"][0]["exercises"]}


# ---------------------------------------------------------------- checks

def test_expect_close_message_names_exercise_expected_got_hint() -> None:
    with pytest.raises(AssertionError) as err:
        checks.expect_close([3.0, 3.0], [1.5, 1.5], "avg", exercise="0.2", hint="divide by the world size?")
    lines = str(err.value).splitlines()
    assert lines[0] == "Exercise 0.2: avg[0] is wrong."
    assert lines[1:] == ["  expected: [1.5, 1.5]", "  got:      [3.0, 3.0]", "  hint: divide by the world size?"]


def test_expect_close_reports_shape_none_and_stub() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(AssertionError, match=r"shape \(3,\), expected \(2,\)"):
        checks.expect_close(np.ones(3), np.ones(2), "x", exercise="1.1")
    with pytest.raises(AssertionError, match="forget to `return`"):
        checks.expect_close(None, 1.0, "x", exercise="1.1")
    with pytest.raises(AssertionError, match="not implemented yet"):
        checks.expect_close(NotImplemented, 1.0, "x", exercise="1.1")
    with pytest.raises(AssertionError, match="^Exercise 1.1: not implemented yet"):
        with checks.checking("1.1"):
            raise NotImplementedError("Exercise 1.1: not implemented yet")
    checks.expect_close([1, [2.0, 3.0]], (1, (2.0, 3.0 + 1e-9)), "nested", exercise="1.1")


def test_expect_equal_true_and_passed(capsys: pytest.CaptureFixture) -> None:
    checks.expect_equal([1, 2], [1, 2], "xs", exercise="1.2")
    with pytest.raises(AssertionError, match="xs is wrong"):
        checks.expect_equal(3, 4, "xs", exercise="1.2")
    with pytest.raises(AssertionError, match="expected the loss to go down"):
        checks.expect_true(False, "the loss to go down", exercise="1.2")
    checks.passed("0.2", points=2)
    assert capsys.readouterr().out == "✔ Exercise 0.2 passed (2 points)\n"


# ---------------------------------------------------------------- make-exercises

def test_generated_exercise_matches_committed_and_hides_answers() -> None:
    solution = nbformat.read(DATA / "solutions" / NB, as_version=4)
    generated = exercises.make_exercise(solution, NB)
    assert dumps(generated) == (DATA / "exercises" / NB).read_text()
    text = "\n".join(c.source for c in generated.cells)
    assert "sum(xs) / len(xs)" not in text and "HIDDEN" not in text and "mean([5.0])" not in text
    assert '    raise NotImplementedError("Exercise 0.1: not implemented yet")' in text
    assert "YOUR ANSWER HERE" in text
    kept = [c for c in generated.cells if c.cell_type == "code" and c.outputs]
    assert [c.source.splitlines()[0] for c in kept] == ["# NBVAL_CHECK_OUTPUT"]


def test_make_exercises_is_idempotent_and_check_detects_drift(work: Path, capsys) -> None:
    args = ["--source", str(work / "solutions"), "--dest", str(work / "exercises")]
    assert exercises.main(args + ["--check"]) == 0
    assert exercises.main(args) == 0 and exercises.main(args + ["--check"]) == 0
    before = (work / "exercises" / NB).read_text()
    (work / "exercises" / NB).write_text(before.replace("Exercise 0.1: the mean", "edited by hand"))
    assert exercises.main(args + ["--check"]) == 1
    assert NB in capsys.readouterr().out
    assert exercises.main(args) == 0 and (work / "exercises" / NB).read_text() == before


@pytest.mark.parametrize("source, meta, expected", [
    ("### BEGIN SOLUTION\nx = 1", {"exercise": "9.1", "role": "solution"}, "never closed"),
    ("x = 1\n### END SOLUTION", {"exercise": "9.1", "role": "solution"}, "without a '### BEGIN SOLUTION'"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", {}, "no exercise id"),
    ("x = 1", {"exercise": "9.1", "role": "check"}, "points=None"),
    ("### BEGIN HIDDEN TESTS\nassert x\n### END HIDDEN TESTS", {}, "outside a check cell"),
])
def test_marker_validation_names_notebook_cell_and_fix(source: str, meta: dict, expected: str) -> None:
    text = ('# %% m11={"exercise": "9.0", "role": "solution"}\n### BEGIN SOLUTION\ny = 0\n### END SOLUTION\n'
            f"# %% m11={json.dumps(meta)}\n{source}\n")
    with pytest.raises(exercises.ExerciseError, match=expected) as err:
        exercises.make_exercise(from_percent(text), "bad.ipynb")
    assert str(err.value).startswith("bad.ipynb: cell 1: ")


def test_duplicate_exercise_ids_are_rejected() -> None:
    cell = '# %% m11={"exercise": "9.1", "role": "solution"}\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n'
    with pytest.raises(exercises.ExerciseError, match="cell 1: exercise id 9.1 is already used by cell 0"):
        exercises.validate(from_percent(cell + cell), "dup.ipynb")


# ---------------------------------------------------------------- the grader

def test_prepare_restores_edited_and_deleted_checks() -> None:
    solution = nbformat.read(DATA / "solutions" / NB, as_version=4)
    learner = nbformat.read(DATA / "submissions" / "wrong" / NB, as_version=4)
    learner.cells = [c for c in learner.cells if c.metadata.get("m11", {}).get("role") != "check"
                     or c.metadata["m11"]["exercise"] != "0.1"]  # deleted the 0.1 test
    graded, plans = grader.prepare(learner, solution)
    assert [(p.exercise, p.max_points) for p in plans] == [("0.1", 2.0), ("0.2", 3.0)]
    for plan in plans:
        (check,) = plan.checks
        assert "### BEGIN HIDDEN TESTS" in graded.cells[check].source
        assert plan.solutions and plan.solutions[0] < check


def test_class_solution_full_marks_wrong_partial(work: Path) -> None:
    for student, folder in [("ada", work / "solutions"), ("bob", work / "submissions" / "wrong")]:
        (work / "class" / student).mkdir(parents=True)
        shutil.copy(folder / NB, work / "class" / student / NB)
    rc = grader.main(["--class", str(work / "class"), "--source", str(work / "solutions"),
                      "--out", str(work / "reports"), "--cell-timeout", "20"])
    assert rc == 0
    rows = list(csv.DictReader(open(work / "reports" / "class.csv")))
    assert [(r["student"], r["notebook"], r["score"], r["max"]) for r in rows] == [
        ("ada", NB, "5", "5"), ("bob", NB, "2", "5")]  # bob's "fixed" visible test was restored
    bob = (work / "reports" / "bob" / "report.md").read_text()
    assert "| 0.2 | 0 | 3 | failed | Exercise 0.2: avg[0] is wrong.; expected: [2.0, 3.0]" in bob
    assert "did you divide by the world size?" in bob


def test_exercise_scores_zero_runs_to_the_end_and_writes_reports(work: Path) -> None:
    rc, data = _grade(work, str(work / "exercises"), "--min-score", "50", "--cell-timeout", "20")
    assert rc == 1  # 0 % < 50 %
    assert _scores(data) == {"0.1": 0, "0.2": 0}
    assert all("not implemented yet" in e["why"] for e in data["notebooks"][0]["exercises"])
    junit = (work / "reports" / "junit.xml").read_text()
    assert junit.count("<testcase") == 2 and junit.count("<failure") == 2
    assert "| exercise | points | max | status | why |" in (work / "reports" / "report.md").read_text()


@pytest.mark.parametrize("variant", ["hang", "sigint"])
def test_hanging_cell_is_stopped_and_the_rest_graded(work: Path, variant: str) -> None:
    start = time.monotonic()
    rc, data = _grade(work, str(work / "submissions" / variant), "--cell-timeout", "3",
                      "--notebook-timeout", "60")
    assert rc == 0 and _scores(data) == {"0.1": 0, "0.2": 3}
    assert "Timeout of 3 seconds" in data["notebooks"][0]["exercises"][0]["why"]
    assert time.monotonic() - start < 60


def test_kernel_killer_is_graded_past_its_death(work: Path) -> None:
    rc, data = _grade(work, str(work / "submissions" / "kill_exit"), "--cell-timeout", "20",
                      "--notebook-timeout", "60")
    assert _scores(data) == {"0.1": 0, "0.2": 3}
    assert "kernel died" in data["notebooks"][0]["exercises"][0]["why"]


def test_daemons_and_children_are_killed(work: Path) -> None:
    folder = work / "submissions" / "daemon"
    rc, data = _grade(work, str(folder), "--cell-timeout", "20")
    assert _scores(data) == {"0.1": 2, "0.2": 3}
    for name in ("daemon.pid", "child.pid"):
        pid = int((folder / name).read_text())  # written by the notebook, in its own folder
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"{name}: process {pid} survived grading"


def test_megabyte_printer_is_graded_and_truncated(work: Path) -> None:
    rc, data = _grade(work, str(work / "submissions" / "printer"), "--cell-timeout", "20")
    assert _scores(data) == {"0.1": 2, "0.2": 0}
    assert (work / "reports" / "report.json").stat().st_size < 50_000


def test_bad_arguments_exit_2(work: Path, capsys) -> None:
    assert grader.main([]) == 2
    assert grader.main([str(work / "missing")]) == 2
    assert grader.main([str(work / "exercises"), "--min-score", "150"]) == 2
    assert "allowed 0..100" in capsys.readouterr().err


def test_reports_are_written_from_the_result_types(tmp_path: Path) -> None:
    from m11_helpers.grading import plugin, report
    from m11_helpers.grading.results import ExerciseResult, NotebookResult

    res = NotebookResult("00_demo.ipynb", [ExerciseResult("0.1", 2, 2, "passed"),
                                           ExerciseResult("0.2", 0, 3, "failed", "Exercise 0.2: wrong\n  hint: x")])
    assert (res.score, res.max_score) == (2, 5)
    report.write_reports([res], tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert (data["score"], data["max_score"]) == (2, 5)
    assert data["notebooks"][0]["exercises"][1]["why"].startswith("Exercise 0.2")
    assert "0.2" in (tmp_path / "report.md").read_text()
    assert plugin.LOG_ENV == "M11_GRADE_LOG"  # the grader and its plugin agree on where records go
