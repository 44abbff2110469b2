"""`m11 gpu-check` without a GPU: the listing, the no-GPU path, the runner and the report writer (CPU tests).

The checks themselves need a CUDA GPU; they run when an instructor (or CI with a GPU) runs the command.
"""

from __future__ import annotations

import pytest
import torch

from m11_helpers.tools import gpu_check
from m11_helpers.tools.gpu_check import CHECKS, Result, main, report_markdown, run_checks
from m11_helpers.tools.gpu_check.checks import Check, Outcome, Skip, datasheet_chip


def test_list_names_every_check(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(c.name in out and c.what in out for c in CHECKS)
    names = {c.name for c in CHECKS}
    assert {"nccl-launch", "matmul", "train-step", "sdpa", "fp16-scaler", "fsdp2", "train-script", "dcp",
            "notebooks"} <= names


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the no-GPU path does not apply")
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


def test_runner_isolates_failures_skips_and_budget(monkeypatch):
    def boom(ctx):
        raise RuntimeError("CUDA error: out of memory")

    def skip(ctx):
        raise Skip("needs 2 GPUs, found 1")

    fake = [Check("ok", "", lambda ctx: Outcome("42 TFLOP/s")), Check("bad", "", boom), Check("skip", "", skip)]
    monkeypatch.setattr(gpu_check, "CHECKS", fake)
    results = run_checks(echo=False)
    assert [(r.name, r.status) for r in results] == [("ok", "passed"), ("bad", "failed"), ("skip", "skipped")]
    assert results[1].figure == "RuntimeError: CUDA error: out of memory" and results[2].figure == "needs 2 GPUs, found 1"
    late = run_checks(budget_s=-1, echo=False)  # every check would start after the budget: none runs
    assert all(r.status == "skipped" and "budget" in r.figure for r in late)
    assert [r.name for r in run_checks(["skip"], echo=False)] == ["skip"]


def test_report_has_a_line_per_check_and_a_summary():
    text = report_markdown([Result("matmul", "passed", "bf16 700 TFLOP/s (71% of 989.4)", 12.0),
                            Result("fsdp2", "failed", "RuntimeError: x | y", 3.5),
                            Result("nccl-launch", "skipped", "one GPU", 0)], "torch 2.13 · 1× H100")
    lines = text.splitlines()
    assert "| matmul | ✔ passed | 12 | bf16 700 TFLOP/s (71% of 989.4) |" in lines
    assert "| fsdp2 | ✘ failed | 3.5 | RuntimeError: x / y |" in lines  # a '|' would break the table
    assert lines[-1] == "1 passed, 1 failed, 1 skipped."


def test_datasheet_rows_are_found_from_cuda_device_names():
    assert datasheet_chip("NVIDIA H100 80GB HBM3").name.startswith("H100")
    assert datasheet_chip("NVIDIA A100-SXM4-80GB").name.startswith("A100")
    assert datasheet_chip("NVIDIA GeForce RTX 4090") is None
