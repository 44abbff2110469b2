"""Run a function, or a script, on N real processes: gloo on CPU, NCCL with one GPU per process.

    results = launch(fn, *args, num_processes=4)          # fn may be defined in a notebook cell
    run = launch_script("train.py", "--steps", "20", num_processes=4)   # `accelerate launch` underneath

`launch` forks the ranks from the running interpreter, the way `accelerate.notebook_launcher` does,
and covers its gaps (see ../shared/CPU-DISTRIBUTED-FACTS.md, measured on torch 2.13 / accelerate
1.15): it returns every rank's return value, picks its own port and never clashes with another
launch, forks real processes on Colab's CPU runtime too (where Accelerate runs the function once,
in-process), pins one OpenMP thread per rank (a forked child that uses more after the kernel has
hangs forever), and turns a crash, a dead rank or a hang into a `LaunchError` naming the rank,
within seconds or at `timeout`, with no process left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import json
import os
import pickle
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil

__all__ = ["LaunchError", "LaunchTimeout", "ScriptRun", "launch", "launch_script", "report", "plan"]

RESULTS_ENV = "M11_RESULTS_DIR"  # where `report()` writes when a script runs under `launch_script`


class LaunchError(RuntimeError):
    """One or more ranks failed; `.failures` maps rank -> traceback (or reason)."""

    def __init__(self, message: str, failures: dict[int, str] | None = None, output: str = ""):
        super().__init__(message)
        self.failures = failures or {}
        self.output = output


class LaunchTimeout(LaunchError):
    """Some ranks did not finish within `timeout` (a collective that never completes, a hang)."""


# ----------------------------------------------------------------------------------------------
# Where to run: a plan a learner can print
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a launch of `num_processes` ranks will use on this machine."""

    num_processes: int
    device: str  # "cpu" or "cuda"
    backend: str  # "gloo" or "nccl"
    threads_per_process: int

    def __str__(self) -> str:
        where = "one GPU each" if self.device == "cuda" else f"{self.threads_per_process} CPU thread each"
        return f"{self.num_processes} processes, {self.backend} backend, {where}"


def _cpu_limit() -> int:
    # Oversubscribing cores works (the course runs 4 ranks on 2 cores) but far past that every
    # rank just waits for a core: refuse rather than crawl.
    return max(8, 4 * (os.cpu_count() or 1))


def plan(num_processes: int = 2, device: str = "auto", threads_per_process: int = 1) -> Plan:
    """Choose device and backend for a launch, validating the arguments (ValueError says what to pass)."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be one of 'auto', 'cpu', 'cuda', got {device!r}")
    if isinstance(threads_per_process, bool) or not isinstance(threads_per_process, int) or threads_per_process < 1:
        raise ValueError(f"threads_per_process must be an integer >= 1, got {threads_per_process!r}")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" and num_processes > gpus:
        raise ValueError(
            f"num_processes={num_processes} with device='cuda' needs one GPU per process, "
            f"but this machine has {gpus}: pass num_processes <= {gpus} or device='cpu'"
        )
    use_cuda = device == "cuda" or (device == "auto" and 0 < num_processes <= gpus)
    if not use_cuda and num_processes > _cpu_limit():
        raise ValueError(
            f"num_processes={num_processes} is more than this machine can run sensibly on CPU "
            f"({os.cpu_count()} cores): pass num_processes <= {_cpu_limit()}"
        )
    return Plan(num_processes, "cuda" if use_cuda else "cpu", "nccl" if use_cuda else "gloo", threads_per_process)


# ----------------------------------------------------------------------------------------------
# Small process utilities
# ----------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the process that forked us dies (a crashed kernel leaves nothing)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def kill_tree(pids: Sequence[int], grace: float = 0.0) -> None:
    """SIGKILL each pid and everything it started, then reap; `grace` seconds of SIGTERM first."""
    procs: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            procs += p.children(recursive=True) + [p]
    if grace > 0:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, procs = psutil.wait_procs(procs, timeout=grace)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)
    for pid in pids:  # reap our own children so none stays a zombie
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _send(fd: int, kind: str, payload: bytes) -> None:
    msg = kind.encode()[:1] + payload
    os.write(fd, struct.pack("!Q", len(msg)))
    view = memoryview(msg)
    while view:
        view = view[os.write(fd, view):]


def _exit_reason(pid: int) -> str:
    """Why a child ended, from its wait status (it may still be exiting: wait briefly)."""
    for _ in range(50):
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                if os.WIFSIGNALED(status):
                    return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
                return f"exited with code {os.WEXITSTATUS(status)}"
        time.sleep(0.01)
    return "closed its result pipe without reporting"


# ----------------------------------------------------------------------------------------------
# launch(): fork N ranks of a Python function
# ----------------------------------------------------------------------------------------------


def _run_store(listener: socket.socket) -> None:
    """The rendezvous store lives in its own process, on a socket the caller bound first (no port race)."""
    from torch.distributed import TCPStore

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _store = TCPStore(  # noqa: F841 - kept alive by this reference until the process is killed
        "127.0.0.1", listener.getsockname()[1], None, True, timedelta(hours=1),
        wait_for_workers=False, master_listen_fd=listener.fileno(),
    )
    while True:
        time.sleep(3600)


def _rank_main(fn, args, kwargs, rank: int, p: Plan, port: int, timeout: float,
               result_fd: int, out_fd: int, release_fd: int, mixed_precision: str) -> None:
    """Body of one forked rank. Never returns: it ends with os._exit."""
    # One thread, first thing: a forked child that computes with more than one OpenMP thread after
    # the parent did hangs forever (measured on this machine).
    import torch

    torch.set_num_threads(p.threads_per_process)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C / kernel interrupt is the caller's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # undo handlers inherited from the kernel (elastic's)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the rank
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)  # "where are you stuck?"
    status = 1
    try:
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
            WORLD_SIZE=str(p.num_processes), LOCAL_WORLD_SIZE=str(p.num_processes), NPROC=str(p.num_processes),
            NODE_RANK="0", OMP_NUM_THREADS=str(p.threads_per_process),
            ACCELERATE_MIXED_PRECISION=mixed_precision,
        )
        if p.device == "cpu":
            # Without this every rank's Accelerator silently reports DistributedType.NO and trains alone.
            os.environ["ACCELERATE_USE_CPU"] = "1"
        import torch.distributed as dist
        from accelerate.state import AcceleratorState, GradientState
        from accelerate.utils import PrepareForLaunch

        # The kernel may hold an Accelerator already; its singleton state was copied by fork.
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        if p.device == "cuda":
            torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout))
        dist.init_process_group(p.backend, store=store, rank=rank, world_size=p.num_processes,
                                timeout=timedelta(seconds=timeout))
        box: list[Any] = []
        # Accelerate's own launch wrapper sets the environment exactly as notebook_launcher does.
        PrepareForLaunch(lambda: box.append(fn(*args, **kwargs)),
                         "MULTI_GPU" if p.device == "cuda" else "MULTI_CPU")(rank)
        payload = pickle.dumps(box[0])
        sys.stdout.flush(), sys.stderr.flush()
        _send(result_fd, "ok", payload)
        # Stay up until every rank has reported: a rank that leaves early can break peers still
        # connecting. The caller writes one byte (or closes the pipe) when all are done.
        os.read(release_fd, 1)
        del box
        import gc

        gc.collect()  # a live DDP model at interpreter teardown aborts the process now and then
        dist.destroy_process_group()
        status = 0
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller, with its traceback
        with contextlib.suppress(BaseException):
            sys.stdout.flush(), sys.stderr.flush()
            _send(result_fd, "error", _user_traceback(exc).encode())
    finally:
        # Exit at once, skipping atexit and interpreter teardown; a failing rank leaving now makes
        # its peers fail in ~0.1 s instead of waiting for the collective timeout.
        os._exit(status)


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the learner's function down, without the launcher's own frames."""
    tb = exc.__traceback__
    plumbing = (__file__, "accelerate/utils/launch.py")
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.endswith(plumbing):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _is_consequence(message: str) -> bool:
    """A peer's error that only says another rank went away (gloo's wording), not a cause."""
    return any(s in message for s in ("Connection reset by peer", "Connection closed by peer", "Broken pipe"))


def launch(
    fn: Callable[..., Any],
    *args: Any,
    num_processes: int = 2,
    timeout: float = 120.0,
    device: str = "auto",
    threads_per_process: int = 1,
    mixed_precision: str = "no",
    show_output: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `num_processes` real processes; return each rank's result in rank order.

    Inside `fn`, `torch.distributed` is initialised (gloo on CPU, NCCL with one GPU per process) and
    `accelerate.Accelerator()` works as under `accelerate launch`. Each rank's printed output is shown
    afterwards, prefixed with its rank, in rank order (so a notebook's output is deterministic).
    Raises `LaunchError` naming the failing rank(s) with their tracebacks, `LaunchTimeout` when a
    rank has not finished after `timeout` seconds; either way no process is left running.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a callable (the function each rank runs), got {type(fn).__name__}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if mixed_precision not in ("no", "bf16", "fp16"):
        raise ValueError(f"mixed_precision must be one of 'no', 'bf16', 'fp16', got {mixed_precision!r}")
    p = plan(num_processes, device, threads_per_process)
    import torch
    import torch.distributed  # noqa: F401 - imported once here, inherited by every forked rank
    import accelerate.state  # noqa: F401 - importing it in each rank costs seconds on a busy machine
    import accelerate.utils  # noqa: F401
    import torch._dynamo  # noqa: F401 - DDP's and the optimizers' constructors import it: seconds per rank

    if p.device == "cuda" and torch.cuda.is_initialized():
        raise LaunchError("CUDA was already initialised in this process, and forked ranks cannot re-initialise it: "
                          "restart the kernel and call launch() before any CUDA call, or use launch_script().")

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))  # port 0: the OS picks a free port, held by us: no clash
    listener.listen(256)
    port = listener.getsockname()[1]
    sys.stdout.flush(), sys.stderr.flush()

    pids: list[int] = []
    store_pid = os.fork()
    if store_pid == 0:
        try:
            _run_store(listener)
        finally:
            os._exit(1)
    listener.close()  # the store process owns it now

    pipes = [(os.pipe(), os.pipe(), os.pipe()) for _ in range(p.num_processes)]  # result, output, release
    try:
        for rank, ((res_r, res_w), (out_r, out_w), (rel_r, rel_w)) in enumerate(pipes):
            pid = os.fork()
            if pid == 0:
                # Close every descriptor that is not this rank's own end, or EOFs never arrive.
                for other, ((a, b), (c, d), (e, f)) in enumerate(pipes):
                    for fd in (a, c, f) if other == rank else (a, b, c, d, e, f):
                        with contextlib.suppress(OSError):
                            os.close(fd)
                _rank_main(fn, args, kwargs, rank, p, port, timeout, res_w, out_w, rel_r, mixed_precision)
            pids.append(pid)
            for fd in (res_w, out_w, rel_r):
                os.close(fd)
        return _collect(p, pids, pipes, timeout, show_output)
    finally:
        kill_tree(pids + [store_pid])
        for (res_r, _), (out_r, _), (_, rel_w) in pipes:
            for fd in (res_r, out_r, rel_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _collect(p: Plan, pids: list[int], pipes, timeout: float, show_output: bool) -> list[Any]:
    """Read results and output until every rank reported, one failed, or the timeout passed."""
    n = p.num_processes
    res_fds = {pipes[r][0][0]: r for r in range(n)}
    out_fds = {pipes[r][1][0]: r for r in range(n)}
    buffers = {r: bytearray() for r in range(n)}  # partial result messages
    output = {r: bytearray() for r in range(n)}
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    start = time.monotonic()
    deadline = start + timeout
    open_fds = set(res_fds) | set(out_fds)

    def reported(r: int) -> bool:
        return r in results or r in failures

    while open_fds and not all(reported(r) for r in range(n)):
        wait = deadline - time.monotonic()
        if wait <= 0:
            break
        ready, _, _ = select.select(list(open_fds), [], [], min(wait, 0.5))
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if fd in out_fds:
                if chunk:
                    output[out_fds[fd]] += chunk
                else:
                    open_fds.discard(fd)
                continue
            r = res_fds[fd]
            if not chunk:  # EOF: the rank is gone
                open_fds.discard(fd)
                if not reported(r):
                    failures[r] = f"died ({_exit_reason(pids[r])}) before returning"
                continue
            buffers[r] += chunk
            while len(buffers[r]) >= 8:
                (size,) = struct.unpack("!Q", buffers[r][:8])
                if len(buffers[r]) < 8 + size:
                    break
                msg = bytes(buffers[r][8:8 + size])
                del buffers[r][:8 + size]
                if msg[:1] == b"o":
                    results[r] = pickle.loads(msg[1:])
                else:
                    failures[r] = msg[1:].decode(errors="replace")
        if failures and deadline > time.monotonic() + 1.0:
            # The first failure usually takes its peers down within ~0.1 s: give them a moment to
            # report why, so the error shows the whole picture, then stop everyone.
            deadline = time.monotonic() + 1.0

    if len(results) == n:
        for (_, _), (_, _), (_, rel_w) in pipes:
            with contextlib.suppress(OSError):
                os.write(rel_w, b"x")
        _wait_exit(pids, 10.0)
        # Drain what the ranks printed while tearing down.
        for fd in list(open_fds & set(out_fds)):
            with contextlib.suppress(OSError):
                while chunk := os.read(fd, 1 << 16):
                    output[out_fds[fd]] += chunk
    text = _format_output(output)
    if show_output and text:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)
    if len(results) == n:
        return [results[r] for r in range(n)]
    if failures:
        causes = [r for r in sorted(failures) if not _is_consequence(failures[r])] or sorted(failures)
        body = "\n".join(_prefix(failures[r], r) for r in causes)
        peers = [r for r in sorted(failures) if r not in causes]
        if peers:
            body += "\n" + "".join(f"[rank {r}] {failures[r].strip().splitlines()[-1][:160]}\n" for r in peers)
            body += "(the ranks above lost their connection to the failed rank: a consequence, not a cause)"
        stopped = [r for r in range(n) if not reported(r)]
        tail = f"\n(ranks {', '.join(map(str, stopped))} were still running and were stopped)" if stopped else ""
        who = "rank" if len(causes) == 1 else "ranks"
        # The headline carries the exception itself, so a one-line summary (a grader's table) says why.
        why = failures[causes[0]].strip().splitlines()[-1][:200]
        raise LaunchError(f"{who} {', '.join(map(str, causes))} of {n} failed: {why}\n{body}{tail}", failures, text)
    pending = [r for r in range(n) if not reported(r)]
    stacks = _stacks_of(pending, pids, pipes, out_fds, output)
    raise LaunchTimeout(
        f"ranks {', '.join(map(str, pending))} of {n} did not finish within timeout={timeout:g} s "
        "(a collective some rank never joined, or a hang); all ranks were stopped. "
        f"Pass a larger timeout= if the work is just slow.{stacks}",
        {r: "timed out" for r in pending}, text,
    )


def _stacks_of(pending: list[int], pids: list[int], pipes, out_fds: dict[int, int], output) -> str:
    """Ask each stuck rank where it is (faulthandler on SIGUSR1) and return the innermost frames."""
    before = {r: len(output[r]) for r in pending}
    for r in pending:
        with contextlib.suppress(OSError):
            os.kill(pids[r], signal.SIGUSR1)
    end = time.monotonic() + 0.5
    fds = [pipes[r][1][0] for r in pending]
    while time.monotonic() < end:
        ready, _, _ = select.select(fds, [], [], 0.1)
        for fd in ready:
            with contextlib.suppress(OSError):
                output[out_fds[fd]] += os.read(fd, 1 << 16)
    lines = []
    for r in pending:
        dump = output[r][before[r]:].decode(errors="replace")
        frames = [ln.strip() for ln in dump.splitlines() if ln.strip().startswith("File ")]
        del output[r][before[r]:]  # keep the dump out of the learner's output
        if frames:
            lines.append(f"\n  rank {r} was at {frames[0]}")  # faulthandler lists the innermost frame first
    return "".join(lines)


def _wait_exit(pids: list[int], limit: float) -> None:
    end = time.monotonic() + limit
    alive = set(pids)
    while alive and time.monotonic() < end:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    alive.discard(pid)
        if alive:
            time.sleep(0.005)


def _prefix(text: str, rank: int) -> str:
    return "".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").splitlines())


def _format_output(output: dict[int, bytearray]) -> str:
    return "".join(_prefix(buf.decode(errors="replace"), r) for r, buf in sorted(output.items()) if buf.strip())


# ----------------------------------------------------------------------------------------------
# launch_script(): `accelerate launch` a script, stream its output, collect what the ranks report
# ----------------------------------------------------------------------------------------------


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

    With `num_machines=M > 1`, M launchers start here, one per "node", each with `num_processes`
    ranks, meeting over TCP on 127.0.0.1 exactly as M machines of a cluster would (`--machine_rank`,
    `--main_process_ip`, `--main_process_port`): a real multi-node rendezvous on one computer.
    Returns a `ScriptRun` (exit code, what each rank passed to `report()`, the output). With
    `check=True` a non-zero exit raises `LaunchError` naming the failing rank; after `timeout`
    seconds every process is killed and `LaunchTimeout` is raised.
    """
    path = Path(script)
    if not path.is_file():
        raise ValueError(f"script must be an existing file, got {str(script)!r}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if mixed_precision not in ("no", "bf16", "fp16"):
        raise ValueError(f"mixed_precision must be one of 'no', 'bf16', 'fp16', got {mixed_precision!r}")
    if isinstance(num_machines, bool) or not isinstance(num_machines, int) or num_machines < 1:
        raise ValueError(f"num_machines must be an integer >= 1, got {num_machines!r}")
    p = plan(num_processes * num_machines, device, threads_per_process)
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
                                        start_new_session=True, preexec_fn=_die_with_parent)
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
    if check and returncode != 0:
        raise LaunchError(_script_failure(path.name, returncode, out), _failed_ranks(out), out)
    return ScriptRun(returncode, results, out, argvs[0], seconds)


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


def _print_commands(path: Path, args: list[str], p: Plan, mixed_precision: str) -> None:
    here = accelerate_command(path.name, *args, num_processes=p.num_processes, mixed_precision=mixed_precision)
    prefix = "ACCELERATE_USE_CPU=1 " if p.device == "cpu" else ""
    gpu = accelerate_command(path.name, *args, num_processes=8, mixed_precision="bf16")
    node = accelerate_command(path.name, *args, num_processes=16, num_machines=2, machine_rank=0,
                              main_process_ip="$MASTER_ADDR", main_process_port=29500, mixed_precision="bf16")
    print(f"$ {prefix}{shlex.join(here)}")
    print(f"# on an 8-GPU box:     {shlex.join(gpu)}")
    print(f"# on 2 nodes x 8 GPUs: {' '.join(node)}   (machine_rank 1 on the second node)", flush=True)
