"""`m11 new-lesson` writes a skeleton that passes the suite: run it in a copy of the repository, then its tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from m11_helpers.procs import kill_tree
from m11_helpers.tools.new_lesson import create_lesson, main

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "reports", "__pycache__", "*.egg-info", ".ipynb_checkpoints")
# Alone on 2 cores: new-lesson ~6 s, the skeleton's tests ~35 s; the limits allow a busy CI machine.
NEW_S, TESTS_S = 120, 300


def test_bad_arguments_are_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(ValueError, match="number must be two digits"):
        create_lesson(ROOT, "7", "x", "X")
    with pytest.raises(ValueError, match="topic must be a lower-case Python identifier"):
        create_lesson(ROOT, "98", "Bad-Topic", "X")
    with pytest.raises(ValueError, match="number 00 is taken"):
        create_lesson(ROOT, "00", "anything", "X")
    assert main(["98"]) == 2  # argparse: the topic is missing


def _run(argv: list[str], *, cwd: Path, env: dict, timeout: float, logs: Path) -> tuple[int | None, str]:
    """Run `argv` with its output in files (a process it leaves behind cannot hold a pipe open).

    Returns (returncode, output); returncode None when it was still running at `timeout`: then every
    Python process of its tree first prints its stacks (faulthandler on SIGABRT) and the tree is killed.
    """
    logs.mkdir(parents=True, exist_ok=True)
    out_path = logs / f"{len(list(logs.iterdir()))}.log"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env, PYTHONFAULTHANDLER="1"), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            shown = []
            for pid in tree:
                with contextlib.suppress(psutil.Error):
                    shown.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:200]}")
            for pid in tree:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGABRT)  # faulthandler prints where each one is, then it dies
            time.sleep(2)
            kill_tree([proc.pid])
            proc.wait()
            out.write("\nstill running at the timeout:\n" + "\n".join(shown) + "\n")
    return code, out_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(NEW_S + TESTS_S + 60)
def test_new_lesson_skeleton_passes_its_tests_in_a_copy(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    env = dict(os.environ, PYTHONPATH=str(repo))  # the copy's package, with the new module in it
    code, out = _run([sys.executable, "-m", "m11_helpers.tools.cli", "new-lesson", "98", "demo_topic", "Demo topic"],
                     cwd=repo, env=env, timeout=NEW_S, logs=tmp_path / "logs")
    assert code == 0, f"m11 new-lesson ended with {code} (None: still running after {NEW_S} s):\n{out[-6000:]}"
    for rel in ("course/98_demo_topic.ipynb", "solutions/98_demo_topic.ipynb", "exercises/98_demo_topic.ipynb",
                "solutions/wrong_answers/98_demo_topic.py", "m11_helpers/demo_topic.py", "tests/test_demo_topic.py",
                "m11_helpers/quizzes/q98_demo_topic.py"):
        assert (repo / rel).is_file(), rel
    assert "98_demo_topic" in (repo / "README.md").read_text() and "| 98_demo_topic |" in (repo / "CONTRIBUTING.md").read_text()
    assert '_l("98_demo_topic", "demo_topic", "demo_topic"),' in (repo / "m11_helpers" / "lessons.py").read_text()
    tests = ["tests/test_demo_topic.py", "tests/test_contract.py", "tests/test_notebooks.py",
             "tests/test_quizzes.py", "tests/test_repo.py", "tests/test_wrong_answers.py",
             "tests/test_lessons_graded.py", "--nbval-lax", "course/98_demo_topic.ipynb"]
    code, out = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests,
                      "-k", "98_demo_topic or demo_topic or contract or clean or ipynb"],
                     cwd=repo, env=env, timeout=TESTS_S, logs=tmp_path / "logs")
    assert code == 0, f"the skeleton's tests ended with {code} (None: still running after {TESTS_S} s):\n{out[-6000:]}"
