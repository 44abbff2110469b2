"""The same training script beyond one machine: the launch commands for several nodes, SLURM and SageMaker.

    multinode_commands("train.py", "--ckpt-dir", "/shared/ckpt", num_machines=2, processes_per_machine=8)
    print(slurm_script("train.py", "--ckpt-dir", "/shared/ckpt", nodes=2, gpus_per_node=8, max_restarts=3))
    print(sagemaker_estimator(instance_count=2))

Written for the course's reference script (`m11_helpers/scripts/train.py`), which resumes from the newest
complete checkpoint in --ckpt-dir by itself: a restarted or requeued job needs no extra flag. With
`max_restarts`, the launcher's agent (torchrun's, under `accelerate launch`) restarts the ranks itself
when one fails, without going back to the queue. Lesson 10.
"""

from __future__ import annotations

import shlex

from m11_helpers.validate import non_negative_int, positive_int

__all__ = ["multinode_commands", "slurm_script", "sagemaker_estimator"]


def multinode_commands(script: str, *args: str, num_machines: int = 2, processes_per_machine: int = 8,
                       main_process_ip: str = "10.0.0.1", main_process_port: int = 29500,
                       cpu: bool = False, max_restarts: int = 0) -> list[str]:
    """One `accelerate launch` line per machine (run the k-th on machine k); --num_processes is the TOTAL."""
    positive_int("num_machines", num_machines)
    positive_int("processes_per_machine", processes_per_machine)
    non_negative_int("max_restarts", max_restarts)
    lines = []
    for k in range(num_machines):
        cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(num_machines * processes_per_machine),
               "--num_machines", str(num_machines), "--machine_rank", str(k),
               "--main_process_ip", main_process_ip, "--main_process_port", str(main_process_port)]
        cmd += ["--max_restarts", str(max_restarts)] if max_restarts else []
        lines.append(("ACCELERATE_USE_CPU=1 " if cpu else "") + shlex.join([*cmd, script, *args]))
    return lines


def slurm_script(script: str, *args: str, nodes: int = 2, gpus_per_node: int = 8, hours: int = 24,
                 job_name: str = "train", signal_seconds: int = 120, max_restarts: int = 0) -> str:
    """An sbatch script: one `accelerate launch` per node via srun; SIGTERM `signal_seconds` before the time limit."""
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("hours", hours)):
        positive_int(name, v)
    restarts = f"--max_restarts {non_negative_int('max_restarts', max_restarts)} " if max_restarts else ""
    rest = shlex.join([script, *args])
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1          # one launcher per node; it starts {gpus_per_node} ranks
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --time={hours}:00:00
#SBATCH --signal=TERM@{signal_seconds}          # SIGTERM {signal_seconds} s before the limit: our checkpoint path
#SBATCH --requeue                    # a preempted job goes back in the queue and resumes from --ckpt-dir
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=29500
srun --kill-on-bad-exit=1 bash -c 'accelerate launch --multi_gpu {restarts}\\
  --num_processes $(( SLURM_NNODES * {gpus_per_node} )) --num_machines $SLURM_NNODES \\
  --machine_rank $SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT \\
  {rest}'
"""


def sagemaker_estimator(entry_point: str = "train.py", instance_type: str = "ml.p4d.24xlarge",
                        instance_count: int = 2, max_run_hours: int = 24, max_wait_hours: int = 48,
                        bucket: str = "s3://my-bucket/run1") -> str:
    """Python source of a SageMaker PyTorch estimator with managed spot training and an S3 checkpoint URI.

    SageMaker syncs /opt/ml/checkpoints <-> checkpoint_s3_uri and restarts an interrupted spot job;
    max_wait >= max_run is required with spot. The script resumes from that folder by itself.
    """
    if max_wait_hours < max_run_hours:
        raise ValueError(f"max_wait_hours must be >= max_run_hours ({max_run_hours}), got {max_wait_hours}")
    positive_int("instance_count", instance_count)
    return f"""from sagemaker.pytorch import PyTorch

estimator = PyTorch(
    entry_point="{entry_point}",
    source_dir=".",
    role=role,                                   # your SageMaker execution role
    framework_version="2.6", py_version="py312",   # FSDP2's public fully_shard needs torch >= 2.6
    instance_type="{instance_type}",
    instance_count={instance_count},
    distribution={{"torch_distributed": {{"enabled": True}}}},   # torchrun on every instance
    use_spot_instances=True,                     # managed spot training
    max_run={max_run_hours * 3600},                            # seconds of training
    max_wait={max_wait_hours * 3600},                           # seconds including waiting for spot capacity
    checkpoint_s3_uri="{bucket}/checkpoints",     # synced with /opt/ml/checkpoints
    checkpoint_local_path="/opt/ml/checkpoints",
    hyperparameters={{"ckpt-dir": "/opt/ml/checkpoints"}},   # train.py resumes from it by itself
)
estimator.fit("{bucket}/data")
"""
