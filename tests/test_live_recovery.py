"""Live recovery (lesson 10) on real processes: SIGKILL a replica, the rest go on, a replacement rejoins bit-identical."""

import psutil
import pytest
import torch

from m11_helpers.live_recovery import live_recovery_drill
from m11_helpers.live_replica import flat_state, load_flat_state, model_and_opt, train_checksum


def test_a_killed_replica_is_dropped_and_replaced_without_a_restart():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    d = live_recovery_drill(replicas=3, steps=14, kill_rid=1, kill_at=4, rejoin_after=3, timeout=150)
    # nothing restarted: the survivors and the newcomer end on one state, bit for bit (weights, AdamW, step)
    assert set(d["checksums"]) == {0, 2, 3} and len(set(d["checksums"].values())) == 1, d["checksums"]
    assert set(d["steps"].values()) == {14}
    # the newcomer received the source's state as it stood at the join, and joined mid-run
    assert d["join_checksum"] == d["source_checksum_at_join"] and 4 < d["join_step"] < 14
    # quorums: all three, then the two survivors (detected by their failed collective), then with the newcomer
    assert [q["members"] for q in d["quorums"]] == [[0, 1, 2], [0, 2], [0, 2, 3]]
    failed_steps = {e["step"] for e in d["failures_seen"]}  # the SIGKILL lands during the step it saw, or the next
    assert len(failed_steps) == 1 and failed_steps <= {d["kill_step"], d["kill_step"] + 1}
    assert len(d["failures_seen"]) == 2  # both survivors saw their collective fail
    assert 0 < d["detect_s"] < 5
    # the loss curve: every step exactly once, equal to one process training on the whole global batch
    assert list(d["losses"]) == list(range(14))
    torch.testing.assert_close(torch.tensor(list(d["losses"].values())),
                               torch.tensor(list(d["reference_losses"].values())), rtol=1e-5, atol=1e-5)
    # nothing left running
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_flat_state_round_trips_bitwise_and_bad_arguments_are_refused():
    model, opt = model_and_opt(0, 1e-3)
    other, other_opt = model_and_opt(1, 1e-3)
    assert train_checksum(model, opt, 3) != train_checksum(other, other_opt, 3)
    assert load_flat_state(other, other_opt, flat_state(model, opt, 3)) == 3
    assert train_checksum(model, opt, 3) == train_checksum(other, other_opt, 3)
    for kwargs, name in (({"replicas": 1}, "replicas"), ({"kill_rid": 3}, "kill_rid"), ({"steps": 8}, "steps")):
        with pytest.raises(ValueError, match=name):
            live_recovery_drill(**kwargs)


def test_the_checkpoint_restart_drill_redoes_the_steps_since_the_checkpoint(tmp_path):
    from m11_helpers.live_recovery import reference_losses
    from m11_helpers.restart_drill import restart_drill

    d = restart_drill(tmp_path, ranks=3, steps=8, kill_at=6, every=4, timeout=150)
    assert d["resumed_from"] == 4 and d["redone_steps"] == 2
    redone = {s: d["losses"][s] for s in range(4, 6)}
    assert redone == {s: d["first_run_losses"][s] for s in range(4, 6)}  # resume is exact: the same bits again
    ref, _ = reference_losses(8)
    torch.testing.assert_close(torch.tensor(list(d["losses"].values())), torch.tensor(list(ref.values())),
                               rtol=1e-5, atol=1e-5)
    assert d["lost_s"] > d["detect_s"] > 0
    with pytest.raises(ValueError, match="kill_at"):
        restart_drill(tmp_path, steps=5, kill_at=5)
