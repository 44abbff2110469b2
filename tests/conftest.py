"""The course notebooks run as a learner's would: each copied alone into an empty folder, with the
package installed from a wheel (not the repository's editable install).

- `pytest --nbval-lax tests` collects the course notebooks from `tests/test_course_notebooks.py`:
  each `course/NN_topic.ipynb` is copied into its own empty temporary folder and run there under
  nbval, exactly as before (`--nbval-lax`, `# NBVAL_CHECK_OUTPUT` cells compared); the node ids stay
  `course/NN_topic.ipynb::Cell N`, so `-k 05_zero_fsdp` picks one lesson. Its kernel starts with
  `PYTHONPATH` on the wheel's install folder and proves, before the first cell, that it imported
  `m11_helpers` from there and that its cwd is outside the repository (tests/support/wheel.py).
  The outputs each cell produced are written to build/test-artifacts/executed/ for the deck tests.
- Grading runs (tests/test_lessons_graded.py, tests/test_wrong_answers.py) get the same
  environment: their nbval subprocesses and kernels import the wheel's package too.
- The wheel is built once per session (`pip wheel --no-deps --no-build-isolation`, ~2 s), and only
  when a test that needs it runs.
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import nbformat
import psutil
import pytest

from support.units import cost_order, record, unit_of, unit_seconds
from support.wheel import ROOT, cleanup, kernel_env, kernel_records, stuck_kernels, wheel_site

ANCHOR = "test_course_notebooks.py"  # collecting this file collects the course notebooks' copies
EXECUTED = ROOT / "build" / "test-artifacts" / "executed"
# test modules whose notebook kernels (grader subprocesses, the wrong-answer runner) use the wheel
WHEEL_MODULES = {"test_lessons_graded", "test_wrong_answers"}
_state: dict = {"copies": None, "used_wheel": False}


def _nbval_on(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "nbval_lax", False) or getattr(config.option, "nbval", False))


def _copies_root() -> Path:
    if _state["copies"] is None:
        _state["copies"] = Path(tempfile.mkdtemp(prefix="m11-course-copies-"))
    return _state["copies"]


def _noting_failure(item, runtest):
    def run():
        try:
            runtest()
        except BaseException:
            item._m11_failed = True
            raise
    return run


class _CopiedNotebook:
    """Mixed into nbval's IPyNbFile (imported lazily: nbval is a test dependency)."""

    def collect(self):
        self._m11_cells = list(super().collect())
        for item in self._m11_cells:  # remember a failed cell: the saved notebook is then not "complete"
            item.runtest = _noting_failure(item, item.runtest)
        return self._m11_cells

    def setup(self):
        site = wheel_site()
        _state["used_wheel"] = True
        saved = dict(os.environ)
        os.environ.update(kernel_env(site, check_cwd=True))  # the kernel process inherits it at start
        try:
            try:
                super().setup()
            except RuntimeError as e:  # nbval: "Kernel didn't respond in 60 seconds" (seen once in CI)
                if "didn't respond" not in str(e):
                    raise
                stacks = stuck_kernels(site) or "(no stack dumped: it hung after its startup file)"
                warnings.warn(f"{self.path.name}: its kernel did not start ({e}); a second one is started. "
                              f"Where the first one hung:\n{stacks}", stacklevel=1)
                super().setup()  # once: a second hang fails the notebook
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def teardown(self):
        try:
            super().teardown()
        finally:
            self._save_executed()

    def _save_executed(self) -> None:
        """Write the notebook with the outputs nbval received, for the deck tests (decks with real outputs)."""
        cells = getattr(self, "_m11_cells", [])
        ran = [c for c in cells if c.test_outputs is not None]
        if not ran:
            return
        nb = nbformat.read(self.path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        for item in ran:
            code[item.cell_num].outputs = item.test_outputs
        complete = len(ran) == len(code) and not any(getattr(c, "_m11_failed", False) for c in cells)
        nb.metadata["m11_executed"] = {"by": "nbval, from a copy with the wheel", "complete": complete}
        EXECUTED.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, EXECUTED / self.path.name)


def _copied_notebook_class():
    from nbval.plugin import IPyNbFile

    return type("CopiedNotebook", (_CopiedNotebook, IPyNbFile), {})


class CourseNotebooks(pytest.File):
    """Every course/NN_topic.ipynb, each copied alone into an empty folder, as nbval items."""

    def collect(self):
        cls = _copied_notebook_class()
        for src in sorted((ROOT / "course").glob("[0-9][0-9]_*.ipynb")):
            folder = _copies_root() / src.stem
            folder.mkdir(exist_ok=True)
            copy = folder / src.name
            shutil.copy2(src, copy)
            yield cls.from_parent(self, path=copy, nodeid=f"course/{src.name}")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.name == ANCHOR and file_path.parent == Path(__file__).parent and _nbval_on(parent.config):
        return CourseNotebooks.from_parent(parent, path=file_path, name="course", nodeid="course")
    return None


@pytest.hookimpl(trylast=True)  # after `-k`/`-m` deselected: a unit is priced by the tests that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The costliest scheduler units first (tests/support/units.py), each unit's tests in file order;
    tests that read this session's executed notebooks (marker `after_course`) last in the course's unit."""
    unit_cost = cost_order([item.nodeid for item in items])
    items.sort(key=lambda item: (unit_cost(item.nodeid), item.get_closest_marker("after_course") is not None))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook (`make test` runs `-n 3`): absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Each test file runs whole on one worker, in file order (module fixtures are set up once); the
    course notebooks and the browser tests are one unit, so a notebook's cells run in order in one
    kernel and the deck tests (`after_course`) see this session's executed notebooks. The wrong-answer
    runs are one unit per lesson (its run and its sample check share one graded run): as one file they
    were a third of the suite on one worker, the longest path of a 3-worker run. Units go out in the
    collection's order, the costliest first (pytest_collection_modifyitems), not xdist's by test count."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByFile(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:  # in the controller too, for each worker's test
    _state.setdefault("seconds", {})
    _state["seconds"][report.nodeid] = _state["seconds"].get(report.nodeid, 0.0) + report.duration


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The install folder of this session's wheel (`site`; the wheel itself is in site.parent / "dist")."""
    _state["used_wheel"] = True
    return wheel_site()


@pytest.fixture(autouse=True)
def _notebook_subprocesses_use_the_wheel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Grading subprocesses and their kernels import the wheel's package (cwd is the grader's business)."""
    module = getattr(request, "module", None)
    if module is not None and module.__name__.rsplit(".", 1)[-1] in WHEEL_MODULES:
        site = request.getfixturevalue("wheel")
        for key, value in kernel_env(site, check_cwd=False, base={}).items():
            monkeypatch.setenv(key, value)
    yield


def _wheel_records() -> list[dict]:
    return kernel_records(wheel_site()) if _state["used_wheel"] else []


def pytest_sessionstart(session: pytest.Session) -> None:
    # wall time from the process's start, the span its CPU seconds (imports and collection too) were spent in
    _state["started"] = time.monotonic() - (time.time() - psutil.Process().create_time())


def _cpu_seconds(*who: int) -> tuple[float, float]:
    """(user, system) CPU seconds of this process and/or the children it has waited for (getrusage(2)): the
    ranks, kernels and graders a test starts count once reaped, wherever in the tree they ran."""
    usage = [resource.getrusage(w) for w in who]
    return sum(u.ru_utime for u in usage), sum(u.ru_stime for u in usage)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its notebook kernels' records and its CPU seconds to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["m11_wheel"] = {"site": str(wheel_site()) if _state["used_wheel"] else "",
                                                    "records": _wheel_records()}
        session.config.workeroutput["m11_cpu"] = _cpu_seconds(resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
def pytest_testnodedown(node, error) -> None:  # the controller, as each worker finishes (pytest-xdist)
    _state.setdefault("worker_wheels", []).append(getattr(node, "workeroutput", {}).get("m11_wheel"))
    _state.setdefault("worker_cpu", []).append(getattr(node, "workeroutput", {}).get("m11_cpu", (0.0, 0.0)))


def _write_cpu_line(terminalreporter) -> None:
    """The suite's CPU seconds beside its wall time (CONTRIBUTING's test budget): the controller's own, plus
    each xdist worker's (itself and what it reaped) or, in one process, the children it reaped."""
    workers = _state.get("worker_cpu")
    user, system = _cpu_seconds(resource.RUSAGE_SELF) if workers else _cpu_seconds(resource.RUSAGE_SELF,
                                                                                 resource.RUSAGE_CHILDREN)
    for u, s in workers or ():
        user, system = user + u, system + s
    wall = time.monotonic() - _state["started"]
    terminalreporter.write_line(f"m11 cpu: {user + system:.0f} s of CPU (user {user:.0f} + system {system:.0f}) in "
                                f"{wall:.0f} s of wall time, {(user + system) / wall:.2f} cores busy on average")


def _write_units_line(terminalreporter) -> None:
    """The five costliest scheduler units of this run, and this run's seconds kept for the next one's order."""
    seconds = _state.get("seconds", {})
    if hasattr(terminalreporter.config, "workerinput") or not seconds:
        return
    units = unit_seconds(seconds)
    top = sorted(units.items(), key=lambda kv: -kv[1])[:5]
    terminalreporter.write_line("m11 units: costliest " + ", ".join(f"{u} {s:.0f} s" for u, s in top))
    record(seconds)  # per test: a lesson's run prices its slice of the shared units (support/units.py)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    _write_cpu_line(terminalreporter)
    _write_units_line(terminalreporter)
    workers = [w for w in _state.get("worker_wheels", []) if w and w["site"]]
    records = _wheel_records() + [r for w in workers for r in w["records"]]
    sites = ([str(wheel_site())] if _state["used_wheel"] else []) + [w["site"] for w in workers]
    if not records:
        return
    in_repo = sorted({r["cwd"] for r in records if r["cwd_in_repo"]})
    line = (f"m11 wheel: {len(records)} notebook kernels imported m11_helpers from the wheel "
            f"({sum(r['from_wheel'] for r in records)} of them from {' or '.join(sites)})")
    terminalreporter.write_line(line)
    if in_repo:
        terminalreporter.write_line(f"m11 wheel: kernels whose cwd was inside the repository: {', '.join(in_repo)}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _state["copies"] is not None:
        shutil.rmtree(_state["copies"], ignore_errors=True)
    if wheel_site.cache_info().currsize:
        cleanup(wheel_site())
