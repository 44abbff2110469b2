"""The grading pipeline: checks' messages, exercise generation, and the autograder under abuse.

Fixtures (tests/data/grading/): `solutions/00_demo.ipynb` (2 exercises: 0.1 for 2 points, 0.2 for
3, hidden tests in both checks), the generated `exercises/00_demo.ipynb`, and submissions that get
0.2 wrong (and "fix" its visible test), hang, ignore SIGINT while hanging, kill the kernel, leave a
daemon behind, print megabytes, or keep `launch` ranks running (`ranks`: the termination tests).
`tamper_source/01_tamper.ipynb` has 21 one-line exercises and `submissions/tamper/` cheats on 20 of
them, one trick each (graded once, checked case by case). Each grading run costs a pytest process
and a kernel (~3 s quiet; the tamper run imports torch and launches ranks, ~10 s).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest

from m11_helpers.grading import checks, plain, runenv
from m11_helpers.grading.authoring import exercises
from m11_helpers.grading.cells import CHECK, exercise_of, role_of
from m11_helpers.grading.classroom import command
from m11_helpers.grading.engine import grader
from m11_helpers.grading.engine.runner import RUN_ENV
from m11_helpers.grading.guard.driver import defined_names, free_names, library_roots
from m11_helpers.grading.guard.quiet import STALL_S
from m11_helpers.procs import subreaper
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
    rc = command.main([*args, "--source", str(work / "solutions"), "--out", str(out)])
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


class _Anything(int):  # the trick that scored 1/1 on lesson 01: a class that claims to be a builtin
    __module__ = "builtins"
    __hash__ = int.__hash__

    def __eq__(self, other):
        return True


def test_a_class_that_claims_a_library_module_is_compared_by_its_value_or_refused() -> None:
    with pytest.raises(AssertionError, match=r"f\(3\) is wrong") as err:
        checks.expect_equal(_Anything(5), 6, "f(3)", exercise="1.1")  # its int value, 5, compared by int
    assert "got:      5" in str(err.value)
    cheat = type("Cheat", (), {"__module__": "torch", "__eq__": lambda s, o: True, "__hash__": object.__hash__})
    with pytest.raises(AssertionError, match="instance of Cheat, not a plain value") as err:
        checks.expect_equal(cheat(), 6, "f(3)", exercise="1.1")
    assert "<a Cheat object>" in str(err.value)  # its own __repr__ is never called
    with pytest.raises(AssertionError, match=r"xs\[1\] is wrong"):
        checks.expect_equal([6, _Anything(0)], [6, 7], "xs", exercise="1.1")
    with pytest.raises(AssertionError, match=r"d\['a'\] is wrong"):
        checks.expect_close(type("D", (dict,), {"__eq__": lambda s, o: True})(a=_Anything(1)), {"a": 2.0}, "d",
                            exercise="1.1")
    with pytest.raises(AssertionError, match="expected it to hold"):
        checks.expect_true(type("T", (int,), {"__bool__": lambda s: True})(0), "it to hold", exercise="1.1")
    checks.expect_equal(_Anything(6), 6, "f(3)", exercise="1.1")  # the right value still passes


def test_plain_values_come_from_the_base_types_own_code() -> None:
    import collections
    import enum

    Point = collections.namedtuple("Point", "x y")
    Level = enum.IntEnum("Level", "LOW HIGH")
    got = plain.plain({"p": Point(1, 2), "lvl": Level.HIGH, "xs": [_Anything(3)]}, {}, "v")
    assert got == {"p": (1, 2), "lvl": 2, "xs": [3]}
    assert [type(v) for v in (got["p"], got["lvl"], got["xs"][0])] == [tuple, int, int]
    with pytest.raises(plain.Foreign, match="v is an instance of Cheat, not a plain value"):
        plain.plain(type("Cheat", (), {"__module__": "builtins"})(), 1, "v")


def test_a_tensor_that_answers_allclose_itself_is_compared_by_its_values() -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    class Sneaky(torch.Tensor):
        __module__ = "torch"

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.allclose, torch.Tensor.detach, torch.Tensor.to):
                return True if func is torch.allclose else torch.ones(2)
            return super().__torch_function__(func, types, args, kwargs or {})

    with pytest.raises(AssertionError, match="f is wrong"):
        checks.expect_close(torch.zeros(2).as_subclass(Sneaky), torch.ones(2), "f", exercise="1.1")

    class Always(TorchFunctionMode):  # a mode left on answers every torch.allclose, whatever the tensors
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return True if func is torch.allclose else func(*args, **(kwargs or {}))

    mode = Always()
    mode.__enter__()
    try:
        assert torch.allclose(torch.zeros(2), torch.ones(2))
        with pytest.raises(AssertionError, match="f is wrong"):
            checks.expect_close(torch.zeros(2), torch.ones(2), "f", exercise="1.1")
    finally:
        mode.__exit__(None, None, None)
    checks.expect_close(torch.nn.Parameter(torch.ones(2)), torch.ones(2), "a Parameter", exercise="1.1")
    np = pytest.importorskip("numpy")
    with pytest.raises(AssertionError, match="an array of Python objects"):
        checks.expect_close(np.array([_Anything(0)], dtype=object), np.array([1.0]), "a", exercise="1.1")
    checks.expect_close([np.float64(1.5), np.int64(2)], (1.5, 2), "numpy scalars", exercise="1.1")


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
    learner.cells = [c for c in learner.cells if role_of(c) != CHECK or exercise_of(c) != "0.1"]  # deleted the 0.1 test
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
    rc = command.main(["--class", str(work / "class"), "--source", str(work / "solutions"),
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
    rc, data = _grade(work, str(work / "submissions" / variant), "--cell-timeout", "3",
                      "--notebook-timeout", "600")
    assert rc == 0 and _scores(data) == {"0.1": 0, "0.2": 3}
    # the cell timeout stopped it (not the notebook's limit, which would leave 0.2 ungraded and say so)
    assert "Timeout of 3 seconds" in data["notebooks"][0]["exercises"][0]["why"]
    assert not any("wall-clock limit" in n for n in data["notebooks"][0]["notes"])


def test_a_kernel_that_stops_answering_is_stopped_and_the_rest_graded(work: Path) -> None:
    """`submissions/frozen`: 0.1's answer is right but sets `builtins.isinstance = None`, after which the kernel
    answers nothing (not the cell, not the guard, not a kernel_info); 0.2 is right. With the default limits (a
    120 s cell timeout, 900 s per notebook) the grader notices the silence, stops that kernel and grades the
    rest in a fresh one, well within a minute, naming why 0.1 scored 0; nothing is left running."""
    start = time.monotonic()
    rc, data = _grade(work, str(work / "submissions" / "frozen"))
    assert time.monotonic() - start < 60
    assert rc == 0 and _scores(data) == {"0.1": 0, "0.2": 3}
    why = data["notebooks"][0]["exercises"][0]["why"]
    assert "the kernel stopped answering after" in why, why
    assert int(why.split("after ")[1].split(" s")[0]) >= STALL_S  # silent that long, not merely slow
    assert not psutil.Process().children(recursive=True)


def test_a_guard_call_the_kernel_never_answers_ends_once_its_control_channel_is_silent(monkeypatch) -> None:
    """The other way a broken kernel shows: the cell answered, the guard's request does not. The guard asks the
    kernel's control channel while it waits and gives up once that is silent too (STALL_S, shortened here),
    long before its own 60 s timeout; the plugin then stops the kernel (`_stop_if_stalled`)."""
    from queue import Empty

    from m11_helpers.grading.guard import quiet
    from m11_helpers.grading.guard.driver import Guard

    class Mute:  # a kernel client whose kernel takes requests and never replies
        def execute(self, *a, **k):
            return "request"

        def get_shell_msg(self, timeout):
            time.sleep(timeout)
            raise Empty

    monkeypatch.setattr(quiet, "PROBE_S", 0.1)
    monkeypatch.setattr(quiet, "STALL_S", 0.5)
    guard = Guard(Mute())
    guard.state, guard.answering = 1, lambda: False
    start = time.monotonic()
    report = guard.after("1.1")
    assert time.monotonic() - start < 10 and guard.stalled
    assert report.error.startswith("the kernel stopped answering the guard after"), report
    guard.answering, guard.stalled = lambda: True, False  # a busy kernel that still answers: the guard waits on
    guard.timeout = 2.0
    assert "did not answer the grader's guard within 2 s" in guard.after("1.1").error and not guard.stalled


def test_kernel_killer_is_graded_past_its_death(work: Path) -> None:
    rc, data = _grade(work, str(work / "submissions" / "kill_exit"), "--cell-timeout", "20",
                      "--notebook-timeout", "60")
    assert _scores(data) == {"0.1": 0, "0.2": 3}
    assert "kernel died" in data["notebooks"][0]["exercises"][0]["why"]


def test_daemons_and_children_are_killed_and_installed_pytest_plugins_stay_out(work: Path, monkeypatch) -> None:
    # unsandboxed: the grader's own cleanup (subreaper + kill), not bubblewrap's pid namespace, is under test,
    # and the notebook writes its pid files into its own folder rather than the sandbox's private copy
    monkeypatch.setenv("M11_GRADE_SANDBOX", "off")
    # an installed pytest plugin that reverses the order of items, as pytest-randomly shuffles it: it would run
    # each notebook's check cells before its solutions, if the grader's pytest loaded it
    plugins = work / "site"
    (plugins / "m11_reverse_probe-0.dist-info").mkdir(parents=True)
    (plugins / "m11_reverse_probe-0.dist-info" / "METADATA").write_text("Name: m11-reverse-probe\nVersion: 0\n")
    (plugins / "m11_reverse_probe-0.dist-info" / "entry_points.txt").write_text("[pytest11]\nreverse = m11_reverse_probe\n")
    (plugins / "m11_reverse_probe.py").write_text("def pytest_collection_modifyitems(items):\n    items.reverse()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")])))
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
    assert command.main([]) == 2
    assert command.main([str(work / "missing")]) == 2
    assert command.main([str(work / "exercises"), "--min-score", "150"]) == 2
    assert "allowed 0..100" in capsys.readouterr().err


def test_reports_are_written_from_the_result_types(tmp_path: Path) -> None:
    from m11_helpers.grading.engine import plugin, report
    from m11_helpers.grading.engine.results import ExerciseResult, NotebookResult

    res = NotebookResult("00_demo.ipynb", [ExerciseResult("0.1", 2, 2, "passed"),
                                           ExerciseResult("0.2", 0, 3, "failed", "Exercise 0.2: wrong\n  hint: x")])
    assert (res.score, res.max_score) == (2, 5)
    report.write_reports([res], tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert (data["score"], data["max_score"]) == (2, 5)
    assert data["notebooks"][0]["exercises"][1]["why"].startswith("Exercise 0.2")
    assert "0.2" in (tmp_path / "report.md").read_text()
    # the grader, its plugin and the sandbox agree on where records go, through a module that imports no pytest
    assert plugin.LOG_ENV == runenv.LOG_ENV == "M11_GRADE_LOG" and plugin.CWD_ENV == runenv.CWD_ENV


# ---------------------------------------------------------------- tampering (one graded run, case by case)

# exercise -> (points, what the report's tampering must say; None: a plain failure, nothing flagged)
TAMPER_CASES = {
    "1.1": (1, None),  # honest and right: full marks, nothing flagged
    "1.2": (0, "the name expect_equal was rebound in the notebook"),
    "1.3": (0, "m11_helpers.grading.checks was patched (expect_equal, passed)"),
    "1.4": (0, "m11_helpers.launch was patched (launch)"),
    "1.5": (0, None),  # a printed pass line earns nothing: the grader scores cell outcomes
    "1.6": (0, "a custom exception handler was installed (set_custom_exc)"),
    "1.7": (0, "shell.input_transformer_manager.cleanup_transforms holds code from the notebook"),
    "1.8": (0, "shell.ast_transformers holds code from the notebook"),
    "1.9": (0, "shell.events.callbacks holds code from the notebook"),
    "1.10": (0, "a trace or profile function (sys.settrace/sys.setprofile) was left installed"),
    "1.11": (0, "builtins.abs was replaced"),
    "1.12": (0, "on_ranks, which the course defines, was redefined in the notebook"),
    "1.13": (0, None),  # an edited course cell: the course's version ran after it; the wrong answer just fails
    "1.14": (0, None),  # an int subclass claiming `__module__ = "builtins"`: compared as the int it is
    "1.15": (0, None),  # a tensor subclass claiming `__module__ = "torch"` that answers allclose: its values
    "1.16": (0, None),  # a torch function mode left on that answers allclose: off while checks compare
    "1.17": (0, "the name expect_equal was rebound in the notebook"),  # its `exec` no longer forges the guard
    "1.18": (0, "torch.allclose was replaced by code from the notebook"),
    "1.20": (0, "the notebook's __builtins__ was replaced"),  # by a dict that claims to equal the real one
    "1.21": (0, "torch.allclose was replaced by code from the notebook"),  # a class that says it is functools.partial
    "1.19": (0, "the grader's guard could not check this cell"),  # right answer, guard's exec swapped: fails closed
}
TAMPER_WHY = {"1.14": "Exercise 1.14: f14(3) is wrong.", "1.15": "Exercise 1.15: f15(ones) is wrong.",
              "1.16": "Exercise 1.16: f16(ones) is wrong."}  # plain failures, as the learner reads them


@pytest.fixture(scope="module")
def tampered(tmp_path_factory) -> tuple[dict, Path]:
    """`m11 grade` of the tamper submission against its source, once for every case below."""
    work = tmp_path_factory.mktemp("tamper")
    shutil.copytree(DATA / "submissions" / "tamper", work / "submission")
    out = work / "reports"
    command.main([str(work / "submission"), "--source", str(DATA / "tamper_source"), "--out", str(out),
                 "--cell-timeout", "60"])
    return json.loads((out / "report.json").read_text()), out


@pytest.mark.parametrize("exercise", list(TAMPER_CASES))
def test_tampering_scores_zero_and_is_named(tampered, exercise: str) -> None:
    data, _ = tampered
    result = {e["exercise"]: e for e in data["notebooks"][0]["exercises"]}[exercise]
    points, flag = TAMPER_CASES[exercise]
    assert result["points"] == points, result
    if flag is None:
        assert result["tampering"] == [], result
        assert result["why"].startswith(TAMPER_WHY.get(exercise, "")), result
    else:
        assert any(flag in t for t in result["tampering"]), result["tampering"]
        assert result["why"].startswith("tampering: ")


def test_tampering_is_flagged_in_every_report(tampered) -> None:
    data, out = tampered
    flagged = [e["exercise"] for e in data["notebooks"][0]["exercises"] if e["tampering"]]
    assert flagged == [ex for ex, (_, flag) in TAMPER_CASES.items() if flag]
    assert "m11_helpers.grading.observe was patched (record_comm)" in str(data)  # 1.3 patched observe too
    md = (out / "report.md").read_text()
    assert all(f"TAMPERING in exercise {ex} (scored 0)" in md for ex in flagged)
    assert (out / "junit.xml").read_text().count('type="tampering"') == len(flagged)


def test_guard_code_imports_cleanly_and_is_what_the_kernel_gets() -> None:
    from m11_helpers.grading.guard import driver as guard
    from m11_helpers.grading.guard import kernel as guard_kernel
    from m11_helpers.grading.guard import ledger as guard_ledger

    assert guard_kernel.A == {} and not hasattr(guard_ledger, "OUT")  # imported, it runs nothing
    parts = guard.Guard(None).parts
    assert parts == tuple(Path(m.__file__).read_text(encoding="utf-8") for m in (guard_kernel, guard_ledger))
    for text in parts:
        compile(text, "<m11-guard>", "exec")


def test_the_guard_verifies_every_module_added_to_the_launcher_or_the_check_cell_api(tmp_path, monkeypatch) -> None:
    """`VERIFIED` is derived from the files on disk (guard/driver.py): today's launcher modules the old hand-written
    list missed are in, a module a contributor adds tomorrow is in with what it imports, and an in-kernel
    `_verify` of one of them finds and undoes a patch."""
    from m11_helpers.grading.guard import driver, ledger
    from m11_helpers.grading.guard import kernel as gk
    from m11_helpers.launch import watch

    assert {"m11_helpers.launch.watch", "m11_helpers.launch.results", "m11_helpers.grading.faults",
            "m11_helpers.procs"} <= set(driver.VERIFIED)
    package = Path(driver.__file__).resolve().parents[2]  # a copy of the package with one launcher module more
    tree = tmp_path / "m11_helpers"
    tree.mkdir()
    for entry in package.iterdir():
        if entry.name not in ("launch", "grading"):
            (tree / entry.name).symlink_to(entry)
    shutil.copytree(package / "launch", tree / "launch")
    (tree / "grading").mkdir()
    for f in (package / "grading").glob("*.py"):
        (tree / "grading" / f.name).symlink_to(f)
    (tree / "launch" / "elastic.py").write_text("from m11_helpers.tether import tethered\n__all__ = ['grow']\n")
    (tree / "grading" / "hints.py").write_text('"""a new check-cell module"""\n')
    monkeypatch.setattr(driver, "_PACKAGE", tree)
    found = driver.verified_modules()
    assert {"m11_helpers.launch.elastic", "m11_helpers.grading.hints", "m11_helpers.tether"} <= set(found)
    assert "m11_helpers.launch.elastic" in driver.kernel_facing_modules()
    real = watch.collect
    monkeypatch.setattr(watch, "collect", lambda *a, **k: [])  # a notebook's stand-in for the rank watcher
    gk.FOUND.clear()
    ledger._verify("m11_helpers.launch.watch", Path(watch.__file__).read_text(encoding="utf-8"))
    assert gk.FOUND == ["m11_helpers.launch.watch was patched (collect)"]
    assert watch.collect.__code__ == real.__code__  # put back from the installed source
    gk.FOUND.clear()


def test_the_module_scan_finds_notebook_code_wherever_its_shortcuts_pass_by(monkeypatch) -> None:
    """The scan passes plain values, library functions and instances of classes it already judged without
    `_origin` (guard/kernel.py, `_NO_CODE`, `_known`). Notebook code planted behind each shortcut, one plant
    at a time and then all together, is found and named (also inside a class the module defines: a method, an
    instance of a notebook class, a partial), also when a metaclass claims its class is `str` and when the
    `types` module's names were rebound; the plain values and library code beside it are not."""
    import functools
    import json as library  # a library module: its functions' files lie in the interpreter's folders
    import types

    from m11_helpers.grading.guard import kernel as gk

    notebook = {"ModuleType": types.ModuleType}  # code compiled as IPython compiles a cell
    exec(compile("def planted(x):\n    return x\nclass Mine:\n    def go(self):\n        return 1\n"
                 "class Mod(ModuleType):\n    def hi(self):\n        return 2\n"
                 "class Liar(type):  # says it is str: equal, same hash\n"
                 "    __eq__ = lambda cls, other: True\n    __hash__ = lambda cls: hash(str)\n"
                 "class Posing(metaclass=Liar):\n    def __call__(self, *a):\n        return True\n"
                 "class partial:  # says it is functools.partial, of a library function\n"
                 "    __module__, func = 'functools', len\n    def __call__(self, *a):\n        return True\n",
                 "/tmp/ipykernel_1/123.py", "exec"), notebook)
    swapped = types.FunctionType(library.dumps.__code__, {})  # a library function ...
    swapped.__code__ = notebook["planted"].__code__  # ... whose code the notebook swapped in place
    other = types.ModuleType("m11_scan_probe_other")
    other.__class__ = notebook["Mod"]  # a module whose class was reassigned: not a plain module any more
    plants = {"Mine": notebook["Mine"], "a_mine": notebook["Mine"](), "b_mine": notebook["Mine"](), "swapped": swapped,
              "part": functools.partial(notebook["planted"], 1), "prop_holder": property(notebook["planted"]),
              "other": other, "bound": notebook["Mine"]().go, "posing": notebook["Posing"](), "impostor": notebook["partial"](),
              "Lib": type("Lib", (), {"__module__": "m11_scan_probe", "bad": staticmethod(notebook["planted"])}),
              "Held": type("Held", (), {"__module__": "elsewhere", "bad": notebook["planted"]}),  # found, not own
              # inside a class the module defines: a function, an instance of a notebook class, a partial
              "LibFn": type("LibFn", (), {"__module__": "m11_scan_probe", "bad": notebook["planted"]}),
              "LibObj": type("LibObj", (), {"__module__": "m11_scan_probe", "bad": notebook["Mine"]()}),
              "LibPart": type("LibPart", (), {"__module__": "m11_scan_probe",
                                              "bad": functools.partial(notebook["planted"])})}
    names = {"Lib": "Lib.bad", "LibFn": "LibFn.bad", "LibObj": "LibObj.bad", "LibPart": "LibPart.bad"}
    mod = types.ModuleType("m11_scan_probe")
    mod.__file__ = library.__file__  # it claims to be library code
    lib_class = type("Lib", (), {"__module__": "m11_scan_probe", "ok": library.dumps, "n": 3, "p": property(len)})
    mod.__dict__.update(plain_int=1, plain_str="s", plain_list=[notebook["planted"]], lib_fn=library.dumps,
                        LibOk=lib_class, lib_obj=lib_class(), decoder=library.JSONDecoder())
    # the kernel's sys.modules, as the guard reads it: a library, the probe, IPython with the notebook's namespace
    fake_sys = types.SimpleNamespace(modules={"json": library, "m11_scan_probe": mod, "IPython": types.SimpleNamespace(
        get_ipython=lambda: types.SimpleNamespace(user_ns={}))})
    monkeypatch.setattr(gk, "sys", fake_sys)
    monkeypatch.setattr(gk, "ROOTS", tuple(library_roots()))
    monkeypatch.setattr(types, "FunctionType", int)  # the notebook rebinds the `types` module's names: the guard
    monkeypatch.setattr(types, "ModuleType", int)  # takes its types from objects of its own (guard/kernel.py)

    def scan() -> set[str]:
        for cache in (gk.FOUND, gk._files, gk._types):  # one guard call's state (the kernel runs it afresh)
            cache.clear()
        gk.scan_modules()
        return {f.split(" was replaced")[0] for f in gk.FOUND}

    assert scan() == set()  # plain values and library code only
    for key, plant in plants.items():
        setattr(mod, key, plant)
        assert scan() == {f"m11_scan_probe.{names.get(key, key)}"}, key
        delattr(mod, key)
    mod.__dict__.update(plants)  # all at once: each named
    assert scan() == {f"m11_scan_probe.{names.get(k, k)}" for k in plants}



def test_the_guard_benchmark_can_still_take_the_shortcuts_out() -> None:
    """benchmarks/guard_cost.py compares the guard with its scan shortcuts edited out of its text: the edits
    must still find what they replace, or the benchmark would measure nothing (it asserts as much)."""
    import importlib.util

    from m11_helpers.grading.guard.driver import Guard

    spec = importlib.util.spec_from_file_location("guard_cost", DATA.parents[2] / "benchmarks" / "guard_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    shipped = Guard(None)
    old = bench.as_it_was(Guard(None))
    assert old.parts != shipped.parts and "_NO_CODE = frozenset()" in old.parts[0]
    for text in old.parts:
        compile(text, "<as it was>", "exec")


def test_names_a_cell_defines_and_reads() -> None:
    src = "import torch\nfrom m11_helpers.launch import launch as run\n\n\ndef on_ranks(fn):\n    return run(fn)\n"
    assert defined_names(src) == ["torch", "run", "on_ranks"]
    check = "%time x = 1\nout = on_ranks(lambda: f(2))\nexpect_equal(out, [4], 'f', exercise='1.1')\npassed('1.1', 1)"
    assert free_names(check) == ["expect_equal", "f", "on_ranks", "passed"]
    assert not any(os.getcwd().startswith(r.rstrip(os.sep)) for r in library_roots())  # a notebook's folder is no library


# ---------------------------------------------------------------- nothing survives `m11 grade`

def _run_processes(run: str) -> list[psutil.Process]:
    """Live processes whose environment carries this run's id (zombies are dead)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(RUN_ENV) == run:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _cmdline(p: psutil.Process) -> str:
    """The process's command line; "" once it has exited (it may, between being listed and being read)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.parametrize("sig, sandbox", [(signal.SIGINT, "off"), (signal.SIGTERM, "off"), (signal.SIGKILL, "off"),
                                          (signal.SIGKILL, "auto")], ids=["SIGINT", "SIGTERM", "SIGKILL", "SIGKILL-sandbox"])
def test_nothing_survives_m11_grade(work: Path, sig: int, sandbox: str) -> None:
    """Signal `m11 grade` at a random moment while `launch` ranks run: no kernel, rank or helper survives."""
    run = f"test-{uuid.uuid4().hex}"
    env = dict(os.environ, **{RUN_ENV: run, "M11_GRADE_SANDBOX": sandbox})
    cmd = [sys.executable, "-m", "m11_helpers.tools.cli", "grade", str(work / "submissions" / "ranks"),
           "--source", str(work / "solutions"), "--out", str(work / "reports")]
    with subreaper():  # orphans come to this test, which reaps them, rather than to init
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None:  # the kernel, its store and two ranks
                kernels = [p for p in _run_processes(run) if "ipykernel" in _cmdline(p)]
                if len(kernels) >= 4:
                    break
                time.sleep(0.2)
            assert proc.poll() is None and len(kernels) >= 4, "the ranks never started"
            time.sleep(random.uniform(0.0, 1.0))  # a random moment while they run
            os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)  # Ctrl-C: the group
            rc = proc.wait(timeout=120)
            end = time.monotonic() + 30
            while _run_processes(run) and time.monotonic() < end:
                time.sleep(0.2)
            # one that exits between being listed and being read is gone: not a survivor
            left = [(p.pid, cmd) for p in _run_processes(run) if (cmd := _cmdline(p)[:80]) or p.is_running()]
        finally:
            for p in _run_processes(run):
                with contextlib.suppress(psutil.Error):
                    p.kill()
            proc.kill()
            proc.wait()
            while True:  # reap what was re-parented to us
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
    assert not left, f"survived {signal.Signals(sig).name} of m11 grade: {left}"
    assert rc == (-sig if sig == signal.SIGKILL else 128 + sig), proc.stderr.read().decode()[-2000:]
