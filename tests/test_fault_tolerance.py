"""Atomic checkpoints survive a kill mid-write; a real SIGTERM mid-run + resume is bit-identical on 2 ranks.

train_spot.py runs on forked ranks (its own `main`, in a fraction of a second). The launcher's part of a spot
notice (a SIGTERM to torchrun's agent, which forwards it to every rank; `PreemptionNotice.drill`, which both
scripts use) is tested once, under a real `accelerate launch` of the reference script: test_elastic_restart.py.
"""

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from m11_helpers.fault_tolerance import (
    PreemptionNotice,
    atomic_save,
    batch_indices,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    set_rng_state,
    state_checksum,
)
from m11_helpers.launch import LaunchError, launch
from m11_helpers.models import mlp
from m11_helpers.reference_run import script_module

STEPS = ["--steps", "24"]


def test_atomic_save_roundtrip_weights_only(tmp_path):
    model = mlp(seed=3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": rng_state(), "step": 7},
                tmp_path / "c.pt")
    state = load_checkpoint(tmp_path / "c.pt")
    assert state["step"] == 7 and [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temp file left
    other = mlp(seed=4)
    other.load_state_dict(state["model"])
    assert state_checksum(other) == state_checksum(model)
    with pytest.raises(ValueError, match="path"):
        load_checkpoint(tmp_path / "missing.pt")


def test_rng_state_roundtrip_restores_every_generator(tmp_path):
    import random

    import numpy as np

    atomic_save(rng_state(), tmp_path / "r.pt")
    a = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(load_checkpoint(tmp_path / "r.pt"))  # through weights_only=True
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def _writer(path):
    # The child blocks forever inside fsync (after writing, before the rename) until it is killed.
    os.fsync = lambda fd: time.sleep(3600)
    atomic_save({"w": torch.full((1000,), 2.0), "step": 2}, path)


def test_kill_during_write_leaves_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "last.pt"
    atomic_save({"w": torch.full((1000,), 1.0), "step": 1}, path)
    pid = os.fork()
    if pid == 0:
        try:
            _writer(path)
        finally:
            os._exit(1)
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob(".last.pt.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)  # the machine is reclaimed mid-save
    os.waitpid(pid, 0)
    assert list(tmp_path.glob(".last.pt.*.tmp")), "the writer should have been killed mid-save"
    state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["w"], torch.full((1000,), 1.0))
    assert latest_checkpoint(tmp_path) == path  # the torn temporary file is never picked


def test_batch_indices_is_a_permutation_per_epoch():
    rows = torch.cat([batch_indices(s, 32, 512, seed=0) for s in range(16)])
    assert torch.equal(rows.sort().values, torch.arange(512))
    assert not torch.equal(batch_indices(16, 32, 512), batch_indices(0, 32, 512))  # next epoch reshuffled
    with pytest.raises(ValueError, match="global_batch"):
        batch_indices(0, 0, 10)


def _agree(signal_rank):
    notice = PreemptionNotice()
    before = notice.agreed()
    if dist.get_rank() == signal_rank:
        os.kill(os.getpid(), signal.SIGTERM)  # the notice reaches ONE rank
    # device=: the flag lives where the group can reduce it (the training device under NCCL; CPU under gloo)
    return before, notice.received, notice.agreed(device="cpu"), notice.agreed(group=dist.new_group([0, 1]))


def test_ranks_agree_when_only_one_got_the_notice():
    out = launch(_agree, 1, num_processes=2, show_output=False)
    assert out == [(False, False, True, True), (False, True, True, True)]


def test_fsync_dir_is_best_effort(tmp_path):
    from m11_helpers import fault_tolerance

    fault_tolerance.fsync_dir(tmp_path)  # a directory: no error
    fault_tolerance.fsync_dir(tmp_path / "missing")  # best effort: a missing folder is not an error either


SPOT = script_module("train_spot.py")  # imported here: the forked ranks inherit it and what it imports


def spot(*argv):
    """train_spot.py's own `main` on 2 forked ranks (m11_helpers.launch): each rank's report, in rank order."""
    return launch(SPOT.main, [*STEPS, *argv], num_processes=2, show_output=False, timeout=120)


def reference_then_accelerate_state(folder):
    """One 2-rank launch, three runs one after another in the same ranks: the uninterrupted reference; then
    with Accelerate's save_state, a spot notice after step 9 (what it left in `folder`, as rank 0 saw it)
    and the --resume that finishes."""
    reference = SPOT.main([*STEPS, "--ckpt-dir", "/nonexistent-never-written"])
    pre = SPOT.main([*STEPS, "--ckpt-dir", folder, "--accelerate-state", "--preempt-at", 9])
    left = {p.name: sorted(q.name for q in p.iterdir()) for p in folder.iterdir()} if folder.is_dir() else {}
    resumed = SPOT.main([*STEPS, "--ckpt-dir", folder, "--accelerate-state", "--resume"])
    return {"reference": reference, "pre": pre, "left": left, "resumed": resumed}


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    out = launch(reference_then_accelerate_state, tmp_path_factory.mktemp("acc") / "ckpt", num_processes=2,
                 show_output=False, timeout=120)
    return {key: [r[key] for r in out] for key in out[0]}


@pytest.fixture(scope="module")
def reference(forked):
    assert [r["done"] for r in forked["reference"]] == [True, True]
    return forked["reference"][0]


def notice_then_finish(ckpt):
    """One 2-rank launch, two runs one after another in the same ranks: resumed from the newest periodic checkpoint,
    a real SIGTERM after step 14 (rank 0 to itself: forked ranks have no agent above them); then the --resume that
    finishes."""
    return SPOT.main([*STEPS, "--ckpt-dir", ckpt, "--resume", "--preempt-at", 14]), SPOT.main(
        [*STEPS, "--ckpt-dir", ckpt, "--resume"])


def test_sigkill_resumes_from_the_last_periodic_checkpoint_then_sigterm_and_resume_are_bit_identical(tmp_path,
                                                                                                    reference):
    # one chain of two launches proves both recoveries: a SIGKILL (no notice) loses the steps since the last
    # periodic checkpoint; the run resumed from it gets a real SIGTERM mid-run and checkpoints (both ranks at the
    # same step); the last resume ends bit-identical to the uninterrupted reference, so both resumes were exact
    ckpt = tmp_path / "ckpt"
    with pytest.raises(LaunchError, match="SIGKILL"):  # no notice, nothing reported
        spot("--ckpt-dir", ckpt, "--ckpt-every", 5, "--kill-at", 12)
    assert latest_checkpoint(ckpt).name == "step00010.pt"  # steps 10, 11, 12 are lost
    out = launch(notice_then_finish, ckpt, num_processes=2, show_output=False, timeout=120)
    signalled, resumed = [r[0] for r in out], [r[1] for r in out]
    assert signalled[0]["start"] == 10 and signalled[0]["resumed_from"] == "step00010.pt"
    assert [r["preempted_at"] for r in signalled] == [15, 15]  # both ranks, at the same step
    state = load_checkpoint(ckpt / "preempted.pt")
    assert state["step"] == 15 and len(state["rng"]) == 2
    assert resumed[0]["start"] == state["step"]
    assert [r["checksum"] for r in resumed] == [reference["checksum"]] * 2  # bitwise, both ranks
    assert resumed[0]["losses"] == reference["losses"][state["step"]:]


def test_accelerate_save_state_preempt_then_resume_is_bit_identical(forked, reference):
    # the same batches and noise as the course's own checkpoint mode: the reference is its uninterrupted run too;
    # forked ranks have no agent above them: rank 0 signals itself, and the ranks agree at the next step
    pre, left, resumed = forked["pre"], forked["left"][0], forked["resumed"]  # the runs of one launch, in order
    assert [r["preempted_at"] for r in pre] == [10, 10]
    assert sorted(left) == ["preempted"]  # renamed into place, no .tmp left
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl",
            "step.json"} <= set(left["preempted"])
    assert resumed[0]["start"] == 10 and resumed[0]["resumed_from"] == "preempted"
    assert [r["checksum"] for r in resumed] == [reference["checksum"]] * 2  # bitwise, both ranks
    assert resumed[0]["losses"] == reference["losses"][10:]
