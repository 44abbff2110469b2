"""`launch(fn)`: fork N ranks of a Python function from the running interpreter, collect their results.

The ranks meet through a TCPStore that lives in its own process on a socket bound before any fork
(no port race); each rank reports through its own pipe and leads a process group of its own; the
caller watches every pipe (`watch.py`), so a crash, a dead rank or a hang turns into a `LaunchError`
within seconds or at `timeout`, and nothing a rank started outlives the launch.

This file and `watch.py` are one protocol (pipes, release byte, exit codes, process groups), split in
two so each stays under 300 lines: this side forks and runs the ranks, that side watches them. (The
fork core was once the one exception to the 300-line rule; it no longer needs to be.)
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import os
import pickle
import signal
import socket
import struct
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from m11_helpers.launch.base import LaunchError, LaunchPlan, launch_plan
from m11_helpers.launch.watch import collect
from m11_helpers.procs import die_with_parent, kill_descendants, kill_groups, kill_tree, subreaper
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


def _run_store(listener: socket.socket, parent: int) -> None:
    """The rendezvous store lives in its own process, on a socket the caller bound first (no port race)."""
    # First thing, and checked: if the caller died before this line, nobody would ever stop this loop.
    die_with_parent(parent=parent)
    from torch.distributed import TCPStore

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _store = TCPStore(  # noqa: F841 - kept alive by this reference until the process is killed
        "127.0.0.1", listener.getsockname()[1], None, True, timedelta(hours=1),
        wait_for_workers=False, master_listen_fd=listener.fileno(),
    )
    while True:
        time.sleep(3600)


def _rank_main(fn, args, kwargs, rank: int, p: LaunchPlan, port: int, timeout: float,
               result_fd: int, out_fd: int, release_fd: int, mixed_precision: str, parent: int) -> None:
    """Body of one forked rank. Never returns: it ends with os._exit."""
    die_with_parent(parent=parent)  # exits now if the caller died between the fork and this line
    # Everything inherited from the caller (a kernel's whole heap) goes to the collector's permanent
    # generation: a collection here would otherwise visit every inherited object and so copy every page
    # the fork shares with the caller (0.19 s of CPU per rank of a bare interpreter with torch loaded).
    gc.freeze()
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a group of its own: what this rank starts is killed with it (watch.py)
    # And their subreaper (never left: the rank ends with os._exit): what its children orphan re-parents
    # here, so on its way out it finds and kills all it started, even a child in a session of its own.
    contextlib.ExitStack().enter_context(subreaper())
    # One thread, before any compute: a forked child that computes with more than one OpenMP thread
    # after the parent did hangs forever (measured on this machine).
    import torch

    torch.set_num_threads(p.threads_per_process)
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
            if getattr(torch.cuda, "_is_in_bad_fork", lambda: False)():
                raise RuntimeError(
                    "CUDA was initialised in the launching process before launch() forked this rank, so no rank can "
                    "use it (torch.cuda.is_available() does that too, unless PYTORCH_NVML_BASED_CUDA_CHECK=1, which "
                    "setup() sets): restart the kernel and call launch() before any CUDA call, or use launch_script().")
            torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout))
        dist.init_process_group(p.backend, store=store, rank=rank, world_size=p.num_processes,
                                timeout=timedelta(seconds=timeout))
        from m11_helpers import device_check

        if device_check.enabled():  # the suite's strict mode: a buffer NCCL would reject fails here too
            device_check.install()
        box: list[Any] = []
        # Accelerate's own launch wrapper sets the environment exactly as notebook_launcher does.
        PrepareForLaunch(lambda: box.append(fn(*args, **kwargs)),
                         "MULTI_GPU" if p.device == "cuda" else "MULTI_CPU")(rank)
        payload = _dumps(box[0])
        sys.stdout.flush(), sys.stderr.flush()
        _send(result_fd, "ok", payload)
        # Stay up until every rank has reported: a rank that leaves early can break peers still
        # connecting. The caller writes one byte (or closes the pipe) when all are done.
        os.read(release_fd, 1)
        box.clear()  # drop the result (a model, say) before tearing down
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
        with contextlib.suppress(BaseException):
            kill_descendants()  # nothing this rank started outlives it (a process group misses setsid children)
        os._exit(status)


class _CpuPickler(pickle.Pickler):
    """Pickles GPU tensors as CPU copies: unpickling a CUDA tensor would initialise CUDA in the caller,
    after which no later launch() could fork GPU ranks. A rank's result comes back on the CPU."""

    def reducer_override(self, obj):
        import torch

        if isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
            return obj.detach().cpu().__reduce_ex__(pickle.DEFAULT_PROTOCOL)
        return NotImplemented


def _dumps(value: Any) -> bytes:
    buf = io.BytesIO()
    _CpuPickler(buf).dump(value)
    return buf.getvalue()


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the learner's function down, without the launcher's own frames."""
    tb = exc.__traceback__
    plumbing = (__file__, "accelerate/utils/launch.py")
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.endswith(plumbing):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def launch(
    fn: Callable[..., Any],
    *args: Any,
    num_processes: int = 2,
    timeout: float = 120.0,
    device: str = "auto",
    threads_per_process: int = 1,
    mixed_precision: str = "no",
    show_output: bool = True,
    stall_timeout: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `num_processes` real processes; return each rank's result in rank order.

    Inside `fn`, `torch.distributed` is initialised (gloo on CPU, NCCL with one GPU per process) and
    `accelerate.Accelerator()` works as under `accelerate launch`. Each rank's printed output is shown
    afterwards, prefixed with its rank, in rank order (so a notebook's output is deterministic). Results
    come back on the CPU (a GPU tensor as its CPU copy: the caller never initialises CUDA by reading one).
    Raises `LaunchError` naming the failing rank(s) with their tracebacks, `LaunchTimeout` when a
    rank has not finished after `timeout` seconds, or, with `stall_timeout`, when the ranks still running
    sat idle (almost no CPU) for that many seconds (a deadlock: each waits on another); either way no process
    is left running.
    With `device="auto"` in a process that has already initialised CUDA (forks cannot use it), the
    ranks run on CPU and a line on stderr says why; `device="cuda"` then raises `LaunchError`.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a callable (the function each rank runs), got {type(fn).__name__}")
    positive_real("timeout", timeout)  # seconds
    if stall_timeout is not None:
        positive_real("stall_timeout", stall_timeout)  # seconds
    one_of("mixed_precision", mixed_precision, ("no", "bf16", "fp16"))
    p = launch_plan(num_processes, device, threads_per_process)
    import accelerate.state  # noqa: F401 - importing it in each rank costs seconds on a busy machine
    import accelerate.utils  # noqa: F401
    import psutil  # noqa: F401 - each rank's last act is kill_descendants(): not an import per rank
    import torch
    import torch._dynamo  # noqa: F401 - DDP's and the optimizers' constructors import it: seconds per rank
    import torch.distributed  # noqa: F401 - imported once here, inherited by every forked rank

    if p.device == "cuda" and torch.cuda.is_initialized():
        if device == "cuda":
            raise LaunchError("CUDA was already initialised in this process, and forked ranks cannot re-initialise "
                              "it: restart the kernel and call launch() before any CUDA call, or use launch_script().")
        # device="auto" promises the run, not the GPUs: a lesson that computed on the GPU in the kernel
        # (then every fork's CUDA is unusable) still runs its launches, on CPU, and says so.
        p = launch_plan(num_processes, "cpu", threads_per_process)
        print("launch(): CUDA is already initialised in this process and forked ranks cannot use it, so these "
              f"{p.num_processes} ranks run on CPU with gloo (restart the kernel and launch before any CUDA call "
              "for GPU ranks)", file=sys.stderr, flush=True)

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))  # port 0: the OS picks a free port, held by us: no clash
    listener.listen(256)
    port = listener.getsockname()[1]
    sys.stdout.flush(), sys.stderr.flush()

    pids: list[int] = []
    parent = os.getpid()  # the children check it after asking to die with us (the race in die_with_parent)
    store_pid = os.fork()
    if store_pid == 0:
        try:
            _run_store(listener, parent)
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
                _rank_main(fn, args, kwargs, rank, p, port, timeout, res_w, out_w, rel_r, mixed_precision, parent)
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)  # the rank does the same: whichever runs first, the group exists before we go on
            pids.append(pid)
            for fd in (res_w, out_w, rel_r):
                os.close(fd)
        return collect(p, pids, pipes, timeout, show_output, stall_timeout)
    finally:
        kill_tree(pids + [store_pid])  # the living ranks with all they started, the store
        kill_groups(pids)  # what exited ranks left behind: no longer their descendants, still in their groups
        for (res_r, _), (out_r, _), (_, rel_w) in pipes:
            for fd in (res_r, out_r, rel_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
