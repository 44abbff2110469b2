"""`launch_script(path)`: run a script with `accelerate launch`, stream `[rank k]` output, collect `report()`s.

Nothing it starts outlives the caller, however the caller ends. The process tree of a run:

    caller (a notebook kernel, a script, `m11 course`'s kernel)
    └── supervisor            one per "node": m11_helpers.tether.tethered_popen
        └── accelerate launch = torchrun's elastic agent (SIGKILLed if the supervisor dies)
            ├── rank 0        torchrun starts every rank in a session of its own
            └── rank 1 ...

Why a supervisor. torchrun puts each rank in its own session, so a signal to the caller's process
group (Ctrl-C in a terminal, JupyterLab killing the kernel's group) never reaches the ranks, and the
parent-death signal set on the agent (PR_SET_PDEATHSIG) kills the agent only: the flag is per
process and the agent starts the ranks with no hook of ours. A SIGKILLed caller runs no cleanup.
What was left:

- a watchdog in every rank (a pipe end inherited through an environment variable and a
  `sitecustomize`): reaches only Python processes that load it, means injecting code into the
  learner's interpreter (shadowing any `sitecustomize` of theirs), and torchrun closes inherited
  file descriptors, so it needs a named pipe on disk besides;
- a cgroup: exact, but needs a delegated cgroup v2 subtree, which a kernel on a laptop, Colab or
  SageMaker does not have;
- a small supervisor process between the caller and the agent (chosen). It is a child subreaper, so
  every rank re-parents to it if the agent dies first, and it lives in a session of its own, so a
  kernel restart does not kill it with the kernel. It polls its parent every 20 ms; once the caller
  is gone it SIGKILLs the whole tree. SIGKILL, not SIGTERM: a script that checkpoints on SIGTERM
  (lesson 10's does) would otherwise write into the folder the learner's next run resumes from.
  It needs nothing from the ranks, so it holds for any script, Python or not. Its cost, measured
  on a loaded 2-core machine (benchmarks/launch_overhead.py): one more small interpreter per node,
  ~0.3 s from its start to its exit against ~17 s for the `accelerate launch` it wraps, idle while
  the run goes on; a SIGKILLed caller's tree is gone ~20 ms (up to ~90 ms) after its death.

Each way the caller can end, and what stops the run:

- SIGKILL, SIGTERM, SIGHUP (a closed terminal), a JupyterLab restart (shutdown request, then SIGTERM
  and SIGKILL to the kernel's process group): the caller dies; its supervisors see it and kill.
- SIGINT (Ctrl-C, a kernel interrupt) or `timeout`: the caller is alive; `launch_script` kills the
  tree itself (`kill_tree` over the supervisors) and raises `KeyboardInterrupt` / `LaunchTimeout`.
- the agent itself dies: the supervisor kills the orphaned ranks and exits with the agent's status.

Tested with real process trees in tests/test_launch_cleanup.py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from m11_helpers.launch.base import LaunchError, LaunchPlan, LaunchTimeout, launch_plan
from m11_helpers.launch.command import accelerate_command, free_port, print_commands, resolve_script
from m11_helpers.launch.results import (
    RESULTS_ENV,
    count_restarts,
    failed_ranks,
    pump,
    read_results,
    report,
    script_failure,
)
from m11_helpers.procs import kill_tree
from m11_helpers.tether import tethered_popen
from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["ScriptRun", "launch_script", "accelerate_command", "report", "RESULTS_ENV"]


@dataclasses.dataclass
class ScriptRun:
    """What `launch_script` returns."""

    returncode: int
    results: list[dict]  # what each rank passed to report(), in rank order
    output: str
    command: list[str]
    seconds: float
    restarts: int = 0  # how many times torchrun restarted a failed worker group (max_restarts > 0)

    def __repr__(self) -> str:
        return (f"ScriptRun(returncode={self.returncode}, ranks_reported={len(self.results)}, "
                f"restarts={self.restarts}, seconds={self.seconds:.1f})")


def launch_script(
    script: str | os.PathLike,
    *args: Any,
    num_processes: int = 2,
    timeout: float = 600.0,
    device: str = "auto",
    threads_per_process: int = 1,
    mixed_precision: str = "no",
    env: dict[str, str] | None = None,
    check: bool = True,
    num_machines: int = 1,
    echo: bool = True,
    show_command: bool = True,
    max_restarts: int = 0,
    launcher_flags: list[str] | None = None,
) -> ScriptRun:
    """Run `script` with `accelerate launch` on `num_processes` processes, streaming `[rank k]` output live.

    `script` is a path, or the name of a script that ships with the course ("train.py": see
    `m11_helpers.resources.course_scripts()`).

    With `num_machines=M > 1`, M launchers start here, one per "node", each with `num_processes`
    ranks, meeting over TCP on 127.0.0.1 exactly as M machines of a cluster would (`--machine_rank`,
    `--main_process_ip`, `--main_process_port`): a real multi-node rendezvous on one computer.
    Returns a `ScriptRun` (exit code, what each rank passed to `report()`, the output). With
    `check=True` a non-zero exit raises `LaunchError` naming the failing rank; after `timeout`
    seconds every process is killed and `LaunchTimeout` is raised.

    `max_restarts=K` is torchrun's elastic restart (`--max_restarts`): when a rank fails, the agent
    stops the rest of its node's group and starts the whole group again, up to K times, with
    `TORCHELASTIC_RESTART_COUNT` = the attempt number in each rank's environment; the script resumes
    from its own checkpoint. `ScriptRun.restarts` says how many restarts happened.

    `launcher_flags`: `accelerate launch`'s own flags as a caller wrote them (`--config_file f.yaml
    --num_processes 4`: lesson 11's command), run as they are instead of the ones built here (one node).
    """
    path = resolve_script(script)
    positive_real("timeout", timeout)  # seconds
    one_of("mixed_precision", mixed_precision, ("no", "bf16", "fp16"))
    positive_int("num_machines", num_machines)
    p = launch_plan(num_processes * num_machines, device, threads_per_process)
    if p.device == "cuda" and num_machines > 1:
        raise ValueError("num_machines > 1 simulates nodes on this computer with CPU processes: pass device='cpu'")
    str_args = [str(a) for a in args]
    # One node: port 0 lets torchrun pick a free port, so two launches never clash. Several nodes
    # need one known port to meet on; take a free one from the OS.
    port = 0 if num_machines == 1 else free_port()
    flags = []
    for machine in range(num_machines):
        cmd = accelerate_command(str(path), *str_args, num_processes=num_processes * num_machines,
                                 num_machines=num_machines, machine_rank=machine, main_process_ip="127.0.0.1",
                                 main_process_port=port, mixed_precision=mixed_precision, max_restarts=max_restarts)
        flags.append(cmd[2:len(cmd) - len(str_args) - 1])
    if launcher_flags is not None:  # the caller's own command line (one node): what runs is what they wrote
        if num_machines > 1:
            raise ValueError("launcher_flags runs one node's command: pass num_machines=1")
        flags = [[str(f) for f in launcher_flags]]
    if show_command and echo:
        print_commands(path, str_args, p, mixed_precision, max_restarts)
    # ignore_cleanup_errors: a stopped supervisor removes the folder itself (see _stop)
    with tempfile.TemporaryDirectory(prefix="m11-results-", ignore_cleanup_errors=True) as results_dir:
        # torchrun tees each rank's output into a folder per attempt (attempt_0, attempt_1, ...): keep
        # it in our temporary folder (else every run leaves a /tmp/torchelastic_* behind) and count
        # the restarts from it.
        log_dir = Path(results_dir) / "logs"
        argvs = [[sys.executable, "-m", "accelerate.commands.launch", *f, "--tee", "3", "--log_dir", str(log_dir),
                  str(path), *str_args] for f in flags]
        run_env = _environment(env, results_dir, p, num_machines, max_restarts)
        start = time.monotonic()
        lines: list[str] = []
        procs, readers = [], []
        try:
            for argv in argvs:
                procs.append(tethered_popen(argv, remove_if_abandoned=[results_dir], env=run_env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
                readers.append(threading.Thread(target=pump, args=(procs[-1].stdout, lines, echo), daemon=True))
                readers[-1].start()
            returncode = _wait_all(procs, timeout)
        except subprocess.TimeoutExpired:
            _stop(procs)
            for r in readers:
                r.join(5)
            raise LaunchTimeout(f"{path.name} did not finish within timeout={timeout:g} s; all its processes were "
                                "stopped. Pass a larger timeout= if the work is just slow.", output="".join(lines))
        except BaseException:  # an interrupt (Ctrl-C, a kernel interrupt or shutdown), an error here
            _stop(procs)
            raise
        finally:
            # Every way out, a normal end included, leaves nothing: nothing the run started writes
            # anything after this line.
            kill_tree([q.pid for q in procs])
        for r in readers:
            r.join(10)
        seconds = time.monotonic() - start
        results = read_results(Path(results_dir))
        restarts = count_restarts(log_dir)
    out = "".join(lines)
    if returncode != 0 and num_machines > 1 and len(results) == p.num_processes and "exit barrier" in out \
            and not failed_ranks(out):
        # Every rank finished and reported; only torchrun's agents then failed to meet at their exit
        # barrier (node 0's agent hosts the store and may leave first). The job itself succeeded.
        returncode = 0
    if check and returncode != 0:
        raise LaunchError(script_failure(path.name, returncode, out), failed_ranks(out), out)
    return ScriptRun(returncode, results, out, argvs[0], seconds, restarts)


def _environment(env: dict[str, str] | None, results_dir: str, p: LaunchPlan, num_machines: int,
                 max_restarts: int) -> dict[str, str]:
    run_env = {**os.environ, **(env or {}), RESULTS_ENV: results_dir, "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": str(p.threads_per_process),
               # tag each line with the GLOBAL rank (torchrun's default tag is the local rank)
               "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
    if p.device == "cpu":
        run_env["ACCELERATE_USE_CPU"] = "1"
        run_env["CUDA_VISIBLE_DEVICES"] = ""
    if max_restarts and num_machines == 1:
        # torchrun --standalone (accelerate has no flag for it): the c10d store on a port the OS
        # picks, where a bare `--rdzv_backend c10d` takes 29400 and would meet any other launch there.
        run_env["PET_STANDALONE"] = "1"
    if max_restarts:
        # A fresh TCP store per attempt: with the agent's store shared across attempts (torch's
        # default), a restarted group reads the dead attempt's gloo/NCCL addresses and fails to
        # connect (pytorch/pytorch#135712; measured again on torch 2.13: every restart failed).
        run_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return run_env


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop a run we give up on: each supervisor SIGKILLs its tree and removes the results folder.

    Through the supervisors (SIGTERM to them only, never to a rank: a script that checkpoints on
    SIGTERM would write one) rather than a SIGKILL of everything from here: if this process dies
    right after (a kernel shutting down raises in the cell, then exits), the cleanup still happens.
    """
    for q in procs:
        q.terminate()
    for q in procs:
        try:
            q.wait(10)
        except subprocess.TimeoutExpired:
            kill_tree([q.pid])


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> int:
    """Wait for every launcher; once one fails, give the others a few seconds, then stop them."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [q.poll() for q in procs]
        if all(c is not None for c in codes):
            return next((c for c in codes if c != 0), 0)
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline, time.monotonic() + 5)
        if time.monotonic() > deadline:
            if any(c not in (None, 0) for c in codes):
                kill_tree([q.pid for q in procs])
                return next(c for c in codes if c not in (None, 0))
            raise subprocess.TimeoutExpired("accelerate launch", timeout)
        time.sleep(0.05)
