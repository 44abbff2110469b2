"""The grading sandbox: a submission sees nothing but itself (not the solutions, other students' work, the
network), within limits on memory, processes and time, and every other file is left byte-for-byte intact.

Real processes throughout: bubblewrap's namespaces, real rlimits, real notebooks graded by `m11 grade`.
Fixtures in tests/data/grading/hostile/ (README.md there): submissions that read the solutions
(lesson 00, the attack that scored 6/6 unsandboxed), delete the class folder, write into the grading
package and solutions/, open a network connection, fork-bomb, allocate 30 GB, sleep past the limit,
or forge "passed" records in the grader's cell log (5/5 unsandboxed).
Tests that need the sandbox skip, saying why, where bubblewrap cannot run (`make test` installs it).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import psutil
import pytest

from m11_helpers.grading.classroom import command
from m11_helpers.grading.classroom import grade_class as classroom
from m11_helpers.grading.engine import grader
from m11_helpers.grading.sandbox import isolate as sandbox
from m11_helpers.grading.sandbox import walls
from m11_helpers.grading.sandbox.isolate import GIB, Limits

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "grading"
HOSTILE = DATA / "hostile"
ISOLATED, WHY = sandbox.available()
needs_sandbox = pytest.mark.skipif(not ISOLATED, reason=f"no sandbox on this machine: {WHY}")


def tree(*roots: Path) -> dict[str, str]:
    """Every file under roots (and each link's target), hashed: equal before and after means byte-for-byte intact."""
    out = {}
    for root in roots:
        for p in sorted([root, *root.rglob("*")] if root.is_dir() else [root]):
            key = str(p)
            if p.is_symlink():
                out[key] = "-> " + os.readlink(p)
            elif p.is_file():
                out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def survivors(marker: str) -> list[int]:
    """Processes still carrying this run's M11_GRADE_RUN marker."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("M11_GRADE_RUN") == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def class_rows(out: Path) -> dict[str, dict]:
    return {r["student"]: r for r in csv.DictReader(open(out / "class.csv", encoding="utf-8"))}


def whys(out: Path, student: str) -> dict[str, str]:
    data = json.loads((out / student / "report.json").read_text())
    return {e["exercise"]: e["why"] for nb in data["notebooks"] for e in nb["exercises"]}


# ---------------------------------------------------------------- pieces, no sandbox needed

def test_mode_and_limits_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("M11_GRADE_SANDBOX", "maybe")
    with pytest.raises(ValueError, match="M11_GRADE_SANDBOX must be one of 'auto', 'require', 'off'"):
        sandbox.mode()
    monkeypatch.setenv("M11_GRADE_SANDBOX", "Require")
    assert sandbox.mode() == "require"
    monkeypatch.setenv("M11_GRADE_MEMORY_GIB", "0.5")
    monkeypatch.setenv("M11_GRADE_PROCESSES", "64")
    assert Limits.from_env() == Limits(memory=GIB // 2, processes=64)
    monkeypatch.setenv("M11_GRADE_PROCESSES", "-1")
    with pytest.raises(ValueError, match="M11_GRADE_PROCESSES"):
        Limits.from_env()


def test_environment_keeps_what_a_notebook_needs_and_drops_secrets() -> None:
    env = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "M11_GRADE_LOG": "/w/log", "M11_STRICT": "1",
           "GH_TOKEN": "ghp_secret", "AWS_SECRET_ACCESS_KEY": "x", "M11_CLASSROOM_TOKEN": "y", "HOME": "/root",
           "SSH_AUTH_SOCK": "/tmp/agent", "LC_ALL": "C.UTF-8"}
    inside = sandbox._environment(env, "/submission", "/home/student")
    assert not {"GH_TOKEN", "AWS_SECRET_ACCESS_KEY", "M11_CLASSROOM_TOKEN", "SSH_AUTH_SOCK"} & set(inside)
    assert inside["HOME"] == "/home/student" and inside["M11_GRADE_CWD"] == "/submission"
    assert {k: inside[k] for k in ("PATH", "OMP_NUM_THREADS", "M11_GRADE_LOG", "M11_STRICT", "LC_ALL")} == {
        k: env[k] for k in ("PATH", "OMP_NUM_THREADS", "M11_GRADE_LOG", "M11_STRICT", "LC_ALL")}


def test_the_copy_never_follows_links_or_opens_fifos(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the hidden tests")
    sub = tmp_path / "class" / "ada"
    (sub / "data").mkdir(parents=True)
    (sub / "05.ipynb").write_text("{}")
    (sub / "data" / "x.csv").write_text("1,2")
    (sub / "peek.txt").symlink_to(secret)
    (sub / "up").symlink_to(tmp_path)
    (sub / ".git").mkdir()
    os.mkfifo(sub / "pipe")  # a copy that opened it would block for ever
    sandbox._copy(sub, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert sorted(p.name for p in copy.rglob("*")) == ["05.ipynb", "data", "peek.txt", "up", "x.csv"]
    assert (copy / "peek.txt").is_symlink() and os.readlink(copy / "peek.txt") == str(secret)
    assert (copy / "up").is_symlink() and not (copy / ".git").exists()


def test_binds_hold_python_and_the_package_never_the_repository_or_the_class(tmp_path: Path) -> None:
    student = tmp_path / "class" / "ada"
    student.mkdir(parents=True)
    binds = sandbox._readonly_binds(student, os.pathsep.join([str(REPO), str(REPO / "tests"), str(tmp_path)]))
    bound = [Path(src) for _, src, _ in binds]
    assert sandbox.PACKAGE in bound and Path("/usr") in bound
    secrets = [REPO / "solutions", REPO / "tests", REPO / ".git", student.parent]
    for path in bound:
        assert not any(path == s or path in s.parents or s in path.parents for s in secrets), path
    assert any(Path(sys.prefix).resolve() == p or p in Path(sys.prefix).resolve().parents for p in bound)


def test_walls_name_the_limit_in_the_cell_log(tmp_path: Path) -> None:
    log = tmp_path / "cells.jsonl"
    records = [{"event": "result", "cell": 1, "outcome": "failed", "ename": "MemoryError", "evalue": ""},
               {"event": "result", "cell": 2, "outcome": "failed", "ename": "BlockingIOError",
                "evalue": "[Errno 11] Resource temporarily unavailable"},
               {"event": "result", "cell": 3, "outcome": "failed", "ename": "OSError",
                "evalue": "[Errno 101] Network is unreachable"},
               {"event": "result", "cell": 4, "outcome": "failed", "ename": "AssertionError",
                "evalue": "Exercise 1.1: wrong\n  hint: divide", "message": "MemoryError in the cell's code"},
               {"event": "result", "cell": 5, "outcome": "passed"}]
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"cut short')
    walls.annotate(log, Limits(memory=2 * GIB, processes=99))
    got = [json.loads(line) for line in log.read_text().splitlines()[:5]]
    assert got[0]["evalue"] == "[sandbox: stopped by the sandbox's memory limit: 2 GiB per process (RLIMIT_DATA)]"
    assert "99 processes (RLIMIT_NPROC)]" in got[1]["evalue"] and "no network" in got[2]["evalue"]
    assert got[3]["evalue"] == records[3]["evalue"] and got[4] == records[4]  # only the error itself counts
    walls.annotate(log, Limits(), walls=2)  # idempotent; unisolated runs name only their rlimits
    assert [json.loads(line) for line in log.read_text().splitlines()[:5]] == got


# ---------------------------------------------------------------- inside the real sandbox

PROBE = r'''
import errno, json, os, socket, sys
import m11_helpers.grading.checks as checks
os.chdir(os.environ["M11_GRADE_CWD"])  # where the grading plugin starts the kernel
out = {"uid": os.getuid(), "cwd": os.getcwd(), "root": sorted(os.listdir("/")), "env": sorted(os.environ),
       "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0]}
for name, path in json.loads(sys.argv[1]).items():
    out[name] = os.path.exists(path)
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
out["write_package"] = attempt(lambda: open(checks.__file__, "r+b").close())
out["write_own_copy"] = attempt(lambda: open("mine.txt", "w").write("x"))
out["network"] = attempt(lambda: socket.create_connection(("1.1.1.1", 443), timeout=5))
import resource
out["limits"] = [resource.getrlimit(resource.RLIMIT_DATA)[0], resource.getrlimit(resource.RLIMIT_NPROC)[0]]
import torch, torch.distributed as dist
from m11_helpers.launch import launch
def rank():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()
out["ranks"] = launch(rank, num_processes=2, show_output=False, timeout=120)
print(json.dumps(out))
'''


@needs_sandbox
@pytest.mark.slow
def test_inside_the_sandbox_only_the_submission_python_and_loopback(tmp_path: Path) -> None:
    klass, work = tmp_path / "class", tmp_path / "work"
    (klass / "ada").mkdir(parents=True)
    (klass / "bob").mkdir()
    (klass / "bob" / "05.ipynb").write_text("bob's work")
    (klass / "ada" / "probe.py").write_text(PROBE)
    work.mkdir()
    before = tree(klass)
    looks = {"solutions": str(REPO / "solutions"), "repo_git": str(REPO / ".git"), "bob": str(klass / "bob"),
             "class": str(klass)}
    env = {"PATH": os.environ["PATH"], "M11_GRADE_CWD": str(klass / "ada"), "GH_TOKEN": "ghp_secret",
           "OMP_NUM_THREADS": "1"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # isolated: no fallback warning
        proc = sandbox.popen([sys.executable, "/submission/probe.py", json.dumps(looks)], cwd=work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             limits=Limits(memory=3 * GIB, processes=200))
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    seen = json.loads(stdout.strip().splitlines()[-1])
    assert seen["cwd"] == "/submission" and seen["caps"] == "0000000000000000"
    assert not any(seen[k] for k in looks), seen  # absent, not merely unreadable
    assert "GH_TOKEN" not in seen["env"] and "M11_GRADE_CWD" in seen["env"]
    assert seen["write_package"] in ("EROFS", "EACCES") and seen["write_own_copy"] == "ok"
    assert seen["network"] == "ENETUNREACH"
    assert seen["limits"] == [3 * GIB, 200]
    assert seen["ranks"] == [3.0, 3.0]  # two real ranks, gloo over the sandbox's loopback
    assert tree(klass) == before  # its own copy took the write, not the class folder
    assert (work / "submission" / "mine.txt").read_text() == "x"


def _class(tmp_path: Path, members: dict[str, Path]) -> Path:
    klass = tmp_path / "class"
    for student, notebook in members.items():
        (klass / student).mkdir(parents=True)
        shutil.copy(notebook, klass / student / notebook.name)
    return klass


@needs_sandbox
@pytest.mark.slow
def test_hostile_class_scores_only_honest_work_and_leaves_every_file_intact(tmp_path, monkeypatch) -> None:
    """Lesson-00 demo fixtures: one honest, one that leaves daemons, seven hostile; all graded in one class run."""
    marker = f"sandbox-test-{uuid.uuid4().hex}"
    for key, value in {"M11_GRADE_SANDBOX": "require", "M11_GRADE_MEMORY_GIB": "1", "M11_GRADE_PROCESSES": "128",
                       "M11_GRADE_RUN": marker}.items():
        monkeypatch.setenv(key, value)
    shutil.copytree(DATA / "solutions", tmp_path / "solutions")
    hostile = ["delete_class", "write_solutions", "network", "fork_bomb", "memory_30gb", "sleep", "forge_log"]
    klass = _class(tmp_path, {"honest": DATA / "solutions" / "00_demo.ipynb",
                              "daemon": DATA / "submissions" / "daemon" / "00_demo.ipynb",
                              **{h: HOSTILE / h / "00_demo.ipynb" for h in hostile}})
    old = tmp_path / "class" / "zz_last_week"  # a graded folder from before: reports the deleter looks for
    old.mkdir()
    (old / "report.json").write_text('{"score": 5}')
    before = tree(klass, tmp_path / "solutions")
    out = tmp_path / "reports"
    assert command.main(["--class", str(klass), "--source", str(tmp_path / "solutions"), "--out", str(out),
                        "--cell-timeout", "15"]) == 0
    assert tree(klass, tmp_path / "solutions") == before
    assert not (REPO / "solutions" / "PWNED.txt").exists()  # the package itself: blocked, see its why below
    rows = class_rows(out)
    assert {s: (r["score"], r["max"]) for s, r in rows.items()} == {
        "honest": ("5", "5"), "daemon": ("5", "5"), "zz_last_week": ("0", "5"), **{h: ("0", "5") for h in hostile}}
    assert rows["zz_last_week"]["status"] == "missing"
    expected = {"delete_class": "listed /: ", "write_solutions": "[sandbox: blocked: read-only inside the sandbox]",
                "network": "[sandbox: blocked: the sandbox has no network (loopback only)]",
                "fork_bomb": "[sandbox: stopped by the sandbox's process limit: 128 processes (RLIMIT_NPROC)]",
                "memory_30gb": "[sandbox: stopped by the sandbox's memory limit: 1 GiB per process (RLIMIT_DATA)]",
                "sleep": "Timeout of 15 seconds", "forge_log": "not implemented yet"}
    for student, text in expected.items():
        assert text in whys(out, student)["0.1"], (student, whys(out, student))
    assert "deleted: []" in whys(out, "delete_class")["0.1"]
    assert "not implemented yet" in whys(out, "forge_log")["0.2"]  # its "passed" records never reached the log
    report = (out / "honest" / "report.md").read_text()
    assert "sandbox: bubblewrap" in report and "no network" in report.lower()
    assert not survivors(marker), "a process of the graded class outlived it (daemon, fork bomb)"


@needs_sandbox
@pytest.mark.slow
def test_class_of_three_honest_full_hostile_and_empty_zero(tmp_path, monkeypatch) -> None:
    """Lesson 00 for real: the solution reader that scored 6/6 gets 0; the launcher's ranks work inside."""
    monkeypatch.setenv("M11_GRADE_SANDBOX", "require")
    klass = _class(tmp_path, {"honest": REPO / "solutions" / "00_welcome.ipynb",
                              "reader": HOSTILE / "read_solutions" / "00_welcome.ipynb",
                              "empty": REPO / "exercises" / "00_welcome.ipynb"})
    before = tree(klass, REPO / "solutions" / "00_welcome.ipynb")
    out = tmp_path / "reports"
    assert command.main(["--class", str(klass), "--source", str(REPO / "solutions"), "--out", str(out)]) == 0
    assert tree(klass, REPO / "solutions" / "00_welcome.ipynb") == before
    rows = class_rows(out)
    assert {s: (r["score"], r["max"], r["status"]) for s, r in rows.items()} == {
        "honest": ("6", "6", "graded"), "reader": ("0", "6", "graded"), "empty": ("0", "6", "graded")}
    assert all("out of reach" in why for why in whys(out, "reader").values())


def test_the_reader_fixture_is_a_real_attack_without_the_sandbox(monkeypatch) -> None:
    """The reason for all this: unsandboxed, the lesson-00 reader finds solutions/ from the installed package.

    (Graded with M11_GRADE_SANDBOX=off it scores 6/6; here its search runs in-process, in milliseconds.)
    """
    import nbformat

    cells = [c for c in nbformat.read(HOSTILE / "read_solutions" / "00_welcome.ipynb", as_version=4).cells
             if c.get("metadata", {}).get("m11", {}).get("role") == "solution"]
    assert len(cells) == 3 and all(c.source.rstrip().endswith(f'exec(_steal("0.{i + 1}"))') for i, c in enumerate(cells))
    namespace: dict = {}
    monkeypatch.chdir(REPO / "exercises")  # an instructor grading inside the course repository
    exec(cells[0].source.rsplit("exec(", 1)[0], namespace)  # everything but the final exec
    solution = nbformat.read(REPO / "solutions" / "00_welcome.ipynb", as_version=4)
    wanted = [c.source for c in solution.cells if c.get("metadata", {}).get("m11") == {"exercise": "0.1",
                                                                                        "role": "solution"}]
    assert namespace["_steal"]("0.1") == wanted[0] and "### BEGIN SOLUTION" in wanted[0]


def test_without_isolation_the_report_says_so_loudly_and_require_refuses(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sandbox, "available", lambda: (False, "simulated: no bubblewrap"))
    monkeypatch.setenv("M11_GRADE_SANDBOX", "auto")
    klass = _class(tmp_path, {"ada": DATA / "solutions" / "00_demo.ipynb"})
    out = tmp_path / "reports"
    with pytest.warns(RuntimeWarning, match="NOT ISOLATED"):
        rows = classroom.grade_class(klass, DATA / "solutions", out, grader.grade_notebook, cell_timeout=30)
    assert [(r.student, r.score, r.max) for r in rows] == [("ada", 5, 5)]
    report = (out / "ada" / "report.md").read_text()
    assert "WARNING: NOT ISOLATED (simulated: no bubblewrap)" in report and "solutions/" in report
    monkeypatch.setenv("M11_GRADE_SANDBOX", "require")
    assert command.main(["--class", str(klass), "--source", str(DATA / "solutions"), "--out", str(out)]) == 2
