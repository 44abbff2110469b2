"""Checkpoint-interval formulas against the worked example, the Monte Carlo against the model, costs, commands."""

import math

import numpy as np
import pytest

from m11_helpers import cloud
from m11_helpers.cloud import (
    PRICE_CUT_2025,
    PRICES,
    best_checkpoint_count,
    daly_interval,
    expected_wall_time,
    failures_per_hour,
    segment_time,
    simulate_wall_time,
    spot_cost,
    wall_time_with_checkpoints,
    wasted_fraction_curve,
    young_interval,
)
from m11_helpers.cloud_launch import multinode_commands, sagemaker_estimator, slurm_script


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


def test_on_demand_checkpoints_at_its_own_interval_not_at_spots():
    # Each side checkpoints at its own interval: at 4 preemptions/h spot checkpoints every 7.7 min; an
    # on-demand run that nothing interrupts writes no checkpoint at all (it used to be charged spot's 780
    # checkpoints: 125.8 h).
    c = spot_cost(100, 32.77, discount=0.7, preemptions_per_hour=4, checkpoint_seconds=120, restart_seconds=300)
    assert c["interval_minutes"] == pytest.approx(7.75, abs=0.01) and c["on_demand_interval_minutes"] is None
    assert c["on_demand_hours"] == 100 and c["spot_hours"] == pytest.approx(247.3, abs=0.1)
    assert c["saving"] == pytest.approx(1 - 247.29 * 0.3 / 100, abs=1e-3)  # 25.8 %, not the 41 % it used to say
    # With hardware failures, each side checkpoints at Young's τ for its own failure rate.
    hw = failures_per_hour(16_384)
    c = spot_cost(100, 32.77, 0.7, preemptions_per_hour=1, failures_per_hour=hw)
    assert c["on_demand_interval_minutes"] == pytest.approx(young_interval(120, 3600 / hw) / 60)
    assert c["interval_minutes"] == pytest.approx(young_interval(120, 3600 / (1 + hw)) / 60)
    assert c["on_demand_hours"] == pytest.approx(expected_wall_time(100 * 3600, young_interval(120, 3600 / hw), 120,
                                                                    3600 / hw, 300) / 3600)
    with pytest.raises(ValueError, match="failures_per_hour"):
        spot_cost(1, 1, failures_per_hour=-1)


def test_llama3_failure_rate_and_dated_prices():
    # Dubey et al. 2024, §3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs -> M = 3.09 h
    assert 1 / failures_per_hour(16_384) == pytest.approx(3.093, abs=1e-3)
    assert 1 / failures_per_hour(8) == pytest.approx(6334, abs=1)  # one 8-GPU node: ~9 months between failures
    for price in PRICES.values():
        assert price.usd_per_hour > 0 and price.source and "20" in price.valid  # every price says when it held
    assert PRICE_CUT_2025["up_to"] == 0.45 and "2025" in PRICE_CUT_2025["when"]
    # every notice time has a source and a date; Azure's Preempt event comes 30 s ahead (Scheduled Events docs)
    assert {n.provider: n.seconds for n in cloud.NOTICES} == {"AWS": 120, "Google Cloud": 30, "Azure": 30}
    assert all(n.source and n.as_of for n in cloud.NOTICES) and all(len(o) == 4 for o in cloud.CAPACITY_OPTIONS)
    assert cloud.ASSUMED_SPOT_DISCOUNT == 0.7 and len(cloud.SPOT_DISCOUNT_RANGES) == 2  # an assumption, labelled


def test_wall_time_with_n_checkpoints_is_what_the_monte_carlo_simulates():
    w, d, m, r = 4 * 3600.0, 120.0, 2 * 3600.0, 60.0
    for n in (0, 3, 9):
        sim = simulate_wall_time(w, w / (n + 1), d, m, r, trials=3000, seed=n)
        assert sim.mean() == pytest.approx(wall_time_with_checkpoints(w, n, d, m, r), rel=0.03)
    assert segment_time(600, 3600) == pytest.approx(3600 * math.expm1(600 / 3600))
    assert segment_time(1e9, 1) == math.inf  # no hope of finishing: infinite, not an OverflowError


def test_best_checkpoint_count_is_the_argmin_and_young_is_near_it():
    for w, d, m, r in ((8 * 3600, 120, 3 * 3600, 0), (8 * 3600, 1200, 3600, 0), (3600, 5, 600, 30), (60, 120, 1e6, 0)):
        best = best_checkpoint_count(w, d, m, r)
        times = [wall_time_with_checkpoints(w, n, d, m, r) for n in range(200)]
        assert best == min(range(200), key=times.__getitem__)
    assert best_checkpoint_count(8 * 3600, 120, 3 * 3600) == 18  # W/τ_Young = 17.9 segments: 16.9 checkpoints
    assert best_checkpoint_count(60, 120, 1e6) == 0  # a short job on a reliable machine: none
    with pytest.raises(ValueError, match="count"):
        wall_time_with_checkpoints(10, -1, 1, 1)


def test_commands():
    lines = multinode_commands("train.py", "--steps", "10", num_machines=2, processes_per_machine=8)
    assert len(lines) == 2 and "--machine_rank 1" in lines[1] and "--num_processes 16" in lines[0]
    assert "--max_restarts 3" in multinode_commands("train.py", max_restarts=3)[0]
    s = slurm_script("train.py", nodes=4, gpus_per_node=8, max_restarts=2)
    assert "#SBATCH --nodes=4" in s and "--signal=TERM@120" in s and "SLURM_NODEID" in s
    assert "--max_restarts 2" in s and "--resume" not in s  # train.py resumes from --ckpt-dir by itself
    e = sagemaker_estimator(instance_count=2)
    assert "use_spot_instances=True" in e and "checkpoint_s3_uri" in e and 'entry_point="train.py"' in e
    compile(e, "estimator.py", "exec")
    with pytest.raises(ValueError, match="max_wait_hours"):
        sagemaker_estimator(max_run_hours=10, max_wait_hours=5)
