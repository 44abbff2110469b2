"""Lesson 05's 4-rank launch: plain fully_shard (Ψ/4 per rank, gradients equal DDP's) and sharded Muon (the slice alone
is wrong, the gathered matrix right, and what the gather costs); FSDP2's knobs refuse a bad setting.

Each knob's behaviour (equal to one process, memory and traffic moving as it says) is asserted where it is measured:
the lesson notebook's knobs slide (course/05_zero_fsdp.ipynb, run by tests/test_course_notebooks.py), whose 4-rank
launch would otherwise run a second time here.
"""

import pytest

from m11_helpers.config import TINY_GPT, param_count
from m11_helpers.fsdp import fsdp_step_report
from m11_helpers.fsdp2_knobs import measure_knobs
from m11_helpers.launch import launch
from m11_helpers.sharded_muon import sharded_muon_step


def _four_ranks():  # one launch for both (each launch costs seconds)
    return fsdp_step_report(True), sharded_muon_step(64, 32)


@pytest.fixture(scope="module")
def four():
    return launch(_four_ranks, num_processes=4, timeout=180)


def test_fully_shard_on_4_processes(four):
    assert [r["local_params"] for r, _ in four] == [param_count(TINY_GPT) // 4] * 4
    assert all(r["max_grad_diff_vs_ddp"] <= 1e-6 for r, _ in four)


def test_sharded_muon_needs_the_gather(four):
    for _, r in four:
        assert r["local_error"] > 0.05  # Newton–Schulz on a slice is not the slice of Newton–Schulz
        assert r["gathered_error"] < 1e-5  # gather first: equal to one process
        assert r["adamw_error"] < 1e-6 and r["adamw_extra_bytes"] == 0  # element-wise: no gather needed
        assert r["extra_gather_wire_bytes"] == 3 / 4 * r["matrix_bytes"] == 6144


def test_bad_knob():
    with pytest.raises(ValueError, match="knob"):
        measure_knobs(["reshard=3"])
