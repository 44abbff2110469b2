"""Cloud training arithmetic: how often to checkpoint, what preemptions waste, what spot capacity costs.

    young_interval(120, 3 * 3600) / 60         # 26.8 min  (Young 1974)
    daly_interval(120, 3 * 3600) / 60          # 25.5 min  (Daly 2006, higher order)
    simulate_wall_time(10 * 3600, 26.8 * 60, 120, 3 * 3600, trials=2000)   # Monte Carlo check
    spot_cost(100, 32.77, discount=0.7, preemptions_per_hour=0.1, checkpoint_seconds=120)
    print(slurm_script("train.py", nodes=2, gpus_per_node=8))

All times in seconds. Failures (preemptions) are modelled as a Poisson process with mean time
between them M (exponential inter-arrival times), as in both papers. Lesson 10.
"""

from __future__ import annotations

import math
import shlex

import numpy as np

from m11_helpers.validate import non_negative_real, positive_int, positive_real

__all__ = ["young_interval", "daly_interval", "expected_wall_time", "simulate_wall_time", "wasted_fraction_curve",
           "spot_cost", "multinode_commands", "slurm_script", "sagemaker_estimator"]


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """τ = √(2 δ M): the checkpoint interval that minimises expected lost time (Young 1974, eq. 1)."""
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2 * d * m)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """τ = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, else M (Daly 2006, higher-order optimum).

    τ here is compute time between checkpoints (the checkpoint's own δ excluded).
    """
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def expected_wall_time(work_seconds: float, interval_seconds: float, checkpoint_seconds: float,
                       mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """T = M e^{R/M} (e^{(τ+δ)/M} − 1) · W/τ: expected wall time under exponential failures (Daly 2006, full model)."""
    w = positive_real("work_seconds", work_seconds)
    tau = positive_real("interval_seconds", interval_seconds)
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    non_negative_real("restart_seconds", restart_seconds)
    return m * math.exp(restart_seconds / m) * math.expm1((tau + d) / m) * w / tau


def simulate_wall_time(work_seconds: float, interval_seconds: float, checkpoint_seconds: float,
                       mtbf_seconds: float, restart_seconds: float = 0.0, trials: int = 1000,
                       seed: int = 0) -> np.ndarray:
    """Monte Carlo: wall time of `trials` runs of `work_seconds` of compute, checkpointing every
    `interval_seconds` (cost δ), preempted at exponential times (mean M), each restart costing R
    and losing the work since the last checkpoint. Returns (trials,) wall times in seconds.
    """
    w = positive_real("work_seconds", work_seconds)
    tau = positive_real("interval_seconds", interval_seconds)
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    non_negative_real("restart_seconds", restart_seconds)
    positive_int("trials", trials)
    rng = np.random.default_rng(seed)
    n_seg = math.ceil(w / tau)
    seg = np.full(n_seg, tau)
    seg[-1] = w - tau * (n_seg - 1)
    need = seg + d
    need[-1] = seg[-1]  # no checkpoint after the last segment: the run is done
    out = np.empty(trials)
    for t in range(trials):
        clock = 0.0
        for length in need:  # each segment (+ its checkpoint) must run uninterrupted once
            while True:
                fail = rng.exponential(m)
                if fail >= length:
                    clock += length
                    break
                clock += fail + restart_seconds  # lost: the partial segment, then the restart
        out[t] = clock
    return out


def wasted_fraction_curve(intervals_seconds, work_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                          restart_seconds: float = 0.0, trials: int = 200, seed: int = 0):
    """For each interval: (simulated mean wasted fraction, model's wasted fraction); waste = 1 − W/T."""
    sim, model = [], []
    for i, tau in enumerate(intervals_seconds):
        t = simulate_wall_time(work_seconds, tau, checkpoint_seconds, mtbf_seconds, restart_seconds, trials, seed + i)
        sim.append(1 - work_seconds / t.mean())
        model.append(1 - work_seconds / expected_wall_time(work_seconds, tau, checkpoint_seconds, mtbf_seconds,
                                                           restart_seconds))
    return np.array(sim), np.array(model)


def spot_cost(work_hours: float, on_demand_per_hour: float, discount: float = 0.7,
              preemptions_per_hour: float = 0.1, checkpoint_seconds: float = 120.0,
              restart_seconds: float = 300.0, interval_seconds: float | None = None) -> dict:
    """Expected time and cost of `work_hours` of compute on spot vs on-demand.

    Spot price = on_demand · (1 − discount); wall time from Daly's model with M = 1/rate and the
    checkpoint interval at Young's τ unless given; on-demand is assumed never preempted but still
    checkpoints at the same interval (a crash is still possible). Returns a dict of hours and dollars.
    """
    w = positive_real("work_hours", work_hours) * 3600
    price = positive_real("on_demand_per_hour", on_demand_per_hour)
    if not 0 <= discount < 1:
        raise ValueError(f"discount must be in [0, 1), got {discount!r}")
    non_negative_real("preemptions_per_hour", preemptions_per_hour)
    d = positive_real("checkpoint_seconds", checkpoint_seconds)
    if preemptions_per_hour == 0:
        tau = interval_seconds or w
        spot_wall = w + d * (math.ceil(w / tau) - 1)
    else:
        m = 3600 / preemptions_per_hour
        tau = interval_seconds or young_interval(d, m)
        spot_wall = expected_wall_time(w, tau, d, m, restart_seconds)
    od_wall = w + d * (math.ceil(w / tau) - 1)
    spot_price = price * (1 - discount)
    return {"interval_minutes": tau / 60, "on_demand_hours": od_wall / 3600, "spot_hours": spot_wall / 3600,
            "on_demand_cost": od_wall / 3600 * price, "spot_cost": spot_wall / 3600 * spot_price,
            "saving": 1 - (spot_wall * spot_price) / (od_wall * price), "slowdown": spot_wall / od_wall}


# ---------------------------------------------------------------------------------------------
# The same script beyond one machine: launch commands
# ---------------------------------------------------------------------------------------------


def multinode_commands(script: str, *args: str, num_machines: int = 2, processes_per_machine: int = 8,
                       main_process_ip: str = "10.0.0.1", main_process_port: int = 29500,
                       cpu: bool = False) -> list[str]:
    """One `accelerate launch` line per machine (run the k-th on machine k); --num_processes is the TOTAL."""
    positive_int("num_machines", num_machines)
    positive_int("processes_per_machine", processes_per_machine)
    lines = []
    for k in range(num_machines):
        cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(num_machines * processes_per_machine),
               "--num_machines", str(num_machines), "--machine_rank", str(k),
               "--main_process_ip", main_process_ip, "--main_process_port", str(main_process_port), script, *args]
        lines.append(("ACCELERATE_USE_CPU=1 " if cpu else "") + shlex.join(cmd))
    return lines


def slurm_script(script: str, *args: str, nodes: int = 2, gpus_per_node: int = 8, hours: int = 24,
                 job_name: str = "train", signal_seconds: int = 120) -> str:
    """An sbatch script: one `accelerate launch` per node via srun; SIGTERM `signal_seconds` before the time limit."""
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("hours", hours)):
        positive_int(name, v)
    rest = shlex.join([script, *args])
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1          # one launcher per node; it starts {gpus_per_node} ranks
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --time={hours}:00:00
#SBATCH --signal=TERM@{signal_seconds}          # SIGTERM {signal_seconds} s before the limit: our checkpoint path
#SBATCH --requeue                    # a preempted job goes back in the queue and resumes
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=29500
srun --kill-on-bad-exit=1 bash -c 'accelerate launch --multi_gpu \\
  --num_processes $(( SLURM_NNODES * {gpus_per_node} )) --num_machines $SLURM_NNODES \\
  --machine_rank $SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT \\
  {rest} --resume'
"""


def sagemaker_estimator(entry_point: str = "train_spot.py", instance_type: str = "ml.p4d.24xlarge",
                        instance_count: int = 2, max_run_hours: int = 24, max_wait_hours: int = 48,
                        bucket: str = "s3://my-bucket/run1") -> str:
    """Python source of a SageMaker PyTorch estimator with managed spot training and an S3 checkpoint URI.

    SageMaker syncs /opt/ml/checkpoints <-> checkpoint_s3_uri and restarts an interrupted spot job;
    max_wait >= max_run is required with spot.
    """
    if max_wait_hours < max_run_hours:
        raise ValueError(f"max_wait_hours must be >= max_run_hours ({max_run_hours}), got {max_wait_hours}")
    positive_int("instance_count", instance_count)
    return f"""from sagemaker.pytorch import PyTorch

estimator = PyTorch(
    entry_point="{entry_point}",
    source_dir=".",
    role=role,                                   # your SageMaker execution role
    framework_version="2.3", py_version="py311",
    instance_type="{instance_type}",
    instance_count={instance_count},
    distribution={{"torch_distributed": {{"enabled": True}}}},   # torchrun on every instance
    use_spot_instances=True,                     # managed spot training
    max_run={max_run_hours * 3600},                            # seconds of training
    max_wait={max_wait_hours * 3600},                           # seconds including waiting for spot capacity
    checkpoint_s3_uri="{bucket}/checkpoints",     # synced with /opt/ml/checkpoints
    checkpoint_local_path="/opt/ml/checkpoints",
    hyperparameters={{"ckpt-dir": "/opt/ml/checkpoints", "resume": ""}},
)
estimator.fit("{bucket}/data")
"""
