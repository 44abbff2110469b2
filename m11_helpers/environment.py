"""What every lesson's setup cell calls: `setup(seed)` seeds everything and prints where launches run.

    from m11_helpers import setup
    env = setup(seed=0)      # torch 2.13.0 · accelerate 1.15.0 · local · 2 CPU cores · no GPU → launch() runs …

`environment()` is the same report as a dict; `m11 doctor` (m11_helpers.tools.doctor) prints it with
what is missing.

Nothing here initialises CUDA: `launch()` forks its ranks from this process afterwards, and a fork
of a process that has touched CUDA cannot use it. GPUs are counted and named through NVML (the
driver's management library), never through `torch.cuda.get_device_name` or `is_available`.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path

__all__ = ["platform_name", "package_version", "gpu_names", "environment", "setup_line", "setup"]


def platform_name() -> str:
    """Where the notebook runs: 'Colab', 'SageMaker Studio', 'SageMaker Studio Lab' or 'local'."""
    if "COLAB_RELEASE_TAG" in os.environ or "google.colab" in sys.modules:
        return "Colab"
    if os.environ.get("SAGEMAKER_INTERNAL_IMAGE_URI") or Path("/opt/ml/metadata/resource-metadata.json").exists():
        return "SageMaker Studio"
    if Path("/home/studio-lab-user").exists():
        return "SageMaker Studio Lab"
    return "local"


def package_version(name: str) -> str | None:
    """The installed version of distribution `name`, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvml_devices() -> list[tuple[str, str]]:
    """(UUID, name) of every GPU the driver knows, in NVML's order (PCI bus); [] without NVML."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")  # as torch.cuda._raw_device_count_nvml loads it
    except OSError:
        return []
    if nvml.nvmlInit_v2() != 0:
        return []
    try:
        count, found = ctypes.c_uint(0), []
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return []
        for i in range(count.value):
            handle, uuid, name = ctypes.c_void_p(), ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
            if (nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) or nvml.nvmlDeviceGetUUID(handle, uuid, 96)
                    or nvml.nvmlDeviceGetName(handle, name, 96)):
                return []
            found.append((uuid.value.decode(errors="replace"), name.value.decode(errors="replace")))
        return found
    finally:
        nvml.nvmlShutdown()


def _visible(devices: list[tuple[str, str]]) -> list[str]:
    """The names CUDA_VISIBLE_DEVICES selects from `devices`: indices or GPU-UUID prefixes; CUDA stops at the first it cannot use."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [name for _, name in devices]
    picked = []
    for item in (s.strip() for s in spec.split(",")):
        match = [name for uuid, name in devices if item.startswith("GPU-") and uuid.startswith(item)]
        if item.isdigit() and int(item) < len(devices):
            picked.append(devices[int(item)][1])
        elif len(match) == 1:
            picked.append(match[0])
        else:  # MIG-…, an unknown UUID, a bad index: CUDA ignores it and everything after it
            break
    return picked


def gpu_names() -> list[str]:
    """Names of the CUDA GPUs this process may use, read through NVML without initialising CUDA.

    The count is `launch.base.gpu_count()` (what `launch()` plans with). When the names cannot be
    matched one to one (MIG slices, NVML missing) every GPU gets the one name they share, or
    "CUDA GPU". On a box of mixed GPUs the order is NVML's (PCI bus), as with CUDA_DEVICE_ORDER=PCI_BUS_ID.
    """
    from m11_helpers.launch.base import gpu_count

    n = gpu_count()
    if n == 0:
        return []
    devices = _nvml_devices()
    names = _visible(devices)
    if len(names) != n:
        shared = {name for _, name in devices}
        names = [shared.pop() if len(shared) == 1 else "CUDA GPU"] * n
    return names


def environment() -> dict:
    """Versions, devices, and what `launch()` will use by default (CUDA is not initialised: see the module docstring)."""
    import torch

    from m11_helpers.launch import launch_plan

    gpus = gpu_names()
    default = launch_plan(max(1, min(len(gpus), 8)) if gpus else 2)
    return {
        "platform": platform_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": package_version("accelerate"),
        "cpu_cores": os.cpu_count(),
        "gpus": gpus,
        "backend": default.backend,
        "device": default.device,
        "default_processes": default.num_processes,
        "threads_per_process": default.threads_per_process,
    }


def setup_line(env: dict | None = None) -> str:
    """One line for a notebook's setup cell: versions, hardware, and how launches will run."""
    env = env or environment()
    hw = f"{len(env['gpus'])}× {env['gpus'][0]}" if env["gpus"] else "no GPU"
    return (f"torch {env['torch']} · accelerate {env['accelerate']} · {env['platform']} · "
            f"{env['cpu_cores']} CPU cores · {hw} → launch() runs {env['default_processes']} real processes "
            f"on {env['device'].upper()} with {env['backend']}")


def setup(seed: int = 0, quiet: bool = False) -> dict:
    """Seed everything, set plot defaults, print the environment line; return `environment()`.

    With M11_STRICT=1 (set by `make test` and CI) deprecation warnings become errors, so a lesson
    that uses an outdated API fails its test instead of printing a warning a learner would copy.
    It also sets PYTORCH_NVML_BASED_CUDA_CHECK=1 (unless set): a later `torch.cuda.is_available()`
    in a lesson then counts GPUs through NVML instead of initialising the CUDA driver, which would
    leave every `launch()` after it unable to use CUDA in its forked ranks (the torch docstring of
    `is_available`; Accelerate's `notebook_launcher` checks the same way).
    """
    import warnings

    from m11_helpers.data import seed_everything

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    seed_everything(seed)
    if os.environ.get("M11_STRICT") == "1":
        warnings.filterwarnings("error", category=DeprecationWarning, module=r"(torch|accelerate|m11_helpers)(\.|$)")
        warnings.filterwarnings("error", category=FutureWarning)
    try:
        import matplotlib

        matplotlib.rcParams.update({"figure.figsize": (7, 3.5), "figure.dpi": 100, "axes.grid": True,
                                    "svg.hashsalt": "m11"})
    except ImportError:
        pass
    env = environment()
    if not quiet:
        print(setup_line(env))
    return env
