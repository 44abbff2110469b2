"""`m11 gpu-check` without a GPU: the listing, the no-GPU path, the runner and the report writer (CPU tests).

The checks themselves need a CUDA GPU; they run when an instructor (or CI with a GPU) runs the command.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
import torch

from m11_helpers import environment as environment_module
from m11_helpers.launch.base import gpu_count
from m11_helpers.throughput import chip_for
from m11_helpers.tools import gpu_check
from m11_helpers.tools.gpu_check import (
    CHECKS,
    Result,
    _environment_line,
    _selected,
    all_checks,
    main,
    report_markdown,
    run_checks,
)
from m11_helpers.tools.gpu_check.checks import Check, datasheet_chip
from support import gpu_checks as fake

ROOT = Path(__file__).resolve().parents[1]


def test_list_names_every_check(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(c.name in out and c.what in out for c in CHECKS)
    names = {c.name for c in CHECKS}
    assert {"nccl-launch", "matmul", "train-step", "sdpa", "fp16-scaler", "fsdp2", "train-script", "dcp"} <= names
    lessons = sorted(p.name[:2] for p in (ROOT / "course").glob("[0-9][0-9]_*.ipynb"))
    assert len(lessons) >= 13  # inside the repository: one nbval and one grading line per lesson
    for n in lessons:
        assert f"nbval-{n}" in out and f"grade-{n}" in out
    assert "groups: notebooks, grading" in out


def test_only_selects_a_lesson_or_a_group_and_refuses_unknown_names(capsys):
    checks = all_checks(ROOT)
    pick = lambda *names: [c.name for c in checks if _selected(c, list(names))]  # noqa: E731
    assert pick("grade-05", "matmul") == ["matmul", "grade-05"]
    assert pick("notebooks") == [c.name for c in checks if c.name.startswith("nbval-")]
    assert len(pick("grading")) == len(pick("notebooks")) >= 13
    assert all(c.run.keywords["notebook"].startswith(c.name.split("-")[1]) for c in checks if "-" in c.name
               and c.name.split("-")[1].isdigit())  # each check runs its own lesson's notebook
    with pytest.raises(SystemExit):
        main(["--only", "grade-99"])
    assert "grade-99: no such check" in capsys.readouterr().err
    assert all_checks(None) == CHECKS  # outside the repository: the machine's checks only


@pytest.mark.skipif(gpu_count() == 0, reason="needs a visible CUDA GPU: nbval-00 and grade-00 run the course's ranks "
                    "on it (`m11 gpu-check --only notebooks` / `grading` on a GPU box)")
def test_real_course_runs_on_a_gpu_give_one_line_each_with_full_marks():
    results = run_checks(["nbval-00", "grade-00"], budget_s=600, repo=ROOT, echo=False)
    assert [(r.name, r.status) for r in results] == [("nbval-00", "passed"), ("grade-00", "passed")], results
    assert "points in" in results[1].figure and results[1].seconds > 0


# gpu_count(), not torch.cuda.is_available(): that initialises the CUDA driver in this process (launches after it fail)
@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: the no-GPU path does not apply")
def test_without_a_gpu_it_says_so_runs_nothing_and_exits_0(tmp_path, capsys):
    report = tmp_path / "gpu-check.md"
    assert main(["--out", str(report)]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
    assert not report.exists()


def test_bad_arguments_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["--only", "no-such-check"])
    assert e.value.code == 2
    assert main(["--budget", "0"]) == 2


def test_each_check_runs_in_a_process_of_its_own_and_failures_stay_there(monkeypatch):
    fake_checks = [Check("pid-a", "", fake.reports_its_pid), Check("bad", "", fake.fails),
                   Check("skip", "", fake.skips), Check("dies", "", fake.dies), Check("pid-b", "", fake.reports_its_pid)]
    monkeypatch.setattr(gpu_check, "CHECKS", fake_checks)
    results = run_checks(echo=False)
    assert [(r.name, r.status) for r in results] == [("pid-a", "passed"), ("bad", "failed"), ("skip", "skipped"),
                                                     ("dies", "failed"), ("pid-b", "passed")]
    assert results[1].figure == "RuntimeError: CUDA error: out of memory" and results[2].figure == "needs 2 GPUs, found 1"
    assert "died" in results[3].figure  # a crash is a failed line; the next check still runs
    pids = {int(results[0].figure), int(results[4].figure)}
    assert len(pids) == 2 and os.getpid() not in pids  # a fresh process per check, never this one
    late = run_checks(budget_s=-1, echo=False)  # every check would start after the budget: none runs
    assert all(r.status == "skipped" and "budget" in r.figure for r in late)
    assert [r.name for r in run_checks(["skip"], echo=False)] == ["skip"]


def test_a_check_that_outruns_the_budget_is_stopped(monkeypatch):
    monkeypatch.setattr(gpu_check, "CHECKS", [Check("hangs", "", fake.hangs)])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    [res] = run_checks(budget_s=5, echo=False)
    assert res.status == "failed" and "did not finish within the 5 s left of the budget" in res.figure
    assert time.monotonic() - start < 5 * 3  # stopped at the budget, plus a margin proportional to it
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


def test_the_environment_line_does_not_initialise_cuda(monkeypatch):
    def poisons_fork(*args, **kwargs):
        raise AssertionError("initialises CUDA: every launch(device='cuda') check after it would fail")

    monkeypatch.setattr(torch.cuda, "_lazy_init", poisons_fork)
    monkeypatch.setattr(torch.cuda, "is_available", poisons_fork)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(environment_module, "_nvml_devices", lambda: [("GPU-a", "NVIDIA H200"), ("GPU-b", "NVIDIA H200")])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "2× NVIDIA H200 ·" in _environment_line()


def test_report_has_a_line_per_check_and_a_summary():
    text = report_markdown([Result("matmul", "passed", "bf16 700 TFLOP/s (71% of 989.4)", 12.0),
                            Result("fsdp2", "failed", "RuntimeError: x | y", 3.5),
                            Result("nccl-launch", "skipped", "one GPU", 0)], "torch 2.13 · 1× H100")
    lines = text.splitlines()
    assert "| matmul | ✔ passed | 12 | bf16 700 TFLOP/s (71% of 989.4) |" in lines
    assert "| fsdp2 | ✘ failed | 3.5 | RuntimeError: x / y |" in lines  # a '|' would break the table
    assert lines[-1] == "1 passed, 1 failed, 1 skipped."


def test_datasheet_rows_come_from_the_course_s_one_name_lookup():
    assert datasheet_chip("NVIDIA H100 80GB HBM3").name == chip_for("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert datasheet_chip("NVIDIA A100-SXM4-80GB").name == "A100 SXM 80GB"
    assert datasheet_chip("NVIDIA H200").name == "H200 SXM"
    # other clocks and power limits than the SXM parts, or another datasheet: no peak rather than a wrong one
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB",
                 "NVIDIA GeForce RTX 4090"):
        assert chip_for(name) is None and datasheet_chip(name) is None, name


@pytest.mark.skipif(gpu_count() == 0, reason="needs a visible CUDA GPU (make test hides them: run "
                    "`pytest tests/test_gpu_check.py -k real` on a GPU box)")
def test_real_checks_on_a_gpu_a_launch_check_passes_after_one_that_computed_on_the_gpu():
    # In one process, matmul's CUDA initialisation made every later launch(device="cuda") check fail.
    results = run_checks(["matmul", "fsdp2"], budget_s=300, echo=False)
    assert [(r.name, r.status) for r in results] == [("matmul", "passed"), ("fsdp2", "passed")], results
    assert torch.cuda.is_initialized() is False  # this process stayed out of CUDA
