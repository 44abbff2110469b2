"""FSDP2 on a CPU mesh: Ψ/N per rank measured, gradients equal DDP's, 2Ψ vs 3Ψ counted; Accelerate's CPU fallback."""

import pytest

from m11_helpers.config import TINY_GPT, param_count
from m11_helpers.fsdp import TrafficCounter, accelerate_fsdp_probe, fsdp_step_report, is_sharded
from m11_helpers.launch import launch
from m11_helpers.models import mlp

PSI = param_count(TINY_GPT)


def _both_modes():
    return [fsdp_step_report(True), fsdp_step_report(False)]


def test_fully_shard_on_2_processes_shards_and_counts_traffic():
    out = launch(_both_modes, num_processes=2, show_output=False)
    for zero3, zero2 in out:
        for r in (zero3, zero2):
            assert r["num_params"] == PSI and r["local_params"] == PSI // 2  # Ψ/N exactly
            assert r["max_grad_diff_vs_ddp"] <= 1e-6
            assert r["reduce_scatter"] == PSI
        assert zero3["all_gather"] == 2 * PSI  # forward + backward: 3Ψ with the reduce-scatter
        assert zero2["all_gather"] == PSI  # kept after forward: 2Ψ


def test_fully_shard_on_4_processes():
    out = launch(fsdp_step_report, True, num_processes=4, show_output=False)
    assert [r["local_params"] for r in out] == [PSI // 4] * 4
    assert all(r["max_grad_diff_vs_ddp"] <= 1e-6 for r in out)


def test_accelerate_fsdp_on_cpu_falls_back_to_ddp():
    out = launch(accelerate_fsdp_probe, num_processes=2, show_output=False)
    for r in out:
        assert r["distributed_type"].endswith("MULTI_CPU")
        assert r["wrapper"] == "DistributedDataParallel" and not r["sharded"]
        assert r["local_params"] == sum(p.numel() for p in mlp().parameters())


def test_plain_module_is_not_sharded_and_counter_refuses_it():
    m = mlp()
    assert not is_sharded(m)
    with pytest.raises(ValueError, match="fully_shard"):
        TrafficCounter().attach(m)


def test_accelerate_launch_refuses_use_fsdp_with_cpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    accelerate = Path(sys.executable).with_name("accelerate")
    run = subprocess.run([str(accelerate), "launch", "--use_fsdp", "--cpu", "--num_processes", "2", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "ran" not in run.stdout
    assert "only use one of `--cpu`" in run.stderr
