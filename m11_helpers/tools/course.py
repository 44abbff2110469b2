"""`m11 course`: execute every course notebook headless, in a fresh kernel each, and time it.

Prints each notebook's wall time and the total, fails on an error or on a deprecation warning in
any cell's output (the course promises modern APIs only), writes the executed notebooks to
`build/executed/`, then builds the slide decks from them into `build/slides/`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import nbformat

from m11_helpers.tools.paths import repo_root

WARNINGS = ("DeprecationWarning", "FutureWarning")


def execute(path: Path, cell_timeout: int = 120) -> tuple[nbformat.NotebookNode, float]:
    """Run a notebook top to bottom in a fresh kernel, in its own folder; return it and its wall time."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb, time.perf_counter() - start


def deprecations(nb: nbformat.NotebookNode) -> list[str]:
    """Lines of stream output that report a deprecation: each one is a bug in the course."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            found += [f"cell {i}: {line.strip()}" for line in text.splitlines() if any(w in line for w in WARNINGS)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="m11 course", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: course/*.ipynb")
    parser.add_argument("--cell-timeout", type=int, default=120)
    parser.add_argument("--no-slides", action="store_true", help="skip building the slide decks")
    args = parser.parse_args(argv)
    root = repo_root()
    paths = args.notebooks or sorted((root / "course").glob("[0-9][0-9]_*.ipynb"))
    out_dir = root / "build" / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    total, failed = 0.0, []
    for path in paths:
        try:
            nb, seconds = execute(path, args.cell_timeout)
        except Exception as exc:  # noqa: BLE001 - report every notebook, then fail
            failed.append(path.name)
            print(f"  FAIL  {path.name}: {str(exc).strip().splitlines()[-1][:200]}", flush=True)
            continue
        total += seconds
        nbformat.write(nb, out_dir / path.name)
        warned = deprecations(nb)
        flag = "ok  " if not warned else "WARN"
        print(f"  {flag}  {path.name:<40}{seconds:6.1f} s", flush=True)
        for line in warned:
            print(f"        {line}")
        if warned:
            failed.append(path.name)
    print(f"  total {total:.1f} s for {len(paths)} notebooks")
    if not args.no_slides and not failed:
        from m11_helpers.tools.slides import main as slides_main

        slides_main([str(out_dir / p.name) for p in paths])
    return 1 if failed else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
