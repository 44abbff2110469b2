"""The instructor's CI commands: collect at the deadline, plan the shards, grade one, merge them.

    python -m m11_helpers.grading.classroom.ci due --deadline ISO --event schedule [--repository OWNER/NAME]
                                        # `run=true|false` and `artifact=class-grades-…` for $GITHUB_OUTPUT
    python -m m11_helpers.grading.classroom.ci collect --classroom ID | --export PATH --deadline ISO --out submissions/
    python -m m11_helpers.grading.classroom.ci plan submissions/ --shard-size 20         # `matrix=…` for $GITHUB_OUTPUT
    python -m m11_helpers.grading.classroom.ci grade submissions/ --source solutions/ [--notebooks 05_zero_fsdp]
                                        [--shard 2/15] --out shards/shard-2
    python -m m11_helpers.grading.classroom.ci merge shards/ --submissions submissions/ --out reports/
                                        [--summary "$GITHUB_STEP_SUMMARY"]

The jobs of `templates/instructor_repo/.github/workflows/grade-class.yml` run these; they work the
same by hand. due, collect, plan and merge need only the course and nbformat/psutil (no pytest, no
torch): what grading needs is imported by `grade` alone. A scheduled run grades once: `due` says no
before the deadline, more than `--window-hours` (24) after it, or when this repository already holds a
grade artifact for that deadline (`gh api repos/OWNER/NAME/actions/artifacts`, the workflow's own
token); a run by hand always grades. Exit codes: 0, 1 (merge: a student no shard reported), 2 (bad
input, no sandbox where M11_GRADE_SANDBOX=require).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from m11_helpers.grading.classroom import collect
from m11_helpers.grading.classroom import grade_class as classroom
from m11_helpers.grading.engine import report

__all__ = ["main", "artifact_name", "due"]

ARTIFACT = "class-grades"  # + the deadline: the merge job's artifact, how a scheduled run knows it is done


def artifact_name(deadline: str) -> str:
    """The grade artifact's name for one deadline, e.g. class-grades-2025-03-14T2359Z (no `:` in a name)."""
    if not deadline:
        return ARTIFACT
    return f"{ARTIFACT}-{collect.parse_deadline(deadline).astimezone(timezone.utc):%Y-%m-%dT%H%MZ}"


def _graded_before(repository: str, name: str) -> str:
    """Why a grade artifact `name` already exists in `repository` ('' when none does or GitHub cannot say)."""
    out = subprocess.run(["gh", "api", f"repos/{repository}/actions/artifacts?name={name}&per_page=100"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:  # cannot tell: grading twice costs runner time, not grading costs a grade
        print(f"::warning::could not list this repository's artifacts ({' '.join(out.stderr.split())[:300]}): "
              "grading", file=sys.stderr)
        return ""
    live = [a for a in json.loads(out.stdout or "{}").get("artifacts", []) if not a.get("expired")]
    return f"{name} exists (run {live[0].get('workflow_run', {}).get('id', '?')})" if live else ""


def due(deadline: str, event: str, repository: str = "", window_hours: float = 24,
        now: datetime | None = None) -> tuple[bool, str]:
    """(grade now?, why): a run by hand always; a scheduled one once, within `window_hours` after the deadline."""
    if event != "schedule":
        return True, f"{event}: graded on request"
    if not deadline:
        return False, "no deadline set (vars.M11_DEADLINE)"
    when, now = collect.parse_deadline(deadline), now or datetime.now(timezone.utc)
    if now < when:
        return False, f"the deadline ({deadline}) has not passed"
    if now > when + timedelta(hours=window_hours):
        return False, (f"the deadline ({deadline}) passed more than {window_hours:g} h ago: graded then "
                       "(regrade by hand: Actions > grade-class > Run workflow)")
    done = _graded_before(repository, artifact_name(deadline)) if repository else ""
    return (False, f"already graded for this deadline: {done}") if done else (True, "the deadline has passed")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m m11_helpers.grading.classroom.ci", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("due", help="should this run grade? (print run=… and artifact=…)")
    d.add_argument("--deadline", default="", help="ISO 8601 with a time zone")
    d.add_argument("--event", default="workflow_dispatch", help="$GITHUB_EVENT_NAME: schedule, workflow_dispatch")
    d.add_argument("--repository", default="", help="OWNER/NAME whose grade artifacts to look for (gh, GH_TOKEN)")
    d.add_argument("--window-hours", type=float, default=24, help="a scheduled run grades this long after the deadline")
    c = sub.add_parser("collect", help="collect the submissions at the deadline")
    c.add_argument("--classroom", metavar="ASSIGNMENT_ID", help="GitHub Classroom assignment (gh, GH_TOKEN)")
    c.add_argument("--export", type=Path, help="an LMS export: a .zip or a folder")
    c.add_argument("--deadline", default="", help="ISO 8601 with a time zone (required with --classroom)")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--not-before-deadline", action="store_true",
                   help="collect nobody while the deadline is still ahead (a scheduled run)")
    p = sub.add_parser("plan", help="print the CI matrix of shards")
    p.add_argument("klass", type=Path)
    p.add_argument("--shard-size", type=int, default=20)
    g = sub.add_parser("grade", help="grade (a shard of) a class in the sandbox")
    g.add_argument("klass", type=Path)
    g.add_argument("--source", type=Path, help="solution notebooks with the hidden tests")
    g.add_argument("--notebooks", default="", help="comma-separated, e.g. 05_zero_fsdp (default: all handed in)")
    g.add_argument("--shard", default="1/1", help="K/N: grade the K-th of N shards")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--cell-timeout", type=float, default=120)
    g.add_argument("--notebook-timeout", type=float, default=900)
    m = sub.add_parser("merge", help="merge the shards' reports into class.csv and a summary")
    m.add_argument("shards", type=Path)
    m.add_argument("--submissions", type=Path, help="the class folder: who should have a row")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--summary", type=Path, help="append the summary table here (e.g. $GITHUB_STEP_SUMMARY)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "due":
            run, reason = due(args.deadline, args.event, args.repository, args.window_hours)
            print(f"{'grading' if run else 'not grading'}: {reason}", file=sys.stderr)
            print(f"run={'true' if run else 'false'}\nartifact={artifact_name(args.deadline)}")
        elif args.command == "collect":
            if bool(args.classroom) == bool(args.export):
                raise ValueError("give --classroom ASSIGNMENT_ID or --export PATH (one of them)")
            when = collect.parse_deadline(args.deadline) if args.deadline else None
            if args.not_before_deadline and (when is None or when > datetime.now(timezone.utc)):
                args.out.mkdir(parents=True, exist_ok=True)
                print(f"the deadline ({args.deadline or 'none'}) has not passed: nothing collected")
                return 0
            if args.classroom:
                collect.collect_classroom(args.classroom, collect.parse_deadline(args.deadline), args.out)
            else:
                collect.collect_export(args.export, when, args.out)
            print(f"{len(classroom.students(args.out))} submissions in {args.out}/")
        elif args.command == "plan":
            count = len(classroom.students(args.klass)) if args.klass.is_dir() else 0
            print(f"matrix={json.dumps(classroom.plan(args.klass, args.shard_size))}")
            print(f"students={count}\ngo={'true' if count else 'false'}")
        elif args.command == "grade":
            from m11_helpers.grading.engine.grader import (
                grade_notebook,  # the grade job alone installs nbval and pytest
            )

            k, _, n = args.shard.partition("/")
            names = [f"{s.strip().removesuffix('.ipynb')}.ipynb" for s in args.notebooks.split(",") if s.strip()]
            rows = classroom.grade_class(args.klass, args.source, args.out, grade_notebook, names,
                                         (int(k), int(n or 1)), args.cell_timeout, args.notebook_timeout)
            print(report.class_table([(r.student, r.notebook, r.score, r.max) for r in rows]))
        else:
            rows = classroom.merge(args.shards, args.out, args.submissions)
            if args.summary:
                with open(args.summary, "a", encoding="utf-8") as f:
                    f.write(classroom.summary(rows))
            print(classroom.summary(rows))
            return 1 if any(r.status == "not graded" for r in rows) else 0
    except (ValueError, RuntimeError) as e:
        print(f"m11_helpers.grading.classroom.ci {args.command}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
