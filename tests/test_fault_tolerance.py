"""Atomic checkpoints survive a kill mid-write; a real SIGTERM mid-run + resume is bit-identical on 2 ranks."""

import os
import signal
import subprocess
import sys
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
from m11_helpers.launch import accelerate_command, launch, launch_script
from m11_helpers.models import mlp
from m11_helpers.resources import script_path

SCRIPT = script_path("train_spot.py")
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


def test_fsync_dir_is_public_and_keeps_its_old_name(tmp_path):
    from m11_helpers import fault_tolerance

    fault_tolerance.fsync_dir(tmp_path)  # a directory: no error
    fault_tolerance.fsync_dir(tmp_path / "missing")  # best effort: a missing folder is not an error either
    assert fault_tolerance._fsync_dir is fault_tolerance.fsync_dir  # sharded_checkpoint imports the old name


def _run_and_signal(tmp_path, ckpt, after_step, *extra):
    """`accelerate launch` the script ourselves and send SIGTERM to its whole process group mid-run."""
    progress = tmp_path / "progress.txt"
    flags = accelerate_command(str(SCRIPT), num_processes=2, main_process_port=0)[2:-1]
    argv = [sys.executable, "-m", "accelerate.commands.launch", *flags, str(SCRIPT), *STEPS,
            "--ckpt-dir", str(ckpt), "--progress", str(progress), "--step-sleep", "0.2", *extra]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if progress.exists() and progress.read_text() and int(progress.read_text()) >= after_step:
                os.killpg(proc.pid, signal.SIGTERM)  # the spot notice: launcher and ranks all get it
                break
            time.sleep(0.02)
        out = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


@pytest.fixture(scope="module")
def reference():
    run = launch_script(SCRIPT, *STEPS, "--ckpt-dir", "/nonexistent-never-written", num_processes=2,
                        show_command=False, echo=False)
    assert [r["done"] for r in run.results] == [True, True]
    return run.results[0]


def test_sigkill_resumes_from_the_last_periodic_checkpoint_then_sigterm_and_resume_are_bit_identical(tmp_path,
                                                                                                    reference):
    # one chain of three launches proves both recoveries: a SIGKILL (no notice) loses the steps since the last
    # periodic checkpoint; the run resumed from it gets a real SIGTERM mid-run and checkpoints; the last resume
    # ends bit-identical to the uninterrupted reference, so both resumes were exact
    ckpt = tmp_path / "ckpt"
    killed = launch_script(SCRIPT, *STEPS, "--ckpt-dir", ckpt, "--ckpt-every", "5", "--kill-at", "12",
                           num_processes=2, check=False, show_command=False, echo=False)
    assert killed.returncode != 0 and killed.results == []  # no notice, nothing reported
    assert latest_checkpoint(ckpt).name == "step00010.pt"  # steps 10, 11, 12 are lost
    out = _run_and_signal(tmp_path, ckpt, 14, "--resume")
    assert "resumed from step00010.pt at step 10" in out and "spot notice received" in out, out[-3000:]
    state = load_checkpoint(ckpt / "preempted.pt")
    assert 14 < state["step"] < 24 and len(state["rng"]) == 2
    resumed = launch_script(SCRIPT, *STEPS, "--ckpt-dir", ckpt, "--resume", num_processes=2,
                            show_command=False, echo=False)
    assert resumed.results[0]["start"] == state["step"]
    assert [r["checksum"] for r in resumed.results] == [reference["checksum"]] * 2  # bitwise, both ranks
    assert resumed.results[0]["losses"] == reference["losses"][state["step"]:]


def test_accelerate_save_state_preempt_then_resume_is_bit_identical(tmp_path, reference):
    # the same batches and noise as the course's own checkpoint mode: the reference is its uninterrupted run too
    ckpt, acc_flag = tmp_path / "ckpt", "--accelerate-state"
    pre = launch_script(SCRIPT, *STEPS, "--ckpt-dir", ckpt, acc_flag, "--preempt-at", "9", num_processes=2,
                        check=False, show_command=False, echo=False)
    assert [r["preempted_at"] for r in pre.results] == [10, 10], pre.output[-3000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["preempted"]  # renamed into place, no .tmp left
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl",
            "step.json"} <= {p.name for p in (ckpt / "preempted").iterdir()}
    resumed = launch_script(SCRIPT, *STEPS, "--ckpt-dir", ckpt, acc_flag, "--resume", num_processes=2,
                            show_command=False, echo=False)
    assert resumed.results[0]["start"] == 10 and resumed.results[0]["resumed_from"] == "preempted"
    assert [r["checksum"] for r in resumed.results] == [reference["checksum"]] * 2  # bitwise, both ranks
    assert resumed.results[0]["losses"] == reference["losses"][10:]
