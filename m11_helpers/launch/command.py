"""The `accelerate launch` command line: what `launch_script` runs, and what a learner types on a GPU box."""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

from m11_helpers.launch.base import LaunchPlan
from m11_helpers.validate import non_negative_int


def accelerate_command(script: str, *args: str, num_processes: int, num_machines: int = 1,
                       machine_rank: int = 0, main_process_ip: str | None = None,
                       main_process_port: int | None = None, mixed_precision: str = "no",
                       cpu: bool = True, max_restarts: int = 0) -> list[str]:
    """The `accelerate launch` command line for a script (what a learner types on a GPU box or cluster).

    `max_restarts=K > 0` lets torchrun's agent restart the whole local worker group up to K times
    when a rank fails. It needs the c10d rendezvous: the default "static" one keeps one TCP store
    for every attempt, so a restarted group reads the previous attempt's (dead) gloo/NCCL addresses
    and fails to connect (measured on torch 2.13: every restart failed in `connectFullMesh`).
    """
    non_negative_int("max_restarts", max_restarts)
    if max_restarts and num_processes < 2:
        raise ValueError(f"max_restarts={max_restarts} needs num_processes * num_machines >= 2: with one process "
                         "accelerate launch runs the script directly, without torchrun's agent that restarts it")
    multi = ["--multi_gpu"] if num_processes > 1 else []  # accelerate refuses --multi_gpu for one process
    cmd = ["accelerate", "launch", *multi, "--num_processes", str(num_processes),
           "--num_machines", str(num_machines), "--mixed_precision", mixed_precision, "--dynamo_backend", "no"]
    if num_machines > 1:
        cmd += ["--machine_rank", str(machine_rank), "--main_process_ip", main_process_ip or "127.0.0.1"]
    if main_process_port is not None:
        cmd += ["--main_process_port", str(main_process_port)]
    if max_restarts:
        cmd += ["--max_restarts", str(max_restarts), "--rdzv_backend", "c10d"]
    return cmd + [script, *args]


def resolve_script(script: str | os.PathLike) -> Path:
    """A path to an existing file, else the name of a script that ships with the course."""
    path = Path(script)
    if path.is_file():
        return path
    from m11_helpers.resources import course_scripts, script_path

    if path.name == str(script) and path.name in course_scripts():
        return script_path(path.name)
    raise ValueError(f"script must be an existing file or one of the course's scripts "
                     f"({', '.join(course_scripts())}), got {str(script)!r}")


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now (for the nodes of a loopback multi-node run to meet on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_commands(path: Path, args: list[str], p: LaunchPlan, mixed_precision: str, max_restarts: int = 0) -> None:
    """Show the command this launch runs, and the same launch on an 8-GPU box and on two such nodes."""
    here = accelerate_command(path.name, *args, num_processes=p.num_processes, mixed_precision=mixed_precision,
                              max_restarts=max_restarts)
    prefix = "ACCELERATE_USE_CPU=1 " if p.device == "cpu" else ""
    gpu = accelerate_command(path.name, *args, num_processes=8, mixed_precision="bf16", max_restarts=max_restarts)
    node = accelerate_command(path.name, *args, num_processes=16, num_machines=2, machine_rank=0,
                              main_process_ip="$MASTER_ADDR", main_process_port=29500, mixed_precision="bf16",
                              max_restarts=max_restarts)
    print(f"$ {prefix}{shlex.join(here)}")
    print(f"# on an 8-GPU box:     {shlex.join(gpu)}")
    print(f"# on 2 nodes x 8 GPUs: {' '.join(node)}   (machine_rank 1 on the second node)", flush=True)
