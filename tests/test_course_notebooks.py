"""The course notebooks under nbval, each run alone from a copy with the package from a wheel.

Collecting this file with `--nbval-lax` collects every `course/NN_topic.ipynb` as nbval items
(tests/conftest.py): each is copied alone into an empty temporary folder and run there in a kernel
that imports `m11_helpers` from this session's wheel, and says so before its first cell (or dies).
`make test` runs them all; one lesson: `pytest --nbval-lax tests/test_course_notebooks.py -k 05_zero_fsdp`.

The test below checks, without a kernel, that the wheel holds what a notebook opened alone needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from support.wheel import kernel_env, wheel_file

ROOT = Path(__file__).resolve().parents[1]
# the lessons whose quiz questions live in the package (m11_helpers/quizzes/qNN_topic.py)
LESSONS = sorted(p.stem[1:] for p in (ROOT / "m11_helpers" / "quizzes").glob("q[0-9][0-9]_*.py"))

ALONE = """
import json, os
from m11_helpers.resources import course_scripts, script_path
from m11_helpers.quiz import lesson_questions
from m11_helpers.tools.slides import TEMPLATES
print(json.dumps({"scripts": course_scripts(), "script": str(script_path(course_scripts()[0])),
                  "config": str(script_path("configs/fsdp_gpu.yaml")), "templates": str(TEMPLATES),
                  "quizzes": {s: len(lesson_questions(s)) for s in json.loads(os.environ["LESSONS"])}}))
"""


def test_the_wheel_ships_what_a_notebook_opened_alone_needs(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel_file(wheel)).namelist()
    # every file of the package (scripts, configs, templates, quizzes: package data included) is in it,
    # compared with the sources the wheel was built from (the working tree may have changed since)
    src = wheel.parent / "src"
    package = {p.relative_to(src).as_posix() for p in (src / "m11_helpers").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert not package - set(names), f"missing from the wheel (pyproject's package-data): {package - set(names)}"
    assert "m11_helpers/tools/templates/m11_reveal/index.html.j2" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the MIT licence travels with the wheel"
    assert not [n for n in names if n.startswith(("solutions/", "tests/", "course/", "exercises/"))]
    # a notebook opened alone: an empty folder outside the repository, only the wheel's package importable
    env = dict(kernel_env(wheel, check_cwd=True), LESSONS=json.dumps(LESSONS))
    out = subprocess.run([sys.executable, "-c", ALONE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["scripts"], "the course's training scripts are found by name"
    for key in ("script", "config", "templates"):
        assert found[key].startswith(str(wheel)), (key, found[key])
    assert all(n >= 4 for n in found["quizzes"].values()), found["quizzes"]


def test_a_kernel_that_hangs_before_its_first_cell_says_where(wheel: Path, tmp_path: Path) -> None:
    """A course kernel once hung at start-up in CI, silently (nbval sends its stderr to /dev/null). Every kernel
    started with kernel_env arms a dump of its threads' stacks, which its startup file disarms (support/wheel.py):
    a process that looks like a kernel and never gets there leaves its stacks, read by the course run's retry."""
    from support.wheel import stuck_kernels

    env = dict(kernel_env(wheel, check_cwd=True), M11_STUCK_S="0.5")
    stuck = "import time\ndef starting_up():\n    time.sleep(3)\nstarting_up()\n"
    out = subprocess.run([sys.executable, "-c", stuck, "ipykernel_launcher"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    dumps = stuck_kernels(wheel)
    assert "in starting_up" in dumps and "not at its first cell yet" in dumps, dumps
    assert stuck_kernels(wheel) == ""  # read once, then gone
