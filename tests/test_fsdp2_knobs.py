"""FSDP2's knobs on 4 real ranks, one launch: each equals one process, and each moves memory and traffic as it should."""

import pytest
import torch

from m11_helpers.fsdp2_knobs import KNOBS, measure_knobs
from m11_helpers.launch import launch


@pytest.fixture(scope="module")
def knobs():
    return launch(measure_knobs, list(KNOBS), num_processes=4, timeout=180)[0]


def test_each_knob_equals_one_process(knobs):
    for k, r in knobs.items():
        assert r["grad_error"] < (5e-3 if k == "bf16" else 1e-6), k
        assert r["scatter_dtypes"] == {torch.float32}, k  # gradients reduced in fp32 in every setting


def test_memory_and_traffic_move_as_the_knob_says(knobs):
    t, f, hpz, pre, bf = (knobs[k] for k in ("reshard=True", "reshard=False", "reshard=2", "prefetch=2", "bf16"))
    # reshard=False: no second gather in backward, parameters stay whole -> higher forward peak
    assert f["gathers"] < t["gathers"] and f["gather_wire_bytes"] < t["gather_wire_bytes"]
    assert f["forward_peak"] > hpz["forward_peak"] > t["forward_peak"]  # hpZ keeps 1/2 after forward, between
    # hpZ: backward's gathers inside groups of 2, fewer wire bytes than gathering over all 4 again
    assert hpz["gather_groups"] == {2, 4} and f["gather_wire_bytes"] < hpz["gather_wire_bytes"] < t["gather_wire_bytes"]
    # explicit prefetch of 2 blocks: same traffic, more held at once
    assert pre["gather_wire_bytes"] == t["gather_wire_bytes"] and pre["forward_peak"] > t["forward_peak"]
    # bf16 parameters: gathered in bf16, half the bytes
    assert bf["gather_dtypes"] == {torch.bfloat16} and bf["gather_wire_bytes"] == t["gather_wire_bytes"] / 2
    assert knobs["cpu_offload"]["grad_error"] < 1e-6  # runs; on a CPU-only machine it saves nothing to show


def test_bad_knob():
    with pytest.raises(ValueError, match="knob"):
        measure_knobs(["reshard=3"])
