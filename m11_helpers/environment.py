"""What every lesson's setup cell calls: `setup(seed)` seeds everything and prints where launches run.

    from m11_helpers import setup
    env = setup(seed=0)      # torch 2.13.0 · accelerate 1.15.0 · local · 2 CPU cores · no GPU → launch() runs …

`environment()` is the same report as a dict; `m11 doctor` (m11_helpers.tools.doctor) prints it with
what is missing.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path

__all__ = ["platform_name", "package_version", "environment", "setup_line", "setup"]


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


def environment() -> dict:
    """Versions, devices, and what `launch()` will use by default."""
    import torch

    from m11_helpers.launch import launch_plan

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
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
    """
    import warnings

    from m11_helpers.data import seed_everything

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
