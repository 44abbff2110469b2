"""Files the lessons need at run time (training scripts, Accelerate configs), found inside the package.

    script_path("train.py")                 # .../site-packages/m11_helpers/scripts/train.py
    script_path("configs/fsdp_gpu.yaml")
    launch_script("train.py", ...)           # launch_script resolves course script names the same way

Everything a notebook runs ships in the package (`importlib.resources`), so a notebook opened alone
(from its Colab badge, no clone of the repository) finds it. A name that is not there raises
`FileNotFoundError` listing what is.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["script_path", "course_scripts"]


def _scripts_dir() -> Path:
    return Path(str(resources.files("m11_helpers") / "scripts"))


def course_scripts() -> list[str]:
    """Names of the training scripts that ship with the course (`*.py` in m11_helpers/scripts/)."""
    return sorted(p.name for p in _scripts_dir().glob("*.py"))


def script_path(name: str) -> Path:
    """The path of a course script or config shipped in the package (e.g. "train.py", "configs/fsdp_gpu.yaml")."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(f"name must be a file name inside m11_helpers/scripts/ such as 'train.py', got {name!r}")
    path = _scripts_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{name!r} is not one of the course's scripts ({', '.join(course_scripts())}) "
                                f"in {_scripts_dir()}; is the m11-helpers package installed completely?")
    return path
