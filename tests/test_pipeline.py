"""Pipeline schedules against the papers' formulas; the real pipelined step against one process."""

import pytest
import torch

from m11_helpers.launch import launch
from m11_helpers.models import tiny_gpt
from m11_helpers.pipeline import (
    bubble_fraction,
    gather,
    naive_step,
    peak_in_flight,
    reference_step,
    run_schedules,
    schedule_order,
    schedule_table,
    simulate,
    split_tiny_gpt,
    timeline_bubble,
)


def test_bubble_fraction_worked_examples():
    # GPipe (Huang et al. 2019 §2.2): 4 stages; 1 batch -> 3/4 idle, 4 -> 3/7, 16 -> 3/19.
    assert bubble_fraction(4, 1) == pytest.approx(0.75)
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert bubble_fraction(4, 8, "1f1b") == bubble_fraction(4, 8, "gpipe")  # 1F1B saves memory, not bubble
    # Interleaved (Narayanan et al. 2021 §2.2.2): bubble/ideal = (p-1)/(v m) -> idle fraction (p-1)/(v m + p - 1).
    assert bubble_fraction(4, 8, "interleaved", chunks=2) == pytest.approx(3 / 19)


@pytest.mark.parametrize("bad", [dict(stages=0, microbatches=4), dict(stages=4, microbatches=0),
                                 dict(stages=4, microbatches=4, schedule="zb"),
                                 dict(stages=4, microbatches=4, chunks=2),
                                 dict(stages=4, microbatches=6, schedule="interleaved", chunks=2)])
def test_bad_input_names_parameter(bad):
    with pytest.raises(ValueError, match="stages|microbatches|schedule|chunks"):
        bubble_fraction(**bad)


@pytest.mark.parametrize("schedule,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (4, 16), (8, 16)])
def test_simulated_bubble_equals_formula(schedule, chunks, p, m):
    ops = simulate(p, m, schedule, chunks)
    assert timeline_bubble(ops) == pytest.approx(bubble_fraction(p, m, schedule, chunks))
    assert len(ops) == 2 * p * m * chunks  # every (stage, micro, chunk) forward and backward exactly once


def test_in_flight_gpipe_m_vs_1f1b_p():
    assert peak_in_flight(simulate(4, 8, "gpipe")) == {0: 8, 1: 8, 2: 8, 3: 8}
    assert peak_in_flight(simulate(4, 8, "1f1b")) == {0: 4, 1: 3, 2: 2, 3: 1}  # stage s holds p - s


def test_gpipe_table_first_ticks():
    table = schedule_table(simulate(3, 2, "gpipe", t_f=1, t_b=1))
    assert table[(0, 0)] == "F0" and table[(1, 0)] == "F1" and table[(1, 1)] == "F0" and table[(3, 2)] == "F1"
    assert table[(4, 2)] == "B0" and table[(6, 0)] == "B0" and table[(7, 0)] == "B1"
    assert len(table) == 12


def test_1f1b_order_alternates_after_warmup():
    order = schedule_order(4, 6, "1f1b")[1]  # stage 1: 2 warm-up forwards, then F, B alternate
    assert [k for k, _, _ in order[:6]] == ["F", "F", "F", "B", "F", "B"]


def test_stages_compose_to_the_model():
    model = tiny_gpt(0)
    idx = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))  # (B, T)
    x = idx
    for stage in split_tiny_gpt(model, 4):
        x = stage(x)
    torch.testing.assert_close(x, model(idx))
    with pytest.raises(ValueError, match="stages"):
        split_tiny_gpt(model, 5)


def test_pipelined_step_equals_unpipelined_on_4_ranks():
    loss, ref = reference_step(batch=8)
    res = launch(run_schedules, [("gpipe", 4), ("1f1b", 8)], 8, 0, 0.0, 0.0, num_processes=4, timeout=120)
    for k, expected_peak in enumerate([{0: 4, 1: 4, 2: 4, 3: 4}, {0: 4, 1: 3, 2: 2, 3: 1}]):
        got = gather([r[k] for r in res])
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        assert set(got["grads"]) == set(ref)
        for name, g in ref.items():
            torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6)
        assert got["peak_in_flight"] == expected_peak
        assert len(got["ops"]) == 2 * 4 * res[0][k]["microbatches"]


def test_naive_split_equals_unpipelined_on_2_ranks():
    loss, _ = reference_step(batch=8)
    res = launch(naive_step, 8, 0, 0.0, 0.0, num_processes=2)
    assert res[1]["loss"] == pytest.approx(loss, rel=1e-6)
    assert [o.kind for o in res[0]["ops"] + res[1]["ops"]] == ["F", "B", "F", "B"]
