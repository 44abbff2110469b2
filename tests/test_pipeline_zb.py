"""Schedules past 1F1B on 4 real ranks: torch's recorded order, its bubble in ticks against the papers, memory, bytes;
and the B/W split of one layer's backward against the fused backward."""

import pytest
import torch
from torch import nn

from m11_helpers.backward_split import (
    SplitBackward,
    compare_split,
    fused_backward,
    linear_input_grad,
    linear_weight_grad,
)
from m11_helpers.launch import launch
from m11_helpers.pipeline import schedule_order
from m11_helpers.pipeline_ticks import (
    TABLE_HEADER,
    bubble_fraction,
    bubble_ticks,
    idle_ticks,
    in_flight,
    plot_ticks,
    replay,
    schedule_table,
    tick_rows,
    zb_h1_order,
)
from m11_helpers.pipeline_zb import SCHEDULES, gather, reference_step, run_schedules, stage_indices


@pytest.fixture(scope="module")
def runs():
    return gather(launch(run_schedules, list(SCHEDULES), 8, num_processes=4, timeout=120))


def test_every_schedule_equals_one_process_and_runs_its_own_order(runs):
    loss, grads = reference_step(8)
    for name, r in runs.items():
        assert r["loss"] == pytest.approx(loss, abs=1e-6), name
        assert set(r["grads"]) == set(grads), name  # every layer's gradient, from the device that holds it
        for k, g in grads.items():
            torch.testing.assert_close(r["grads"][k], g, atol=1e-6, rtol=1e-5, msg=f"{name} {k}")
        kinds = {k for order in r["orders"] for k, _, _ in order}
        for order in r["orders"]:  # each (stage, micro): one forward, and a fused backward or B then W
            for s in {s for _, s, _ in order}:
                for i in range(8):
                    ops = [k for k, st, mb in order if (st, mb) == (s, i)]
                    assert ops in (["F", "BW"], ["F", "B", "W"]), (name, s, i, ops)
        expected = {"1f1b": {"F", "BW"}, "interleaved": {"F", "BW"}, "zb1p": {"F", "B", "W"},
                    "zbv": {"F", "B", "W"}, "dualpipev": {"F", "B", "W", "BW"}}[name]
        assert kinds == expected, name  # zero bubble splits the backward; DualPipeV splits only where it helps


def test_measured_bubble_against_the_formulas(runs):
    idle = {name: idle_ticks(replay(r["orders"], r["layers"])) for name, r in runs.items()}
    for name in ("1f1b", "interleaved", "zb1p"):  # exactly the papers' numbers: 18, 9, 6 ticks
        assert set(idle[name].values()) == {bubble_ticks(name, 4, 8)}, name
    assert bubble_ticks("zb1p", 4, 8) == bubble_ticks("1f1b", 4, 8) / 3  # ZB-H1: a third (Qi et al. §2.1)
    # ZB-V and DualPipeV: only the fill is left, (p−1) forwards of one chunk; DualPipe's table is an upper bound
    assert set(idle["zbv"].values()) == {3} and set(idle["dualpipev"].values()) == {3}
    assert 3 <= bubble_ticks("dualpipev", 4, 8)
    assert runs["zb1p"]["orders"] == zb_h1_order(4, 8)  # our ZB-H1 tick table is the order torch executed
    assert set(idle_ticks(replay(zb_h1_order(4, 8), 2)).values()) == {6}


def test_memory_and_bytes(runs):
    peak = {name: r["peak_activation_bytes"] for name, r in runs.items()}
    sent = {name: sum(r["sent_bytes"].values()) for name, r in runs.items()}
    # 1F1B: stage s holds p − s micro-batches, each 2 rows × 16 fp32 per saved tensor (128 B): 2 tensors on
    # stage 0 (its input is the batch, not an activation), 3 on the others (the received input too)
    assert peak["1f1b"] == {0: 4 * 2 * 128, 1: 3 * 3 * 128, 2: 2 * 3 * 128, 3: 1 * 3 * 128}
    for name in ("1f1b", "interleaved", "zbv", "dualpipev"):  # every activation freed by the end of the step
        assert set(runs[name]["left_after_step_bytes"].values()) == {0}, name
    assert max(peak["zbv"].values()) < max(peak["interleaved"].values())  # ZB-V: less than interleaving
    assert max(peak["dualpipev"].values()) > max(peak["zbv"].values())  # DualPipeV holds one more (PP + 1)
    assert sent["zbv"] == sent["dualpipev"] == 2 * sent["1f1b"]  # two chunks: twice the messages (Qi et al. §6)
    assert sent["interleaved"] > sent["zbv"]
    flight = {name: in_flight(replay(r["orders"], r["layers"])) for name, r in runs.items()}
    assert flight["1f1b"] == {0: 4, 1: 3, 2: 2, 3: 1} and set(flight["zb1p"].values()) == {4}
    rows = schedule_table(runs, 4, 8)
    assert [r[0] for r in rows] == list(SCHEDULES) and len(rows[0]) == len(TABLE_HEADER)


def test_replay_and_formulas_pure():
    # The lesson's own 1F1B order (m11_helpers.pipeline) replays to the same bubble as torch's.
    orders = [[("F" if k == "F" else "BW", s, i) for k, i, _ in order] for s, order in enumerate(schedule_order(4, 8, "1f1b"))]
    ops = replay(orders, 2)
    assert set(idle_ticks(ops).values()) == {18} and bubble_fraction(ops) == pytest.approx(3 / 11)
    assert len(tick_rows(ops)) == 4 and len(tick_rows(ops)[0]) == 1 + max(o.end for o in ops)
    import matplotlib

    matplotlib.use("Agg")
    ax = plot_ticks(replay(zb_h1_order(4, 8), 1))
    assert len(ax.patches) == 3 * 4 * 8 and ax.get_title() == "bubble 11.1%"  # one bar per F, B, W; 6 of 54 ticks
    h1 = zb_h1_order(4, 16)
    assert set(idle_ticks(replay(h1, 2)).values()) == {6}  # ZB-H1's bubble does not grow with m
    one_late = [o[:] for o in h1]
    one_late[3].insert(0, one_late[3].pop(1))  # the last device's B before its F: cannot run
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(one_late)
    bad = [list(reversed(o)) for o in orders]  # backwards before forwards: waits for ever
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(bad)
    assert stage_indices("zbv", 1, 4) == [1, 6] and stage_indices("interleaved", 1, 4) == [1, 5]
    for bad_call in (lambda: bubble_ticks("gpipe2", 4, 8), lambda: bubble_ticks("zbv", 4, 6),
                     lambda: replay([[("X", 0, 0)]])):
        with pytest.raises(ValueError, match="schedule|layers|kind"):
            bad_call()
    with pytest.raises(ValueError, match="schedule"):
        run_schedules(["zb2p"])  # checked before any collective


def _zb_orders(ms):
    return [run_schedules(["zb1p"], m, layers=3)[0]["order"] for m in ms]


def test_zb_h1_order_is_torchs_on_3_ranks():
    # Exercise 4.6 grades other sizes against zb_h1_order: it is what torch executes there too (m=6: 2 rounds)
    per_rank = launch(_zb_orders, [3, 5, 6], num_processes=3, timeout=120)
    for k, m in enumerate((3, 5, 6)):
        orders = [per_rank[d][k] for d in range(3)]
        assert orders == zb_h1_order(3, m), m
        assert set(idle_ticks(replay(orders, 1)).values()) == {bubble_ticks("zb1p", 3, 3, chunks=1)} == {2}


def test_split_backward_equals_fused():
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(6, 5), nn.GELU(), nn.Linear(5, 4))
    x, g = torch.randn(3, 6), torch.randn(3, 4)
    diff = compare_split(layer, x, g)
    assert diff["input"] <= 1e-6 and diff["weights"] <= 1e-6
    lin = nn.Linear(6, 4)
    split = SplitBackward(lin, x)
    gx = split.backward_input(g)
    assert lin.weight.grad is None  # B touched no weight gradient
    torch.testing.assert_close(gx, linear_input_grad(g, lin.weight))
    w = split.backward_weight()
    gw, gb = linear_weight_grad(g, x)
    torch.testing.assert_close(w["weight"], gw)
    torch.testing.assert_close(w["bias"], gb)
    fx, (fw, fb) = fused_backward(lin, x, g)
    torch.testing.assert_close(w["weight"], fw)
    torch.testing.assert_close(gx, fx)
    with pytest.raises(RuntimeError, match="freed"):
        split.backward_weight()
    with pytest.raises(RuntimeError, match="backward_input first"):
        SplitBackward(lin, x).backward_weight()
    wrong = linear_weight_grad(g, torch.randn(3, 6))[0]  # W from the wrong activations: a check must notice
    assert (wrong - fw).abs().max() > 1e-3
