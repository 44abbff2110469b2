"""`launch(fn)`: fork N ranks of a Python function from the running interpreter, collect their results.

The ranks meet through a TCPStore that lives in its own process on a socket bound before any fork
(no port race); each rank reports through its own pipe; the caller watches every pipe, so a crash,
a dead rank or a hang turns into a `LaunchError` within seconds or at `timeout`.

This module is the one exception to the 300-line rule (CONTRIBUTING): the fork, the rank's body and
the caller's watch loop share one protocol (pipes, release byte, exit codes), and reading them side by
side is how a reader checks that no path leaves a process behind.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from m11_helpers.launch.base import LaunchError, LaunchPlan, LaunchTimeout, _exit_reason, launch_plan
from m11_helpers.procs import die_with_parent, kill_tree
from m11_helpers.validate import one_of, positive_real


def _send(fd: int, kind: str, payload: bytes) -> None:
    msg = kind.encode()[:1] + payload
    os.write(fd, struct.pack("!Q", len(msg)))
    view = memoryview(msg)
    while view:
        view = view[os.write(fd, view):]



# ----------------------------------------------------------------------------------------------
# launch(): fork N ranks of a Python function
# ----------------------------------------------------------------------------------------------


def _run_store(listener: socket.socket) -> None:
    """The rendezvous store lives in its own process, on a socket the caller bound first (no port race)."""
    from torch.distributed import TCPStore

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _store = TCPStore(  # noqa: F841 - kept alive by this reference until the process is killed
        "127.0.0.1", listener.getsockname()[1], None, True, timedelta(hours=1),
        wait_for_workers=False, master_listen_fd=listener.fileno(),
    )
    while True:
        time.sleep(3600)


def _rank_main(fn, args, kwargs, rank: int, p: LaunchPlan, port: int, timeout: float,
               result_fd: int, out_fd: int, release_fd: int, mixed_precision: str) -> None:
    """Body of one forked rank. Never returns: it ends with os._exit."""
    # One thread, first thing: a forked child that computes with more than one OpenMP thread after
    # the parent did hangs forever (measured on this machine).
    import torch

    torch.set_num_threads(p.threads_per_process)
    die_with_parent()
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
        box.clear()  # drop the result (a model, say) before tearing down
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
    positive_real("timeout", timeout)  # seconds
    one_of("mixed_precision", mixed_precision, ("no", "bf16", "fp16"))
    p = launch_plan(num_processes, device, threads_per_process)
    import accelerate.state  # noqa: F401 - importing it in each rank costs seconds on a busy machine
    import accelerate.utils  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401 - DDP's and the optimizers' constructors import it: seconds per rank
    import torch.distributed  # noqa: F401 - imported once here, inherited by every forked rank

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


def _collect(p: LaunchPlan, pids: list[int], pipes, timeout: float, show_output: bool) -> list[Any]:
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
