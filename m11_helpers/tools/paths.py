"""Where the course repository is: the commands (`m11 course`, `slides`, `make-exercises`, `grade`) start from it."""

from __future__ import annotations

from pathlib import Path


def repo_root(start: str | Path | None = None) -> Path:
    """The nearest folder at or above `start` (default: cwd) holding a pyproject.toml."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    raise ValueError(f"start={str(here)!r}: no pyproject.toml here or above; run inside the course repository")
