"""`m11 new-lesson` writes a skeleton that passes the suite: run it in a copy of the repository, then its tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from m11_helpers.tools.new_lesson import create_lesson, main

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "reports", "__pycache__", "*.egg-info", ".ipynb_checkpoints")


def test_bad_arguments_are_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(ValueError, match="number must be two digits"):
        create_lesson(ROOT, "7", "x", "X")
    with pytest.raises(ValueError, match="topic must be a lower-case Python identifier"):
        create_lesson(ROOT, "98", "Bad-Topic", "X")
    with pytest.raises(ValueError, match="number 00 is taken"):
        create_lesson(ROOT, "00", "anything", "X")
    assert main(["98"]) == 2  # argparse: the topic is missing


@pytest.mark.slow
def test_new_lesson_skeleton_passes_its_tests_in_a_copy(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE)
    env = dict(os.environ, PYTHONPATH=str(repo))  # the copy's package, with the new module in it
    made = subprocess.run([sys.executable, "-m", "m11_helpers.tools.cli", "new-lesson", "98", "demo_topic",
                           "Demo topic"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    for rel in ("course/98_demo_topic.ipynb", "solutions/98_demo_topic.ipynb", "exercises/98_demo_topic.ipynb",
                "solutions/wrong_answers/98_demo_topic.py", "m11_helpers/demo_topic.py", "tests/test_demo_topic.py",
                "m11_helpers/quizzes/q98_demo_topic.py"):
        assert (repo / rel).is_file(), rel
    assert "98_demo_topic" in (repo / "README.md").read_text() and "| 98_demo_topic |" in (repo / "CONTRIBUTING.md").read_text()
    assert '_l("98_demo_topic", "demo_topic", "demo_topic"),' in (repo / "m11_helpers" / "lessons.py").read_text()
    tests = ["tests/test_demo_topic.py", "tests/test_contract.py", "tests/test_notebooks.py",
             "tests/test_quizzes.py", "tests/test_repo.py", "tests/test_wrong_answers.py",
             "tests/test_lessons_graded.py", "--nbval-lax", "course/98_demo_topic.ipynb"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests,
                          "-k", "98_demo_topic or demo_topic or contract or clean or ipynb"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
