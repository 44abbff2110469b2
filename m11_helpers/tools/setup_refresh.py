"""Rewrite every notebook's setup cell after `setup_cell_source()` changed (a new release tag, a new install line).

    python -m m11_helpers.tools.setup_refresh [FOLDER...]      # default: course solutions exercises

The first code cell is replaced when it is a setup cell (it starts with SETUP_MARK); nothing else
of the file changes (same cell id, metadata and JSON layout), so a diff shows the install line alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from m11_helpers.tools.notebooks import dumps
from m11_helpers.tools.setup_cell import setup_cell_source

__all__ = ["SETUP_MARK", "refresh_notebooks"]

SETUP_MARK = "# Setup: works as-is locally"  # the first line of every release's setup cell


def refresh_notebooks(paths: list[Path]) -> list[Path]:
    """Give each notebook the current setup cell; return those changed."""
    changed = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        first = next((c for c in nb.cells if c.cell_type == "code"), None)
        if first is None or not first.source.startswith(SETUP_MARK) or first.source == setup_cell_source():
            continue
        first.source = setup_cell_source()
        Path(path).write_text(dumps(nb), encoding="utf-8")
        changed.append(Path(path))
    return changed


if __name__ == "__main__":
    folders = [Path(a) for a in sys.argv[1:]] or [Path("course"), Path("solutions"), Path("exercises")]
    for done in refresh_notebooks(sorted(p for f in folders for p in f.glob("[0-9][0-9]_*.ipynb"))):
        print(f"setup cell refreshed: {done}")
