"""The student repository template grades itself: its workflow's `run:` steps, run locally.

The steps of `.github/workflows/grade.yml` run in order in a copy of the template holding one
exercise notebook, with `if: always()` honoured, this checkout's package (already on PATH) in place of
the install step but nothing importable beyond what that step's install line brings
(tests/support/installs.py: the `[grade]` extra or `m11 grade` cannot run), and `$GITHUB_STEP_SUMMARY`
pointed at a file. `uses:` steps (checkout,
setup-python, upload-artifact, Classroom's reporter) are GitHub's; for the upload we check that its paths
exist, and for the reporter we decode the runner result it would read, `$GITHUB_OUTPUT` being a file here,
and add up its points as the reporter does (m11_helpers/grading/classroom/points.py): they must be
`m11 grade`'s, per exercise and in total, from the same graded run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from m11_helpers.grading.classroom import points as classroom_points
from m11_helpers.tools.setup_cell import install_spec
from support.installs import only_installed, provided_imports

yaml = pytest.importorskip("yaml", reason="PyYAML (a jupyter_events dependency) is needed to read the workflow")

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "m11_helpers" / "grading" / "templates" / "student_repo"
WORKFLOW = TEMPLATE / ".github" / "workflows" / "grade.yml"
LESSON = "01_hardware.ipynb"  # formulas only, no processes: grades in seconds
COURSE_URL = "git+https://github.com/m11-course/training-at-scale"
GRADE_IMPORTS = {"nbformat", "nbval", "pytest", "nbclient", "ipykernel", "jupyter_client", "torch"}  # `m11 grade`'s


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def install_steps(wf: dict) -> list[str]:
    """The job's install scripts, their `$VAR`s filled in from the workflow's env."""
    (job,) = wf["jobs"].values()
    fill = lambda text: re.sub(r"\$\{?(\w+)\}?", lambda m: str(wf["env"].get(m.group(1), m.group(0))), text)
    return [fill(s["run"]) for s in job["steps"] if "pip install" in s.get("run", "")]


def run_job(repo: Path, min_score: str, only: str | None = None) -> tuple[int, list[tuple[str, int]], str]:
    """Run the job's steps in repo; return the job's exit code, (step, exit code) pairs, the summary."""
    wf = workflow()
    (job,) = wf["jobs"].values()
    summary = repo / "step_summary.md"
    summary.write_text("")
    (repo / "github_output").write_text("")
    env = dict(os.environ)
    env.update({k: str(v) for k, v in {**wf.get("env", {}), **job.get("env", {})}.items() if "${{" not in str(v)})
    env.update(MIN_SCORE=min_score, GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(repo / "github_output"), CI="true",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env = only_installed(install_steps(wf), repo.parent / "imports", env)  # pip cannot run here: only what it would bring
    failed, ran = False, []
    for step in job["steps"]:
        name = step.get("name") or step.get("uses", "")
        if "run" not in step or (only and name != only):
            if "upload-artifact" in step.get("uses", "") and not only:
                paths = step["with"]["path"].split()
                assert all((repo / p).is_file() for p in paths), f"nothing to upload: {paths}"
            continue
        if "pip install" in step["run"]:  # the course is this checkout, installed in .venv
            continue
        if failed and "always()" not in str(step.get("if", "")):
            continue
        proc = subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=600)
        ran.append((name, proc.returncode))
        failed |= proc.returncode != 0
    return int(failed), ran, summary.read_text()


def student_repo(tmp_path: Path, notebook: Path) -> Path:
    repo = tmp_path / "student"
    shutil.copytree(TEMPLATE, repo)
    shutil.copy(notebook, repo / "exercises" / LESSON)
    return repo


def test_workflow_installs_the_course_grades_uploads_and_gates() -> None:
    wf = workflow()
    (job,) = wf["jobs"].values()
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert COURSE_URL in str(wf["env"]) and "pip install" in runs
    # the course with the grader's extra, at this release's tag: what the README tells students to install too
    assert wf["env"]["COURSE"] == install_spec(extra="grade")
    assert f'pip install "{install_spec(extra="grade")}"' in (TEMPLATE / "README.md").read_text()
    brought = provided_imports(install_steps(wf))
    assert GRADE_IMPORTS <= brought, f"the install step does not bring {GRADE_IMPORTS - brought}"
    assert "m11 grade exercises/ --min-score 0 --out reports/" in runs
    assert "GITHUB_STEP_SUMMARY" in runs
    uploads = [s for s in job["steps"] if "upload-artifact" in s.get("uses", "")]
    assert uploads and {"reports/report.md", "reports/report.json", "reports/junit.xml"} <= set(
        uploads[0]["with"]["path"].split())
    assert "always()" in uploads[0].get("if", "")
    assert "MIN_SCORE" in str(wf["env"]) and "min_score" in str(wf[True]["workflow_dispatch"]["inputs"])
    # the threshold is an input with a repository-variable fallback, as the README says
    assert re.search(r"inputs\.min_score\s*\|\|\s*vars\.M11_MIN_SCORE", wf["env"]["MIN_SCORE"])
    # GitHub Classroom takes points only from this workflow name and job id (the reporter's README)
    assert wf["name"] == "Autograding Tests" and list(wf["jobs"]) == ["run-autograding-tests"]
    (points,) = [s for s in job["steps"] if s.get("id") == classroom_points.RUNNER]
    (reporter,) = [s for s in job["steps"] if "autograding-grading-reporter" in s.get("uses", "")]
    assert "always()" in points["if"] and "always()" in reporter["if"]
    assert reporter["with"]["runners"] == classroom_points.RUNNER
    assert reporter["env"] == {f"{classroom_points.RUNNER.upper()}_RESULTS":
                               f"${{{{ steps.{classroom_points.RUNNER}.outputs.result }}}}"}


def test_readme_and_workflow_say_feedback_here_grade_from_the_instructor() -> None:
    readme = " ".join((TEMPLATE / "README.md").read_text().split())
    assert "This repository's workflow gives feedback; the instructor's run gives the grade." in readme
    assert "hidden tests" in readme and "deadline" in readme
    assert "FEEDBACK" in WORKFLOW.read_text().splitlines()[0]
    instructor = TEMPLATE.parent / "instructor_repo" / ".github" / "workflows" / "grade-class.yml"
    assert instructor.is_file() and "gives the grade" in instructor.read_text()


@pytest.mark.slow
def test_unanswered_exercises_fail_the_threshold_but_still_report(tmp_path: Path) -> None:
    repo = student_repo(tmp_path, REPO / "exercises" / LESSON)
    code, ran, summary = run_job(repo, min_score="50")
    assert code == 1, ran
    assert ran[-2:] == [("Fail below the threshold", 1), ("Points for GitHub Classroom", 0)], ran
    assert ("Grade the exercises", 0) in ran  # --min-score 0: grading itself never fails the job
    for name in ("report.md", "report.json", "junit.xml"):
        assert (repo / "reports" / name).is_file(), name
    assert "Total: 0 /" in summary and LESSON in summary
    classroom_matches_grade(repo, status="fail")
    # the same reports pass a threshold of 0
    code0, ran0, _ = run_job(repo, min_score="0", only="Fail below the threshold")
    assert (code0, ran0) == (0, [("Fail below the threshold", 0)])


@pytest.mark.slow
def test_answered_exercises_pass_the_threshold(tmp_path: Path) -> None:
    repo = student_repo(tmp_path, REPO / "solutions" / LESSON)
    code, ran, summary = run_job(repo, min_score="100")
    assert code == 0, ran
    assert [c for _, c in ran] == [0, 0, 0, 0], ran
    assert "(100%)" in summary
    classroom_matches_grade(repo, status="pass")


def classroom_matches_grade(repo: Path, status: str) -> None:
    """The points the Classroom reporter would read are m11 grade's, per exercise and in total."""
    outputs = (repo / "github_output").read_text().splitlines()
    (value,) = [line.split("=", 1)[1] for line in outputs if line.startswith("result=")]
    result = classroom_points.decode(value)
    report = json.loads((repo / "reports" / "report.json").read_text())
    graded = {f"{nb['notebook']} · Exercise {e['exercise']}": (e["points"], e["max_points"])
              for nb in report["notebooks"] for e in nb["exercises"]}
    assert len(graded) >= 2 and {t["name"]: (t["score"], t["max_score"]) for t in result["tests"]} == graded
    assert classroom_points.points(result) == (report["score"], report["max_score"]) and report["max_score"] > 0
    assert result["status"] == status and result["version"] == 1
