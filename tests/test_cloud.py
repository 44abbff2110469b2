"""Checkpoint-interval formulas against the worked example, the Monte Carlo against the model, costs, commands."""

import math

import numpy as np
import pytest

from m11_helpers.cloud import (
    daly_interval,
    expected_wall_time,
    multinode_commands,
    sagemaker_estimator,
    simulate_wall_time,
    slurm_script,
    spot_cost,
    wasted_fraction_curve,
    young_interval,
)


def test_young_worked_example():
    # δ = 2 min, M = 3 h: τ = √(2·2·180) = √720 = 26.83 min
    assert young_interval(120, 3 * 3600) / 60 == pytest.approx(26.833, abs=1e-3)


def test_daly_is_young_corrected_and_tends_to_it():
    d, m = 120, 3 * 3600
    x = d / (2 * m)
    assert daly_interval(d, m) == pytest.approx(math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d)
    assert daly_interval(d, m) / 60 == pytest.approx(25.52, abs=0.01)
    assert daly_interval(1, 1e9) / young_interval(1, 1e9) == pytest.approx(1, abs=1e-3)
    assert daly_interval(500, 100) == 100  # δ >= 2M: checkpoint every M


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "2"])
def test_bad_input_names_the_parameter(bad):
    with pytest.raises(ValueError, match="checkpoint_seconds"):
        young_interval(bad, 100)
    with pytest.raises(ValueError, match="mtbf_seconds"):
        daly_interval(10, bad)


def test_monte_carlo_matches_the_model():
    w, d, m = 20 * 600.0, 60.0, 3600.0
    tau = 600.0
    sim = simulate_wall_time(w, tau, d, m, trials=3000, seed=1)
    model = expected_wall_time(w, tau, d, m)
    # the simulation skips the checkpoint after the last segment: remove it from the model too
    assert sim.mean() == pytest.approx(model - d * math.exp(0), rel=0.03)
    assert (sim >= w).all()


def test_monte_carlo_minimum_is_near_young():
    w, d, m = 8 * 3600.0, 120.0, 3 * 3600.0
    taus = np.array([5, 10, 20, 27, 40, 80, 160]) * 60.0
    sim, model = wasted_fraction_curve(taus, w, d, m, trials=150, seed=0)
    assert taus[np.argmin(model)] == 27 * 60
    assert abs(taus[np.argmin(sim)] - young_interval(d, m)) <= 15 * 60
    assert np.allclose(sim, model, atol=0.03)


def test_spot_cost_saves_when_rare_and_costs_when_frequent():
    rare = spot_cost(100, 30.0, discount=0.7, preemptions_per_hour=0.05, checkpoint_seconds=120)
    assert 0.6 < rare["saving"] < 0.7 and rare["slowdown"] > 1
    assert rare["spot_cost"] == pytest.approx(rare["spot_hours"] * 9.0)
    never = spot_cost(100, 30.0, discount=0.7, preemptions_per_hour=0)
    assert never["saving"] == pytest.approx(0.7)
    awful = spot_cost(100, 30.0, discount=0.1, preemptions_per_hour=6, checkpoint_seconds=600, restart_seconds=900)
    assert awful["saving"] < 0
    with pytest.raises(ValueError, match="discount"):
        spot_cost(1, 1, discount=1.0)


def test_commands():
    lines = multinode_commands("train.py", "--steps", "10", num_machines=2, processes_per_machine=8)
    assert len(lines) == 2 and "--machine_rank 1" in lines[1] and "--num_processes 16" in lines[0]
    s = slurm_script("train.py", nodes=4, gpus_per_node=8)
    assert "#SBATCH --nodes=4" in s and "--signal=TERM@120" in s and "SLURM_NODEID" in s
    e = sagemaker_estimator(instance_count=2)
    assert "use_spot_instances=True" in e and "checkpoint_s3_uri" in e
    compile(e, "estimator.py", "exec")
    with pytest.raises(ValueError, match="max_wait_hours"):
        sagemaker_estimator(max_run_hours=10, max_wait_hours=5)
