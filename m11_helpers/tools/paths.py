"""Where the course repository is: the commands (`m11 course`, `slides`, `make-exercises`, `grade`) start from it."""

from __future__ import annotations

import re
from pathlib import Path

from m11_helpers import REPO

__all__ = ["NotInRepository", "repo_root"]

# the course's own pyproject.toml (a fork or a copy keeps the name); another project's does not count
_NAME = re.compile(r'^\s*name\s*=\s*["\']m11-helpers["\']', re.M)


class NotInRepository(ValueError):
    """A command that works on the course repository was run outside one: a usage mistake (`m11` exits 2)."""


def _is_course_root(folder: Path) -> bool:
    try:
        return bool(_NAME.search((folder / "pyproject.toml").read_text(encoding="utf-8")))
    except OSError:
        return False


def repo_root(start: str | Path | None = None) -> Path:
    """The nearest folder at or above `start` (default: cwd) holding the course's pyproject.toml."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if _is_course_root(folder):
            return folder
    raise NotInRepository(
        f"start={str(here)!r}: no pyproject.toml of the m11-helpers project here or above; run inside the "
        f"course repository (git clone https://github.com/{REPO}), or give the notebooks and --out explicitly "
        "where the command takes them")
