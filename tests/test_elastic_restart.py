"""The reference script under `accelerate launch --max_restarts` (torchrun's elastic agent): a hung rank becomes
an error, the agent restarts the group by itself, and the run resumes bit-identical (lesson 10).

The one real `accelerate launch` of train.py in the suite (test_train_script.py runs it on forked ranks); a file
of its own so the scheduler can run it beside the rest of lesson 10's tests.
"""

import shutil

import pytest

from m11_helpers.launch import launch, launch_script
from m11_helpers.reference_run import exit_codes, run_train
from m11_helpers.sharded_checkpoint import complete_steps, step_dir

COMMON = ["--steps", 12, "--ckpt-every", 4, "--log-every", 100]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """2 forked ranks, 12 steps, checkpoints at 4, 8 and 12: the weights every resumed run must end on."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    result = launch(run_train, *COMMON, "--ckpt-dir", folder, num_processes=2, show_output=False)[0]
    assert complete_steps(folder)[-2:] == [8, 12]
    return {"checksum": result["checksum"], "dir": folder}


@pytest.mark.slow
def test_elastic_restart_recovers_from_a_hang_by_itself(uninterrupted, tmp_path):
    # torchrun's agent (through accelerate launch --max_restarts 1), from the uninterrupted run's step 8: rank 1
    # goes silent at step 11 on attempt 0 (rank 0's all-gather times out after 5 s and raises); the agent
    # restarts the group, which resumes from the checkpoint attempt 0 wrote at step 10 and finishes
    shutil.copytree(step_dir(uninterrupted["dir"], 8), step_dir(tmp_path, 8))
    run = launch_script("train.py", *COMMON, "--ckpt-every", 2, "--ckpt-dir", tmp_path, "--hang-at", 11,
                        "--timeout", 5, num_processes=2, max_restarts=1, echo=False, show_command=False, timeout=300)
    codes = exit_codes(run.output)  # the agent's failure report of each attempt (a peer's may be listed too)
    assert run.returncode == 0 and run.restarts == 1 and len(codes) >= 1 and set(codes) == {1}
    assert "injected hang at step 11" in run.output and "Timed out" in run.output
    final = run.results[0]
    assert final["restarts"] == 1 and final["start_step"] in (8, 10)  # step_10 unless its save was still in flight
    assert final["checksum"] == uninterrupted["checksum"]  # the same weights, bit for bit
