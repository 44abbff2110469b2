"""What every launch shares: the errors it raises and the plan it makes (stopping processes: m11_helpers.procs)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time

from m11_helpers.validate import one_of, positive_int


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
class LaunchPlan:
    """What a launch of `num_processes` ranks will use on this machine."""

    num_processes: int
    device: str  # "cpu" or "cuda"
    backend: str  # "gloo" or "nccl"
    threads_per_process: int

    def __str__(self) -> str:
        where = "one GPU each" if self.device == "cuda" else f"{self.threads_per_process} CPU thread each"
        return f"{self.num_processes} processes, {self.backend} backend, {where}"


def rank_device():
    """The device this rank's tensors belong on: its GPU under NCCL, else the CPU (what `launch` set up).

    Inside a rank, a buffer that a collective touches is made on the data's device (`x.new_empty`,
    `device=x.device`) or, where there is no data yet (a flag, a counter), on this one: NCCL rejects
    CPU tensors ("No backend type associated with device type cpu"), gloo takes both.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _cpu_limit() -> int:
    # Oversubscribing cores works (the course runs 4 ranks on 2 cores) but far past that every
    # rank just waits for a core: refuse rather than crawl.
    return max(8, 4 * (os.cpu_count() or 1))


def gpu_count() -> int:
    """The CUDA GPUs this process may use, counted without initialising CUDA (0 with a CPU-only torch).

    Not `torch.cuda.is_available()`: it calls cudaGetDeviceCount, which initialises the CUDA driver
    and marks every later fork as unable to use CUDA ("Cannot re-initialize CUDA in forked
    subprocess"): `launch()` forks its ranks after this count. `torch.cuda.device_count()` counts
    through NVML, honouring CUDA_VISIBLE_DEVICES (its docstring: "will NOT poison fork if NVML
    discovery succeeds"); only where the driver has no NVML does it fall back to the CUDA call.
    """
    import torch

    return torch.cuda.device_count()


def launch_plan(num_processes: int = 2, device: str = "auto", threads_per_process: int = 1) -> LaunchPlan:
    """Choose device and backend for a launch, validating the arguments (ValueError says what to pass)."""
    positive_int("num_processes", num_processes)
    one_of("device", device, ("auto", "cpu", "cuda"))
    positive_int("threads_per_process", threads_per_process)
    if device == "cpu":
        gpus = 0  # a CPU launch need not import torch here (seconds in a fresh process)
    else:
        gpus = gpu_count()
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
    return LaunchPlan(num_processes, "cuda" if use_cuda else "cpu", "nccl" if use_cuda else "gloo", threads_per_process)


def exit_reason(pid: int) -> str:
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
