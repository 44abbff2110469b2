"""What will run where: the environment line every setup cell prints, and `m11 doctor`."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from pathlib import Path


def platform_name() -> str:
    """Where the notebook runs: 'Colab', 'SageMaker Studio', 'SageMaker Studio Lab' or 'local'."""
    if "COLAB_RELEASE_TAG" in os.environ or "google.colab" in sys.modules:
        return "Colab"
    if os.environ.get("SAGEMAKER_INTERNAL_IMAGE_URI") or Path("/opt/ml/metadata/resource-metadata.json").exists():
        return "SageMaker Studio"
    if Path("/home/studio-lab-user").exists():
        return "SageMaker Studio Lab"
    return "local"


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Versions, devices, and what `launch()` will use by default."""
    import torch

    from m11_helpers.launch import plan

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    default = plan(max(1, min(len(gpus), 8)) if gpus else 2)
    return {
        "platform": platform_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": _version("accelerate"),
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


def checks() -> list[tuple[str, bool, str]]:
    """(what, ok, detail) for each thing the course uses; missing ones say how to get them."""
    out = []
    for pkg, why in [("torch", "everything"), ("accelerate", "launches"), ("jupyterlab", "the lessons"),
                     ("ipywidgets", "labs and quizzes"), ("nbval", "tests and grading"),
                     ("nbconvert", "slides"), ("matplotlib", "plots")]:
        v = _version(pkg)
        out.append((pkg, v is not None, v or f"missing (needed for {why}): pip install {pkg}"))
    from m11_helpers import assets_hint

    assets = assets_hint()
    out.append(("slide assets (reveal.js, MathJax)", assets is None, assets or "installed"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out.append(("chromium (browser tests only)", chromium is not None, chromium or "optional: apt-get install chromium"))
    return out


def main(argv: list[str] | None = None) -> int:
    """`m11 doctor`: print the environment report and what is missing."""
    env = environment()
    print("M11 doctor\n")
    for key, value in env.items():
        print(f"  {key:<20}{value}")
    print(f"\n  {setup_line(env)}\n")
    for what, ok, detail in checks():
        print(f"  [{'ok' if ok else '--'}] {what}: {detail}")
    if env["device"] == "cpu":
        print("\n  No GPU per process: every technique still runs for real on CPU processes (gloo), one thread each.")
    return 0


REPO = "m11-course/training-at-scale"  # where the course is published; badges and the Colab install use it


def setup(seed: int = 0, quiet: bool = False) -> dict:
    """What every lesson's setup cell calls: seed everything, set plot defaults, print the environment line.

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
