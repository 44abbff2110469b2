"""`launch_script(path)`: run a script with `accelerate launch`, stream `[rank k]` output, collect `report()`s."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from m11_helpers.launch.base import LaunchError, LaunchPlan, LaunchTimeout, launch_plan
from m11_helpers.procs import die_with_parent, kill_tree
from m11_helpers.validate import one_of, positive_int, positive_real

RESULTS_ENV = "M11_RESULTS_DIR"  # where `report()` writes when a script runs under `launch_script`


def report(**values: Any) -> None:
    """Called inside a launched script: hand JSON-able values (tensors become lists) back to `launch_script`."""
    folder = os.environ.get(RESULTS_ENV)
    if not folder:
        return  # run by hand, outside launch_script: nothing to report to
    rank = int(os.environ.get("RANK", "0"))
    path = Path(folder) / f"rank{rank}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(values)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(old, default=_jsonable))
    tmp.replace(path)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"report() values must be JSON-serialisable (numbers, strings, lists, tensors), got {type(x).__name__}")


@dataclasses.dataclass
class ScriptRun:
    """What `launch_script` returns."""

    returncode: int
    results: list[dict]  # what each rank passed to report(), in rank order
    output: str
    command: list[str]
    seconds: float

    def __repr__(self) -> str:
        return f"ScriptRun(returncode={self.returncode}, ranks_reported={len(self.results)}, seconds={self.seconds:.1f})"


def accelerate_command(script: str, *args: str, num_processes: int, num_machines: int = 1,
                       machine_rank: int = 0, main_process_ip: str | None = None,
                       main_process_port: int | None = None, mixed_precision: str = "no",
                       cpu: bool = True) -> list[str]:
    """The `accelerate launch` command line for a script (what a learner types on a GPU box or cluster)."""
    multi = ["--multi_gpu"] if num_processes > 1 else []  # accelerate refuses --multi_gpu for one process
    cmd = ["accelerate", "launch", *multi, "--num_processes", str(num_processes),
           "--num_machines", str(num_machines), "--mixed_precision", mixed_precision, "--dynamo_backend", "no"]
    if num_machines > 1:
        cmd += ["--machine_rank", str(machine_rank), "--main_process_ip", main_process_ip or "127.0.0.1"]
    if main_process_port is not None:
        cmd += ["--main_process_port", str(main_process_port)]
    return cmd + [script, *args]


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
    """
    path = _resolve(script)
    positive_real("timeout", timeout)  # seconds
    one_of("mixed_precision", mixed_precision, ("no", "bf16", "fp16"))
    positive_int("num_machines", num_machines)
    p = launch_plan(num_processes * num_machines, device, threads_per_process)
    if p.device == "cuda" and num_machines > 1:
        raise ValueError("num_machines > 1 simulates nodes on this computer with CPU processes: pass device='cpu'")
    str_args = [str(a) for a in args]
    # One node: port 0 lets torchrun pick a free port, so two launches never clash. Several nodes
    # need one known port to meet on; take a free one from the OS.
    port = 0 if num_machines == 1 else _free_port()
    argvs = []
    for machine in range(num_machines):
        cmd = accelerate_command(str(path), *str_args, num_processes=num_processes * num_machines,
                                 num_machines=num_machines, machine_rank=machine, main_process_ip="127.0.0.1",
                                 main_process_port=port, mixed_precision=mixed_precision)
        flags = cmd[2:len(cmd) - len(str_args) - 1]
        argvs.append([sys.executable, "-m", "accelerate.commands.launch", *flags, "--tee", "3", str(path), *str_args])
    if show_command and echo:
        _print_commands(path, str_args, p, mixed_precision)
    with tempfile.TemporaryDirectory(prefix="m11-results-") as results_dir:
        run_env = {**os.environ, **(env or {}), RESULTS_ENV: results_dir, "PYTHONUNBUFFERED": "1",
                   "OMP_NUM_THREADS": str(p.threads_per_process),
                   # tag each line with the GLOBAL rank (torchrun's default tag is the local rank)
                   "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
        if p.device == "cpu":
            run_env["ACCELERATE_USE_CPU"] = "1"
            run_env["CUDA_VISIBLE_DEVICES"] = ""
        start = time.monotonic()
        lines: list[str] = []
        procs, readers = [], []
        try:
            for argv in argvs:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=run_env,
                                        start_new_session=True, preexec_fn=die_with_parent)
                procs.append(proc)
                readers.append(threading.Thread(target=_pump, args=(proc.stdout, lines, echo), daemon=True))
                readers[-1].start()
            returncode = _wait_all(procs, timeout)
        except subprocess.TimeoutExpired:
            kill_tree([q.pid for q in procs], grace=1.0)
            for r in readers:
                r.join(5)
            raise LaunchTimeout(f"{path.name} did not finish within timeout={timeout:g} s; all its processes were "
                                "stopped. Pass a larger timeout= if the work is just slow.", output="".join(lines))
        except BaseException:
            kill_tree([q.pid for q in procs], grace=1.0)
            raise
        finally:
            kill_tree([q.pid for q in procs])  # a rank may have started children of its own
        for r in readers:
            r.join(10)
        seconds = time.monotonic() - start
        files = sorted(Path(results_dir).glob("rank*.json"), key=lambda f: int(f.stem[4:]))
        results = [json.loads(f.read_text()) for f in files]
    out = "".join(lines)
    if returncode != 0 and num_machines > 1 and len(results) == p.num_processes and "exit barrier" in out \
            and not _failed_ranks(out):
        # Every rank finished and reported; only torchrun's agents then failed to meet at their exit
        # barrier (node 0's agent hosts the store and may leave first). The job itself succeeded.
        returncode = 0
    if check and returncode != 0:
        raise LaunchError(_script_failure(path.name, returncode, out), _failed_ranks(out), out)
    return ScriptRun(returncode, results, out, argvs[0], seconds)


def _resolve(script: str | os.PathLike) -> Path:
    """A path to an existing file, else the name of a script that ships with the course."""
    path = Path(script)
    if path.is_file():
        return path
    from m11_helpers.resources import course_scripts, script_path

    if path.name == str(script) and path.name in course_scripts():
        return script_path(path.name)
    raise ValueError(f"script must be an existing file or one of the course's scripts "
                     f"({', '.join(course_scripts())}), got {str(script)!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _pump(stream, lines: list[str], echo: bool) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        line = _retag(line)
        lines.append(line)
        if echo:
            print(line, end="", flush=True)


def _retag(line: str) -> str:
    # torchrun writes "[rank0]:text"; show it like launch() does: "[rank 0] text".
    if line.startswith("[rank") and "]:" in line[:12]:
        tag, rest = line.split("]:", 1)
        return f"[rank {tag[5:]}] {rest}"
    return line


def _failed_ranks(out: str) -> dict[int, str]:
    failures: dict[int, str] = {}
    for line in out.splitlines():
        if line.startswith("[rank ") and ("Error" in line or "Traceback" in line):
            r = int(line[6:line.index("]")])
            failures.setdefault(r, "")
        if line.startswith("[rank "):
            r = int(line[6:line.index("]")])
            if r in failures:
                failures[r] += line + "\n"
    return failures


def _script_failure(name: str, code: int, out: str) -> str:
    failed = _failed_ranks(out)
    if failed:
        first = min(failed)
        tb = failed[first].strip().splitlines()[-12:]
        return f"{name} failed (exit code {code}) on rank {', '.join(map(str, sorted(failed)))}:\n" + "\n".join(tb)
    return f"{name} failed (exit code {code}):\n" + "\n".join(out.strip().splitlines()[-15:])


def _print_commands(path: Path, args: list[str], p: LaunchPlan, mixed_precision: str) -> None:
    here = accelerate_command(path.name, *args, num_processes=p.num_processes, mixed_precision=mixed_precision)
    prefix = "ACCELERATE_USE_CPU=1 " if p.device == "cpu" else ""
    gpu = accelerate_command(path.name, *args, num_processes=8, mixed_precision="bf16")
    node = accelerate_command(path.name, *args, num_processes=16, num_machines=2, machine_rank=0,
                              main_process_ip="$MASTER_ADDR", main_process_port=29500, mixed_precision="bf16")
    print(f"$ {prefix}{shlex.join(here)}")
    print(f"# on an 8-GPU box:     {shlex.join(gpu)}")
    print(f"# on 2 nodes x 8 GPUs: {' '.join(node)}   (machine_rank 1 on the second node)", flush=True)
