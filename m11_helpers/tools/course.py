"""`m11 course`: execute every course notebook headless, in a fresh kernel each, and time it.

Prints each notebook's wall time and the total, fails on an error or on a deprecation warning in
any cell's output (the course promises modern APIs only), writes the executed notebooks to
`build/executed/`, then builds the slide decks from them into `build/slides/`.

Nothing it starts outlives it. Each kernel is tethered (`m11_helpers.tools.kernels`): if this
process is killed, even with SIGKILL, a supervisor kills the kernel and everything the notebook
started (ranks, torchrun agents, helpers). While it runs it is a child subreaper, so whatever a kernel
leaves behind re-parents here; after each notebook, and on SIGINT (Ctrl-C), SIGTERM or SIGHUP (a
closed terminal; not under `nohup`), it kills every descendant and exits. The notebooks run in a
worker thread so that these handlers stay ours: in the main thread nbclient installs its own
SIGINT/SIGTERM handlers, which shut the current kernel down and go on with the next notebook.
Tested in tests/test_launch_cleanup.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

import nbformat

from m11_helpers.procs import on_stop_signals, subreaper
from m11_helpers.tether import end_descendants
from m11_helpers.tools.kernels import notebook_client
from m11_helpers.tools.paths import repo_root

WARNINGS = ("DeprecationWarning", "FutureWarning")


def execute(path: Path, cell_timeout: int = 120) -> tuple[nbformat.NotebookNode, float]:
    """Run a notebook top to bottom in a fresh kernel, in its own folder; return it and its wall time."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    notebook_client(nb, cwd=path.parent, timeout=cell_timeout).execute()
    return nb, time.perf_counter() - start


@contextlib.contextmanager
def _nothing_survives() -> Iterator[set[int]]:
    """Be a subreaper meanwhile; on SIGINT, SIGTERM or SIGHUP stop what we started and exit 128 + signal.

    Yields the processes that were already there (a host calling `main()`, a test session): spared.
    """
    import psutil

    spared = {p.pid for p in psutil.Process().children(recursive=True)}

    def die(signum: int, _frame) -> None:
        end_descendants(spared=spared)
        if signum == signal.SIGINT:  # os.write: print() is not safe in a handler that interrupts a print
            os.write(1, b"  interrupted: every kernel and process it started was stopped\n")
        os._exit(128 + signum)

    main = threading.current_thread() is threading.main_thread()  # signal handlers: main thread only
    ends = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = on_stop_signals(die, ends) if main else {}
    try:
        with subreaper():
            yield spared
    finally:
        end_descendants(spared=spared)
        for s, handler in old.items():
            signal.signal(s, handler)


def _in_worker(fn, *args):
    """fn(*args) in a worker thread while the main thread waits, free to run signal handlers."""
    out: dict = {}

    def body() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            out["error"] = exc

    worker = threading.Thread(target=body, name="m11-course", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if "error" in out:
        raise out["error"]
    return out["value"]


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
    parser.add_argument("--cdn", action="store_true", help="decks load reveal.js and MathJax from a CDN "
                        "(when the offline slide assets are not installed; see `m11 slides --help`)")
    args = parser.parse_args(argv)
    root = repo_root()
    paths = args.notebooks or sorted((root / "course").glob("[0-9][0-9]_*.ipynb"))
    out_dir = root / "build" / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    total, failed = 0.0, []
    with _nothing_survives() as spared:
        for path in paths:
            try:
                nb, seconds = _in_worker(execute, path, args.cell_timeout)
            except Exception as exc:  # noqa: BLE001 - report every notebook, then fail
                failed.append(path.name)
                last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]  # some errors have no message
                print(f"  FAIL  {path.name}: {last[:200]}", flush=True)
                continue
            finally:
                end_descendants(spared=spared)  # what the kernel left behind re-parented here (a subreaper)
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
        from m11_helpers.tools.slides import build_decks

        slides = root / "build" / "slides"
        try:  # the decks are built from the executed copies: every output and plot is on the slides
            decks = build_decks([out_dir / p.name for p in paths], slides, cdn=args.cdn)
        except (FileNotFoundError, RuntimeError) as err:
            print(f"  slides: not built: {err}", flush=True)
            return 1
        print(f"  slides: {len(decks)} decks with their outputs, {slides / 'index.html'}"
              f"{' (reveal.js and MathJax from a CDN)' if args.cdn else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
