"""Pipeline schedules against the papers' formulas and torch's own order; the real pipelined step against one process."""

import pytest
import torch

from m11_helpers.launch import launch
from m11_helpers.models import tiny_gpt
from m11_helpers.pipeline import (
    bubble_fraction,
    peak_in_flight,
    schedule_order,
    schedule_table,
    simulate,
    stage_orders,
    table_rows,
    tick_table,
    timeline_bubble,
)
from m11_helpers.pipeline_comm import p2p_bytes
from m11_helpers.pipeline_run import gather, naive_step, record_order, reference_step, run_schedules, split_tiny_gpt


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


@pytest.mark.parametrize("p,m", [(2, 2), (3, 5), (4, 4), (4, 6), (5, 8)])
def test_1f1b_tick_table_is_as_soon_as_possible_and_idles_the_formula(p, m):
    table = tick_table(p, m, "1f1b")  # one tick per forward or backward
    assert stage_orders(table, p) == [[(k, i) for k, i, _ in o] for o in schedule_order(p, m, "1f1b")]
    assert 1 - len(table) / (p * (1 + max(t for t, _ in table))) == pytest.approx(bubble_fraction(p, m))
    assert max(t for t, _ in table) + 1 == 2 * (m + p - 1)
    rows = table_rows(table, p)
    assert len(rows) == p and rows[0][1] == "F0" and rows[p - 1][p] == "F0" and rows[p - 1][p + 1] == "B0"


@pytest.mark.parametrize("p,configs", [(2, [("1f1b", 2), ("1f1b", 5), ("gpipe", 3)]),
                                       (3, [("1f1b", 3), ("1f1b", 7)]),
                                       (4, [("1f1b", 4), ("1f1b", 6), ("1f1b", 9), ("gpipe", 4)])])
def test_schedule_order_is_the_order_torch_runs(p, configs):
    # Recorded from the calls Schedule1F1B / ScheduleGPipe make on real ranks (exercise 4.2 relies on this
    # for p other than 4).
    res = launch(record_order, configs, num_processes=p, timeout=120)
    for k, (schedule, m) in enumerate(configs):
        assert [r[k] for r in res] == [[(kind, i) for kind, i, _ in o] for o in schedule_order(p, m, schedule)]


def test_p2p_message_size():
    assert p2p_bytes(1, 4096, 4096) == 4096 * 4096 * 2  # b·s·h in bf16 (Narayanan et al. 2021, §3.2)
    with pytest.raises(ValueError, match="hidden"):
        p2p_bytes(1, 4096, 0)


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
