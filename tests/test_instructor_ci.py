"""The instructor's CI gives the grade: collect at the deadline, check integrity, grade in shards, merge.

What it must do: take every submission as it stood at the deadline (by GitHub's push records, not the
students' clocks), grade each in the sandbox with the hidden tests restored, in parallel shards, and
give every student a row even when a shard is lost; and run on a runner that has only what its install
lines bring. The workflow `grade-class.yml` runs locally: its jobs in order (collect, then one grade
job per matrix entry, then merge), each in a fresh copy of an instructor repository, with the `${{ }}`
expressions it uses evaluated, `actions/*-artifact` played by a folder, this checkout's package in
place of the install steps but nothing importable beyond what those steps install
(tests/support/installs.py), and `$GITHUB_OUTPUT` / `$GITHUB_STEP_SUMMARY` as files. Collecting from GitHub Classroom runs
real git on real repositories, through a stand-in `gh` on PATH that serves a roster and clones locally.
"""

from __future__ import annotations

import csv
import fnmatch
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path

import nbformat
import pytest

from m11_helpers.grading.authoring.exercises import make_exercise
from m11_helpers.grading.cells import CHECK, POINTS, SOLUTION, exercise_of, m11_meta, role_of
from m11_helpers.grading.classroom import ci, collect
from m11_helpers.grading.classroom import grade_class as classroom
from m11_helpers.grading.classroom.integrity import inspect
from m11_helpers.grading.sandbox import isolate as sandbox
from support.installs import only_installed, provided_imports

yaml = pytest.importorskip("yaml", reason="PyYAML (a jupyter_events dependency) is needed to read the workflow")

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "m11_helpers" / "grading" / "templates" / "instructor_repo"
WORKFLOW = TEMPLATE / ".github" / "workflows" / "grade-class.yml"
LESSON = "01_hardware.ipynb"  # formulas only, no processes: grades in seconds
DEADLINE = "2025-03-14T23:59:00Z"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


# ---------------------------------------------------------------- a small GitHub Actions, locally

def evaluate(expr: str, ctx: dict):
    """The expression subset the workflow uses: contexts, literals, ||, &&, ==, !=, fromJSON(), always()."""
    def ref(m: re.Match) -> str:
        value = ctx
        for part in m.group(0).split("."):
            value = value.get(part, "") if isinstance(value, dict) else ""
        return repr(value)
    code = re.sub(r"\b(?:inputs|vars|secrets|matrix|needs|steps|github)(?:\.[A-Za-z_][\w-]*)+", ref, expr)
    code = code.replace("&&", " and ").replace("||", " or ").replace("always()", "True")
    return eval(code.replace("fromJSON(", "_json("), {"_json": json.loads})  # noqa: S307 - our own workflow


def value(v, ctx: dict):
    if isinstance(v, str) and re.fullmatch(r"\$\{\{(.*?)\}\}", v.strip(), re.S):
        return evaluate(v.strip()[3:-2], ctx)
    if isinstance(v, str):
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(evaluate(m.group(1), ctx)), v)
    return v


def run_steps(job: dict, ctx: dict, repo: Path, work: Path, artifacts: Path) -> tuple[bool, dict]:
    """One job in a fresh copy of the instructor repository: (succeeded, step outputs by id)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(repo, work)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", CI="true",
               GITHUB_EVENT_NAME=ctx["github"]["event_name"], GITHUB_STEP_SUMMARY=str(artifacts / "summary.md"))
    env.update({k: str(value(v, ctx)) for k, v in {**ctx["wf_env"], **job.get("env", {})}.items()})
    if not sandbox.available()[0]:  # the mechanics still run here; `require` is for the real runner
        env["M11_GRADE_SANDBOX"] = "auto"
    # pip cannot run here: the job gets this checkout, but only what its install lines would bring is importable
    env = only_installed([s["run"] for s in job["steps"] if "run" in s], work.parent / f"{work.name}-imports", env)
    failed, outputs = False, {}
    for step in job["steps"]:
        cond = str(step.get("if", ""))
        if (failed and "always()" not in cond) or (cond and not evaluate(cond, {**ctx, "steps": outputs})):
            continue
        uses, args = step.get("uses", ""), {k: value(v, ctx) for k, v in step.get("with", {}).items()}
        if "upload-artifact" in uses:
            src = work / args["path"]
            if src.exists():
                shutil.copytree(src, artifacts / args["name"], dirs_exist_ok=True)
        elif "download-artifact" in uses:
            names = [args["name"]] if "name" in args else fnmatch.filter(os.listdir(artifacts), args["pattern"])
            for name in names:
                dest = work / args["path"] / ("" if "name" in args else name)
                shutil.copytree(artifacts / name, dest, dirs_exist_ok=True)
        elif "run" in step and "pip install" not in step["run"]:  # the course is this checkout, installed
            out = work / ".github_output"
            out.write_text("")
            step_env = dict(env, GITHUB_OUTPUT=str(out), **{k: str(value(v, ctx)) for k, v in step.get("env", {}).items()})
            proc = subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], cwd=work, env=step_env,
                                  capture_output=True, text=True, timeout=900)
            failed |= proc.returncode != 0
            assert proc.returncode == 0, f"{step.get('name')}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            if step.get("id"):
                outputs[step["id"]] = {"outputs": dict(line.split("=", 1) for line in out.read_text().splitlines()
                                                       if "=" in line)}
    return not failed, outputs


def run_workflow(repo: Path, tmp: Path, inputs: dict, variables: dict) -> tuple[dict, Path]:
    """Every job of the workflow in `needs` order, matrices expanded; (job results, artifact folder)."""
    wf, artifacts = workflow(), tmp / "artifacts"
    artifacts.mkdir()
    ctx = {"inputs": inputs, "vars": variables, "secrets": {}, "github": {"event_name": "workflow_dispatch"},
           "wf_env": wf["env"], "needs": {}}
    ran = {}
    for name in ("collect", "grade", "merge"):
        job = wf["jobs"][name]
        if "if" in job and not evaluate(job["if"], ctx):
            ctx["needs"][name] = {"result": "skipped", "outputs": {}}
            continue
        matrix = value(job.get("strategy", {}).get("matrix", {}), ctx) or {}
        combos = [dict(zip(matrix, c)) for c in itertools.product(*matrix.values())] if matrix else [{}]
        results = []
        for i, combo in enumerate(combos):
            ok, steps = run_steps(job, {**ctx, "matrix": combo}, repo, tmp / f"{name}-{i}", artifacts)
            results.append(ok)
        outputs = {k: value(v, {**ctx, "steps": steps}) for k, v in job.get("outputs", {}).items()}
        ctx["needs"][name] = {"result": "success" if all(results) else "failure", "outputs": outputs}
        ran[name] = combos
    return ran, artifacts


def test_each_job_installs_what_its_commands_import(tmp_path: Path) -> None:
    """Each job's `ci` commands run with only what its `pip install` lines bring: collect and merge have no
    pytest and no torch (a module importing either at the top fails here as on the runner)."""
    jobs = workflow()["jobs"]
    runs = {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in jobs.items()}
    allowed = {name: provided_imports(scripts) for name, scripts in runs.items()}
    assert not {"pytest", "torch", "nbval"} & (allowed["collect"] | allowed["merge"])  # what the light jobs lack
    export, subs = tmp_path / "export", tmp_path / "submissions"
    (export / "ada").mkdir(parents=True)
    (export / "ada" / "notes.txt").write_text("no notebook")
    argv = {"due": ["--deadline", DEADLINE, "--event", "workflow_dispatch"],
            "collect": ["--export", str(export), "--deadline", DEADLINE, "--out", str(subs)],
            "plan": [str(subs), "--shard-size", "20"],
            "grade": [str(subs), "--source", str(REPO / "solutions"), "--notebooks", "01_hardware", "--out",
                      str(tmp_path / "shards" / "shard-1")],
            "merge": [str(tmp_path / "shards"), "--submissions", str(subs), "--out", str(tmp_path / "reports")]}
    ran = []
    for job in ("collect", "grade", "merge"):
        commands = dict.fromkeys(re.findall(r"m11_helpers\.grading\.classroom\.ci (\w+)", "\n".join(runs[job])))
        env = only_installed(runs[job], tmp_path / job, dict(os.environ, M11_GRADE_SANDBOX="auto"))
        for command in commands:
            proc = subprocess.run([sys.executable, "-m", "m11_helpers.grading.classroom.ci", command, *argv[command]], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"{job}: ci {command}: {proc.stderr[-2000:]}"
            ran.append(command)
    assert ran == ["due", "collect", "plan", "grade", "merge"]
    assert [r.status for r in classroom.read_csv(tmp_path / "reports" / "class.csv")] == ["missing"]


# ---------------------------------------------------------------- the class of three

def answered(edit: bool) -> nbformat.NotebookNode:
    """The exercise notebook (made from the solution, as `m11 make-exercises` makes it) with the solution's
    answers; `edit`: 1.2 left unanswered (its stub) and its check "fixed", the 1.3 check deleted."""
    sol = nbformat.read(REPO / "solutions" / LESSON, as_version=4)
    nb = make_exercise(sol, LESSON)
    answers = {exercise_of(c): c.source for c in sol.cells if role_of(c) == SOLUTION and c.cell_type == "code"}
    cells = []
    for c in nb.cells:
        role, ex = role_of(c), exercise_of(c)
        if role == SOLUTION and c.cell_type == "code" and not (edit and ex == "1.2"):
            c.source = answers[ex]
        if edit and role == CHECK and ex == "1.2":
            c.source = 'passed("1.2", points=2)'
        if not (edit and role == CHECK and ex == "1.3"):
            cells.append(c)
    nb.cells = cells
    return nb


def points(exercise: str | None) -> float:
    """The points of one exercise of the lesson (None: all of them)."""
    sol = nbformat.read(REPO / "solutions" / LESSON, as_version=4)
    return sum(float(m11_meta(c).get(POINTS, 0)) for c in sol.cells
               if role_of(c) == CHECK and exercise in (None, exercise_of(c)))


def test_workflow_collects_once_grades_in_a_matrix_merges_and_keeps_the_token_in_one_step() -> None:
    wf = workflow()
    assert "schedule" in wf[True] and "deadline" in wf[True]["workflow_dispatch"]["inputs"]
    assert wf["env"]["M11_GRADE_SANDBOX"] == "require"
    jobs = wf["jobs"]
    assert jobs["grade"]["needs"] == "collect" and "fromJSON(needs.collect.outputs.matrix)" in str(
        jobs["grade"]["strategy"]["matrix"]) and jobs["grade"]["strategy"]["fail-fast"] is False
    assert set(jobs["merge"]["needs"]) == {"collect", "grade"} and "always()" in jobs["merge"]["if"]
    holders = [(j, s.get("name")) for j, job in jobs.items() for s in job["steps"] if "secrets." in json.dumps(s)]
    assert holders == [("collect", "Collect the submissions at the deadline")]
    assert "secrets" not in json.dumps({k: v for k, v in wf.items() if k != "jobs"}) + json.dumps(
        [job.get("env", {}) for job in jobs.values()])
    runs = {j: "\n".join(s.get("run", "") for s in job["steps"]) for j, job in jobs.items()}
    assert "apt-get install" in runs["grade"] and "bubblewrap" in runs["grade"]
    assert "rev-list" not in runs["collect"] and "--deadline" in runs["collect"]  # the module does it
    assert 'GITHUB_STEP_SUMMARY' in runs["merge"]
    checkouts = [s for job in jobs.values() for s in job["steps"] if "checkout" in s.get("uses", "")]
    assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts)
    assert "${{" not in "".join(runs.values()), "expressions go through env:, never into a script"
    steps = {s.get("id") or s.get("name"): s for s in jobs["collect"]["steps"]}
    assert steps["Collect the submissions at the deadline"]["if"] == "steps.due.outputs.run == 'true'"
    assert "ci due" in steps["due"]["run"] and "github.token" in steps["due"]["env"]["GH_TOKEN"]
    assert wf["permissions"] == {"contents": "read", "actions": "read"}
    (publish,) = [s for s in jobs["merge"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert publish["with"]["name"] == "${{ needs.collect.outputs.artifact }}"  # what `ci due` looks for


def test_a_scheduled_run_grades_once_within_a_day_after_the_deadline(tmp_path: Path, monkeypatch, capsys) -> None:
    """Not every day after the deadline (300 students × 35 s ≈ 3 h of runner time a day): before it, nothing;
    within 24 h, once (not if a grade artifact for this deadline exists); after that, only by hand."""
    when = collect.parse_deadline(DEADLINE)
    at = lambda hours: when + timedelta(hours=hours)  # noqa: E731
    assert ci.due(DEADLINE, "schedule", now=at(-2)) == (False, f"the deadline ({DEADLINE}) has not passed")
    assert ci.due(DEADLINE, "schedule", now=at(2)) == (True, "the deadline has passed")
    assert not ci.due(DEADLINE, "schedule", now=at(25))[0] and ci.due(DEADLINE, "workflow_dispatch", now=at(500))[0]
    assert not ci.due("", "schedule")[0]
    listing = tmp_path / "artifacts.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f"""#!/bin/bash
[ "$*" = "api repos/org/course/actions/artifacts?name=class-grades-2025-03-14T2359Z&per_page=100" ] || exit 1
[ -f {listing} ] && cat {listing} || {{ echo "HTTP 403: Resource not accessible by integration" >&2; exit 1; }}
""")
    (bin_dir / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert ci.due(DEADLINE, "schedule", "org/course", now=at(2))[0]  # GitHub cannot say: grade rather than not
    assert "could not list this repository's artifacts" in capsys.readouterr().err
    for expired, graded in ((True, True), (False, False)):
        listing.write_text(json.dumps({"total_count": 1, "artifacts": [
            {"name": "class-grades-2025-03-14T2359Z", "expired": expired, "workflow_run": {"id": 42}}]}))
        assert ci.due(DEADLINE, "schedule", "org/course", now=at(2))[0] is graded
    assert ci.due(DEADLINE, "schedule", "org/course", now=at(2))[1] == (
        "already graded for this deadline: class-grades-2025-03-14T2359Z exists (run 42)")
    assert ci.main(["due", "--deadline", DEADLINE, "--event", "schedule"]) == 0  # now: long past
    assert capsys.readouterr().out == "run=false\nartifact=class-grades-2025-03-14T2359Z\n"


@pytest.mark.slow
def test_the_workflow_grades_a_class_of_three_in_two_shards(tmp_path: Path) -> None:
    repo = tmp_path / "instructor"
    shutil.copytree(TEMPLATE, repo)
    (repo / "solutions").mkdir()
    shutil.copy(REPO / "solutions" / LESSON, repo / "solutions" / LESSON)
    export = repo / "lms" / "export.zip"
    export.parent.mkdir()
    with zipfile.ZipFile(export, "w") as z:
        z.writestr(f"course-export/honest/{LESSON}", nbformat.writes(answered(edit=False)))
        z.writestr(f"course-export/edited/{LESSON}", nbformat.writes(answered(edit=True)))
        z.writestr("course-export/missing/notes.txt", "I ran out of time")
    ran, artifacts = run_workflow(repo, tmp_path, {"deadline": DEADLINE, "notebooks": "01_hardware",
                                                   "source": "lms/export.zip"}, {"M11_SHARD_SIZE": "2"})
    assert ran["grade"] == [{"shard": 1, "shards": 2}, {"shard": 2, "shards": 2}]
    assert sorted(p.name for p in artifacts.glob("shard-*")) == ["shard-1", "shard-2"]
    grades = artifacts / ci.artifact_name(DEADLINE)  # class-grades-2025-03-14T2359Z
    rows = {r["student"]: r for r in csv.DictReader(open(grades / "class.csv", encoding="utf-8"))}
    top = points(None)
    assert {s: (float(r["score"]), float(r["max"]), r["status"]) for s, r in rows.items()} == {
        "honest": (top, top, "graded"), "edited": (top - points("1.2"), top, "graded"), "missing": (0, top, "missing")}
    assert "exercise 1.2 was edited" in rows["edited"]["notes"] and "exercise 1.3 was deleted" in rows["edited"]["notes"]
    assert rows["honest"]["notes"] == "" and "no 01_hardware.ipynb" in rows["missing"]["notes"]
    for student in rows:
        assert (grades / student / "report.md").is_file()
    assert "Exercise 1.2" in (grades / "edited" / "report.md").read_text()  # the course's check ran on the stub
    summary = (artifacts / "summary.md").read_text()
    assert "3 students" in summary and "| edited | 01_hardware.ipynb |" in summary


# ---------------------------------------------------------------- collecting

def git(repo: Path, *args: str, when: str = "") -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="s", GIT_AUTHOR_EMAIL="s@x", GIT_COMMITTER_NAME="s",
               GIT_COMMITTER_EMAIL="s@x", **({"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when} if when else {}))
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def push_event(sha: str, when: str, kind: str = "push") -> dict:
    """One record of GitHub's repository activity API, as `gh api repos/O/R/activity` returns it."""
    return {"id": abs(hash((sha, when))), "before": "0" * 40, "after": sha, "ref": "refs/heads/main",
            "timestamp": when, "activity_type": kind, "actor": {"login": "student"}}


def test_collect_from_classroom_takes_the_head_of_the_last_push_before_the_deadline(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """GitHub's push records decide, never commit dates (the student's clock): `back` commits after the deadline
    with a date before it, `force` rewrites its history after the deadline; `nolog`'s records cannot be read,
    so its commit dates decide and its row says so."""
    remotes, activity = tmp_path / "remotes", tmp_path / "activity"
    activity.mkdir()
    shas = {}
    # per repository: (commit date, push time or None: the push record is missing, amend: rewrite the last commit)
    plans = {"hw-ada": [("2025-03-10T12:00:00Z", "2025-03-10T12:01:00Z"), ("2025-03-16T09:00:00Z", "2025-03-16T09:01:00Z")],
             "hw-bob": [("2025-03-12T12:00:00Z", "2025-03-12T12:01:00Z")],
             "hw-late": [("2025-03-20T12:00:00Z", "2025-03-20T12:01:00Z")],
             "hw-back": [("2025-03-10T12:00:00Z", "2025-03-10T12:01:00Z"), ("2025-03-14T20:00:00Z", "2025-03-16T08:00:00Z")],
             "hw-force": [("2025-03-12T12:00:00Z", "2025-03-12T12:01:00Z"), ("2025-03-13T12:00:00Z", "2025-03-17T10:00:00Z",
                                                                             "amend")],
             "hw-nolog": [("2025-03-10T12:00:00Z", None), ("2025-03-16T09:00:00Z", None)]}
    for name, commits in plans.items():
        repo = remotes / "org" / name
        (repo / "exercises").mkdir(parents=True)
        git(repo, "init", "-q", "-b", "main")
        events = []
        for i, (when, pushed, *amend) in enumerate(commits):
            (repo / "exercises" / LESSON).write_text(f"{name} version {i}")
            if i == 0:
                (repo / "leak").symlink_to("/etc/passwd")
                (repo / ".github" / "workflows").mkdir(parents=True)
                (repo / ".github" / "workflows" / "grade.yml").write_text("on: push")
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", f"v{i}", *(["--amend"] if amend else []), when=when)
            shas.setdefault(name, []).append(git(repo, "rev-parse", "HEAD"))
            if pushed:
                events.append(push_event(shas[name][-1], pushed, "force_push" if amend else "push"))
        if name != "hw-nolog":  # newest first, as GitHub lists them
            (activity / f"{name}.json").write_text(json.dumps(events[::-1]))
    pages = [[{"students": [{"login": "ada"}], "repository": {"full_name": "org/hw-ada"}},
              {"students": [{"login": "bob"}, {"login": "cy"}], "repository": {"full_name": "org/hw-bob"}}],
             [{"students": [{"login": "late"}], "repository": {"full_name": "org/hw-late"}},
              {"students": [{"login": "gone"}], "repository": {"full_name": "org/hw-gone"}}],  # deleted repo
             [{"students": [{"login": s}], "repository": {"full_name": f"org/hw-{s}"}} for s in ("back", "force", "nolog")]]
    (tmp_path / "roster.json").write_text("".join(json.dumps(p) for p in pages))  # gh --paginate: pages back to back
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f"""#!/bin/bash
case "$1 $2 $3" in
  "api --paginate /assignments/77/accepted_assignments") cat {tmp_path}/roster.json ;;
  "api --paginate repos/org/"*"/activity?ref=refs/heads/main&per_page=100")
    f="{activity}/$(echo "$3" | cut -d/ -f3).json"
    [ -f "$f" ] && cat "$f" || {{ echo "HTTP 404: Not Found" >&2; exit 1; }} ;;
  "repo clone "*) git clone --quiet "{remotes}/$3" "$4" ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
""")
    (bin_dir / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "submissions"
    assert ci.main(["collect", "--classroom", "77", "--deadline", DEADLINE, "--out", str(out)]) == 0
    rows = collect.read_manifest(out)
    assert {s: (r["commit"], r["dated"], r["late"]) for s, r in rows.items()} == {
        "ada": (shas["hw-ada"][0], shas["hw-ada"][0], "yes"), "bob+cy": (shas["hw-bob"][0], shas["hw-bob"][0], "no"),
        "late": ("", "", "yes"), "gone": ("", "", ""),
        "back": (shas["hw-back"][0], shas["hw-back"][1], "yes"),  # dated before the deadline, pushed after it
        "force": (shas["hw-force"][0], shas["hw-force"][1], "yes"),  # the force-push after it changes nothing
        "nolog": (shas["hw-nolog"][0], shas["hw-nolog"][0], "yes")}
    assert rows["late"]["notes"] == "no push before the deadline" and (out / "late").is_dir()
    assert rows["gone"]["notes"].startswith("not collected: ")
    for s in ("back", "force"):
        assert "commit dates disagree with GitHub's push records" in rows[s]["notes"], rows[s]
        assert (out / s / "exercises" / LESSON).read_text() == f"hw-{s} version 0"
    assert rows["nolog"]["notes"].startswith("GitHub's push records could not be read") and \
        "graded by commit dates" in rows["nolog"]["notes"]
    assert rows["ada"]["notes"] == rows["bob+cy"]["notes"] == ""
    assert rows["ada"]["head"] == shas["hw-ada"][1] and rows["ada"]["origin"] == "https://github.com/org/hw-ada"
    assert (out / "ada" / "exercises" / LESSON).read_text() == "hw-ada version 0"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted([
        *(f"{s}/exercises/01_hardware.ipynb" for s in ("ada", "back", "bob+cy", "force", "nolog")), "manifest.csv"])
    assert classroom.students(out) == ["ada", "back", "bob+cy", "force", "gone", "late", "nolog"]  # each gets a row
    status, _, notes = inspect(out / "gone", LESSON, REPO / "solutions")
    assert (status, notes) == ("missing", [f"no {LESSON} in the submission"])


def test_collect_from_an_lms_zip_canvas_names_late_marks_nothing_outside(tmp_path: Path) -> None:
    export = tmp_path / "lms" / "canvas.zip"
    export.parent.mkdir()
    with zipfile.ZipFile(export, "w") as z:
        z.writestr(f"ada_1201_99_{LESSON}", "ada's")
        z.writestr(f"bob_LATE_1202_98_{LESSON}", "bob's")
        z.writestr("../../escaped.ipynb", "zip slip")
        z.writestr("__MACOSX/._junk", "x")
    out = tmp_path / "deep" / "submissions"
    rows = {r["student"]: r for r in collect.collect_export(export, collect.parse_deadline(DEADLINE), out)}
    assert (out / "ada" / LESSON).read_text() == "ada's" and (out / "bob" / LESSON).read_text() == "bob's"
    assert (rows["ada"]["late"], rows["bob"]["late"]) == ("no", "yes")
    assert all(p.is_relative_to(out) for p in tmp_path.rglob("escaped.ipynb"))  # zipfile drops the "../"
    with pytest.raises(ValueError, match="time zone"):
        collect.parse_deadline("2025-03-14 23:59")


# ---------------------------------------------------------------- integrity, plan, merge

def test_integrity_gives_a_clear_row_never_a_crash(tmp_path: Path) -> None:
    src = REPO / "solutions"
    cases = {
        "pdf": {LESSON: b"%PDF-1.4 not a notebook"},
        "other_lesson": {LESSON: (REPO / "exercises" / "00_welcome.ipynb").read_bytes()},
        "only_lesson_00": {"00_welcome.ipynb": (REPO / "exercises" / "00_welcome.ipynb").read_bytes()},
        "renamed": {f"Copy of {LESSON}": nbformat.writes(answered(edit=False)).encode()},
        "as_pdf": {"01_hardware.pdf": b"%PDF"},
        "solution": {LESSON: (REPO / "solutions" / LESSON).read_bytes()},
        "edited": {LESSON: nbformat.writes(answered(edit=True)).encode()},
        "empty": {},
    }
    got = {}
    for student, files in cases.items():
        (tmp_path / student).mkdir()
        for name, data in files.items():
            (tmp_path / student / name).write_bytes(data)
        status, path, notes = inspect(tmp_path / student, LESSON, src)
        got[student] = (status, path.name if path else None, notes)
    assert got["pdf"][:2] == ("not a notebook", None) and "not a readable notebook" in got["pdf"][2][0]
    assert got["other_lesson"][:2] == ("wrong lesson", None) and "0.1" in got["other_lesson"][2][0]
    assert got["only_lesson_00"] == ("missing", None, [f"no {LESSON} in the submission (it holds 00_welcome.ipynb)"])
    assert got["renamed"] == ("graded", f"Copy of {LESSON}", [f"graded Copy of {LESSON} (expected name: {LESSON})"])
    assert got["as_pdf"] == ("not a notebook", None, [f"handed in 01_hardware.pdf, not {LESSON}"])
    assert got["solution"] == ("graded", LESSON, [])  # the hidden tests are the course's own
    assert got["edited"][:2] == ("graded", LESSON) and [n.split(";")[0] for n in got["edited"][2]] == [
        "integrity: the check cell of exercise 1.2 was edited", "integrity: the check cell of exercise 1.3 was deleted"]
    assert got["empty"] == ("missing", None, [f"no {LESSON} in the submission"])


def test_a_linked_submission_is_no_ones_work(tmp_path: Path) -> None:
    """Hostile: alice links bob's notebook, carol links the solution; dave's folder is a link to bob's. None is
    graded as theirs (the grader reads notebooks outside the sandbox, where links resolve), and an export
    that holds links is collected without them."""
    klass = tmp_path / "class"
    (klass / "bob").mkdir(parents=True)
    (klass / "bob" / LESSON).write_bytes((REPO / "solutions" / LESSON).read_bytes())
    (klass / "alice").mkdir()
    (klass / "alice" / LESSON).symlink_to(Path("..") / "bob" / LESSON)
    (klass / "carol" / "work").mkdir(parents=True)
    (klass / "carol" / "work" / f"Copy of {LESSON}").symlink_to(REPO / "solutions" / LESSON)  # found by exercise ids
    (klass / "dave").symlink_to("bob", target_is_directory=True)
    graded = []
    fake = lambda path, *a: graded.append(path) or classroom.NotebookResult(str(path))  # grading itself is not tested
    rows = {r.student: r for r in classroom.grade_class(klass, REPO / "solutions", tmp_path / "out", fake, [LESSON])}
    assert graded == [klass / "bob" / LESSON]
    assert {s: r.status for s, r in rows.items()} == {"alice": "not a notebook", "bob": "graded", "carol": "missing",
                                                      "dave": "not a notebook"}
    assert "a symbolic link" in rows["alice"].notes and "a symbolic link" in rows["dave"].notes
    assert "ignored symbolic links: work/Copy of 01_hardware.ipynb" in rows["carol"].notes
    export = tmp_path / "export"
    shutil.copytree(klass, export, symlinks=True)
    collect.collect_export(export, None, tmp_path / "collected")
    links = [p for p in (tmp_path / "collected").rglob("*") if p.is_symlink()]
    assert not links and not (tmp_path / "collected" / "alice" / LESSON).exists()


def test_plan_and_merge_report_every_student_even_when_a_shard_is_lost(tmp_path: Path, capsys) -> None:
    klass = tmp_path / "class"
    for s in ("ada", "bob", "cy"):
        (klass / s).mkdir(parents=True)
    assert classroom.plan(klass, 2) == {"shard": [1, 2], "shards": [2]}
    assert classroom.plan(tmp_path / "nobody", 20) == {"shard": [1], "shards": [1]}
    assert ci.main(["plan", str(klass), "--shard-size", "20"]) == 0
    assert capsys.readouterr().out.splitlines() == ['matrix={"shard": [1], "shards": [1]}', "students=3", "go=true"]
    assert [classroom.shard_of(["a", "b", "c"], k, 2) for k in (1, 2)] == [["a", "c"], ["b"]]
    with pytest.raises(ValueError, match="shard must be one of 1, 2, got 3"):
        classroom.shard_of(["a"], 3, 2)
    with pytest.raises(ValueError, match="shard_size"):
        classroom.plan(klass, 0)
    shard = tmp_path / "shards" / "shard-1"
    classroom.write_csv([classroom.Row("ada", LESSON, 3, 4, "graded", "abc", "no", 2.0),
                         classroom.Row("cy", LESSON, 0, 4, "missing", notes=f"no {LESSON} in the submission")],
                        shard / "class.csv")
    (shard / "ada").mkdir()
    (shard / "ada" / "report.md").write_text("ada's report")
    out = tmp_path / "reports"
    summary = tmp_path / "summary.md"
    code = ci.main(["merge", str(tmp_path / "shards"), "--submissions", str(klass), "--out", str(out),
                           "--summary", str(summary)])
    assert code == 1  # bob's shard never reported: the run goes red, with bob's row in it
    rows = {r.student: r for r in classroom.read_csv(out / "class.csv")}
    assert (rows["bob"].status, rows["ada"].score, rows["cy"].status) == ("not graded", 3, "missing")
    assert (out / "ada" / "report.md").read_text() == "ada's report"
    assert "3 students" in summary.read_text() and "| bob | * | 0 / 0 | not graded |" in summary.read_text()
