"""The loss-spike guard: verdicts, the running median, skipped batches; and on real ranks, a run with
injected bad batches (a NaN, a spike) rolls back, skips them and ends bit-identical to a run that never read them."""

import math

import pytest
import torch

from m11_helpers.launch import launch
from m11_helpers.reference_run import loss_curve, run_train
from m11_helpers.spike_guard import (
    SPIKE_SCALE,
    RepeatedSpikes,
    SpikeGuard,
    bad_batches,
    inject,
    next_batch,
    parse_batches,
    skip_window,
)

RUN = ["--steps", 8, "--ckpt-every", 3, "--log-every", 100]


def test_verdicts_non_finite_and_spikes_against_the_running_median():
    g = SpikeGuard(factor=3.0, window=4, min_history=3)
    assert g.check(float("nan")) == "non-finite loss" and g.check(2.0, float("inf")) == "non-finite gradient norm"
    assert g.check(100.0) is None  # no history yet: a spike needs something to be compared with
    for loss in (4.0, 3.0, 2.0, 1.0, 1.0):
        g.accept(loss)
    assert g.history == [3.0, 2.0, 1.0, 1.0]  # the last `window` accepted losses
    assert g.check(4.6) == "loss spike: 4.6 > 3 × running median 1.5" and g.check(4.5) is None
    state = g.state_dict()
    h = SpikeGuard(factor=3.0, window=4, min_history=3)
    h.load_state_dict(state)
    assert h.history == g.history


def test_repeated_spikes_stop_the_run_and_bad_arguments_say_what_is_allowed():
    g = SpikeGuard(max_rollbacks=2)
    g.rolled_back("nan")
    g.rolled_back("nan")
    with pytest.raises(RepeatedSpikes, match="lower learning rate"):
        g.rolled_back("nan")
    for kwargs, name in (({"factor": 1.0}, "factor"), ({"window": 0}, "window"), ({"max_rollbacks": -1}, "max_rollbacks")):
        with pytest.raises(ValueError, match=name):
            SpikeGuard(**kwargs)


def test_data_position_skips_ranges():
    assert next_batch(5, []) == 5 and next_batch(5, [[3, 6]]) == 7
    assert next_batch(3, [[3, 4], [5, 8], [12, 12]]) == 9  # touching ranges are skipped in one go
    assert next_batch(12, [[12, 12], [10, 13]]) == 14  # overlapping, in any order
    assert skip_window(6, 7) == [6, 7] and parse_batches("12-15, 40") == [[12, 15], [40, 40]] and parse_batches("") == []
    for bad in ("3-1", "x", "4-"):
        with pytest.raises(ValueError, match="batches"):
            parse_batches(bad)
    with pytest.raises(ValueError, match="bad_batch"):
        skip_window(6, 5)
    assert bad_batches("7,11", "nan") == {7: "nan", 11: "nan"} and bad_batches("4,8", "nan,spike") == {4: "nan", 8: "spike"}
    assert bad_batches("", "nan") == {}
    with pytest.raises(ValueError, match="one per --inject-bad-batch batch"):
        bad_batches("4,8,9", "nan,spike")
    with pytest.raises(ValueError, match="--bad-batch-kind.*spike"):
        bad_batches("4", "inf")


def test_inject_is_a_labelled_simulation():
    loss = torch.tensor(2.0, requires_grad=True)
    assert inject(loss, "spike").item() == 2.0 * SPIKE_SCALE and math.isnan(inject(loss, "nan").item())
    with pytest.raises(ValueError, match="kind"):
        inject(loss, "oops")


def three_runs(folder):
    """One 2-rank launch, three trainings one after another in the same ranks (each its own `run_train`):
    the ranks start once, and DTensor's first-use costs are paid once, not three times."""
    hit = run_train(*RUN, "--ckpt-dir", folder, "--inject-bad-batch", "4,8", "--bad-batch-kind", "nan,spike")
    clean = run_train(*RUN, "--skip-batches", "3-4,8")
    poisoned = run_train(*RUN, "--steps", 6, "--inject-bad-batch", 4, "--no-guard")
    return {"hit": hit, "clean": clean, "poisoned": poisoned}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch(three_runs, tmp_path_factory.mktemp("spike"), num_processes=2, show_output=False)[0]


def test_injected_bad_batches_roll_back_skip_and_recover(runs):
    # one run, two drills: a NaN loss at batch 4, a ×1000 spike at batch 8 (against the running median of 6
    # accepted losses); each is caught before its step is applied, the run goes back to the newest checkpoint
    # (step 3, then step 6, which read batch 7) and skips from that checkpoint's data position through the bad
    # batch (PaLM's window): batches 3-4, then 8
    hit = runs["hit"]
    nan, spike = hit["rollbacks"]
    assert (nan["batch"], nan["to_step"], nan["skipped"]) == (4, 3, [3, 4]) and nan["reason"] == "non-finite loss"
    assert (spike["batch"], spike["to_step"], spike["skipped"]) == (8, 6, [8, 8])
    assert spike["reason"].startswith("loss spike")
    assert hit["skipped"] == [[3, 4], [8, 8]] and all(math.isfinite(v) for v in hit["losses"])
    # recovered = exactly the run an operator would restart by hand with those batches skipped, bit for bit
    clean = runs["clean"]
    assert clean["checksum"] == hit["checksum"] and loss_curve(clean) == loss_curve(hit)


def test_without_the_guard_one_nan_step_poisons_every_weight(runs):
    poisoned = runs["poisoned"]
    assert math.isnan(poisoned["losses"][4]) and math.isnan(poisoned["losses"][5])  # the step after, too
    assert all(math.isfinite(v) for v in poisoned["losses"][:4])
