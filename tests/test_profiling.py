"""The step-time split on hand-made intervals, and a real 2-rank DDP profile."""
import json

import pytest

from m11_helpers.profiling import (
    Event,
    is_comm,
    profile_data_parallel,
    split_events,
    split_step_time,
    union_length,
)


def test_union_and_split():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    s = split_step_time(windows=[(0, 10)], compute=[(0, 4), (3, 6)], comm=[(5, 8), (20, 30)])
    assert s == {"wall": 10, "comm": 3, "compute": 5, "other": 2, "overlap": 1}
    with pytest.raises(ValueError, match="compute"):
        split_step_time([(0, 1)], [(2, 1)], [])


def test_split_events_by_hand():
    ev = [Event("train_step", 1, 0, 100), Event("aten::linear", 1, 10, 40), Event("aten::addmm", 1, 12, 38),
          Event("gloo:all_reduce", 3, 30, 60), Event("aten::mul", 1, 50, 70), Event("aten::copy_", 3, 0, 100),
          Event("aten::add", 1, 120, 150), Event("c10d::allreduce_", 1, 90, 110)]
    # comm (30, 60) + (90, 100); compute ∪ comm within the step: (10, 70) + (90, 100); the gloo thread's aten op is not compute
    assert split_events(ev) == {"wall": 100, "comm": 40, "compute": 30, "other": 30, "overlap": 20}
    with pytest.raises(ValueError, match="train_step"):
        split_events(ev[1:])


def test_is_comm():
    assert is_comm("gloo:all_reduce") and is_comm("c10d::allreduce_") and is_comm("nccl:all_reduce")
    assert not is_comm("aten::mm")


def test_profile_two_ranks(tmp_path):
    res = profile_data_parallel(2, steps=1, warmup=1, trace_dir=str(tmp_path), return_events=True)
    assert [r["rank"] for r in res] == [0, 1]
    for r in res:
        parts = r["compute_ms"] + r["comm_ms"] + r["other_ms"]
        assert abs(parts - r["wall_ms"]) < 1e-6 * max(1.0, r["wall_ms"])
        assert r["compute_ms"] > 0 and r["comm_ms"] > 0  # DDP all-reduced the gradients
        trace = json.loads(open(r["trace"]).read())
        assert any(e.get("name") == "train_step" for e in trace["traceEvents"])
        split = split_events(r["events"])  # the same split from the events a rank can return
        assert split["wall"] / 1e3 == pytest.approx(r["wall_ms"]) and split["comm"] / 1e3 == pytest.approx(r["comm_ms"])

