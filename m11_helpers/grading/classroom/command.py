"""`m11 grade`: run submitted notebooks under nbval, score each exercise, write reports.

    m11 grade exercises/ [--out reports/] [--cell-timeout 120] [--notebook-timeout 900]
              [--min-score PCT] [--source solutions/]
    m11 grade --class submissions/        one subfolder per student -> class.csv + their reports

Each notebook is graded by the engine (engine/grader.py: its own `python -m pytest --nbval-lax`
process, cwd = its folder, the course's check cells from `--source`, default REPO/solutions); with
`--class`, by a class run (grade_class.py). The command lives in this room because it can grade a
class: the engine never imports classroom. Nothing outlives the command, however it ends: SIGINT,
SIGTERM and SIGHUP (unless started under `nohup`) stop it cleanly (every descendant killed, daemons
included: it is a child subreaper; exit 128 + the signal's number), and on SIGKILL the chain of
parent-death signals takes the nbval process, then its kernel, then the kernel's ranks.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from m11_helpers.grading.classroom.grade_class import main_class
from m11_helpers.grading.engine import report
from m11_helpers.grading.engine.grader import grade, grade_notebook
from m11_helpers.grading.engine.results import NotebookResult
from m11_helpers.grading.sandbox import isolate as sandbox
from m11_helpers.procs import on_stop_signals
from m11_helpers.tools.paths import repo_root

__all__ = ["STOP_SIGNALS", "Stopped", "main"]

STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s)


class Stopped(BaseException):
    """`m11 grade` got SIGINT, SIGTERM or SIGHUP: unwind (each run's cleanup kills its processes), exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, _frame) -> None:
    for sig in STOP_SIGNALS:  # a second Ctrl-C must not interrupt the cleanup the first one started
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def _percent(results: list[NotebookResult]) -> float:
    top = sum(r.max_score for r in results)
    return 100.0 * sum(r.score for r in results) / top if top else 100.0


def main(argv: list[str]) -> int:
    """`m11 grade`; exit 1 below --min-score, 2 on bad arguments, 128 + N when stopped by signal N."""
    mine = threading.current_thread() is threading.main_thread()  # only there can Python take signals
    previous = {}
    try:
        if mine:
            previous = on_stop_signals(_stop, STOP_SIGNALS)
        return _main(argv)
    except Stopped as e:
        print(f"m11 grade: stopped by {signal.Signals(e.signum).name}; every process it started was killed",
              file=sys.stderr)
        return 128 + e.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="m11 grade", description="autograde notebooks, write reports")
    ap.add_argument("paths", nargs="*", type=Path, help="notebooks or folders to grade")
    ap.add_argument("--class", dest="klass", type=Path, metavar="DIR",
                    help="a folder with one subfolder of notebooks per student")
    ap.add_argument("--out", type=Path, default=Path("reports"), help="report folder (default reports/)")
    ap.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell (default 120)")
    ap.add_argument("--notebook-timeout", type=float, default=900, help="seconds per notebook (default 900)")
    ap.add_argument("--min-score", type=float, metavar="PCT", help="exit 1 when the score is below PCT")
    ap.add_argument("--source", type=Path, help="solution notebooks with the full check cells "
                    "(default: REPO/solutions when it exists)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    problems = []
    if bool(args.paths) == bool(args.klass):
        problems.append("give notebooks/folders to grade, or --class DIR, not both")
    if args.cell_timeout <= 0 or args.notebook_timeout <= 0:
        problems.append("--cell-timeout and --notebook-timeout must be > 0 seconds")
    if args.min_score is not None and not 0 <= args.min_score <= 100:
        problems.append(f"--min-score={args.min_score}: allowed 0..100 (a percentage)")
    for p in [*args.paths, *([args.klass] if args.klass else []), *([args.source] if args.source else [])]:
        if not p.exists():
            problems.append(f"{p}: no such file or folder")
    if problems:
        print("m11 grade: " + "\n  ".join(problems), file=sys.stderr)
        return 2
    source = args.source
    if source is None:
        try:
            source = repo_root() / "solutions"
        except ValueError:
            source = None
        source = source if source and source.is_dir() else None

    if args.klass:  # integrity checks, missing notebooks, sandbox, class.csv: grade_class.py
        return main_class(args.klass, source, args.out, args.cell_timeout, args.notebook_timeout,
                                    args.min_score, grade_notebook)
    try:
        results = grade(args.paths, source, args.cell_timeout, args.notebook_timeout)
    except ValueError as e:
        print(f"m11 grade: {e}", file=sys.stderr)
        return 2
    isolation = sandbox.describe()  # every report says what isolated the notebooks, or warns that nothing did
    for r in results:
        r.notes.insert(0, isolation)
    report.write_reports(results, args.out)
    print(report.terminal_table(results))
    print(f"reports written to {args.out}/ (report.md, report.json, junit.xml)")
    return 1 if args.min_score is not None and _percent(results) < args.min_score else 0
