"""GitHub Classroom's points for a student repository: `m11 grade`'s report.json in the form Classroom reads.

    python -m m11_helpers.grading.classroom.points reports/report.json --min-score 60

The grading step of the student template (templates/student_repo/.github/workflows/grade.yml) runs
this after `m11 grade`; the next step, `classroom-resources/autograding-grading-reporter@v1`, hands
the points to GitHub Classroom's dashboard. The form is that reporter's (its src/main.js and
src/notify-classroom.js, read 2026-12): for each runner id R in its `runners` input it reads the
environment variable `R_RESULTS` (upper case), base64 of the JSON

    {"version": 1, "status": "pass" | "fail" | "error", "max_score": M,
     "tests": [{"name": ..., "status": "pass" | "fail", "score": s, "message": ...}, ...]}

adds up the tests' `score` and the runners' `max_score`, prints a table, posts the notice
"Points <total>/<max>" (title "Autograding complete") that the dashboard reads, and fails the job
when a runner's `status` is "fail". Here: one runner (`m11-grade`), one test per exercise
("03_data_parallel.ipynb · Exercise 2") scoring its points, `max_score` the report's total, and
`status` "fail" only below the repository's threshold (MIN_SCORE), so the job fails exactly when
the existing gate does. No lesson: grading (docs/instructor-guide.md, "GitHub Classroom").
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path

__all__ = ["RUNNER", "runner_result", "encode", "decode", "points", "main"]

RUNNER = "m11-grade"  # the grading step's id: the reporter reads M11-GRADE_RESULTS


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 2)


def runner_result(report: dict, min_score: float) -> dict:
    """The reporter's runner result for one `m11 grade` report.json: a test per exercise, a total.

    status: "pass" when score / max_score >= min_score percent (no exercise counts as a pass), else "fail"."""
    tests = []
    for nb in report["notebooks"]:
        for ex in nb["exercises"]:
            ok = ex["status"] == "passed"
            tests.append({"name": f"{nb['notebook']} · Exercise {ex['exercise']}", "status": "pass" if ok else "fail",
                          "score": _num(ex["points"]), "max_score": _num(ex["max_points"]),
                          "message": None if ok else (ex.get("why") or ex["status"])[:500],
                          "test_code": f"m11 grade exercises/{nb['notebook']}", "filename": f"exercises/{nb['notebook']}",
                          "line_no": 0, "execution_time": f"{nb.get('seconds', 0):.1f}s"})
    top = report["max_score"]
    passed = (100.0 * report["score"] / top if top else 100.0) >= min_score
    return {"version": 1, "status": "pass" if passed else "fail", "max_score": _num(top), "tests": tests}


def encode(result: dict) -> str:
    """base64 of the JSON, as the reporter decodes it (Buffer.from(value, 'base64'))."""
    return base64.b64encode(json.dumps(result, ensure_ascii=False).encode()).decode()


def decode(value: str) -> dict:
    return json.loads(base64.b64decode(value).decode())


def points(*results: dict) -> tuple[float, float]:
    """(total, max) as notify-classroom.js adds them: runners without max_score count for nothing."""
    scored = [r for r in results if r.get("max_score")]
    return (sum(t["score"] for r in scored for t in r["tests"]), sum(r["max_score"] for r in scored))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m m11_helpers.grading.classroom.points", description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="m11 grade's report.json")
    parser.add_argument("--min-score", type=float, default=0.0, help="percent below which the runner's status is fail")
    args = parser.parse_args(argv)
    result = runner_result(json.loads(args.report.read_text(encoding="utf-8")), args.min_score)
    for t in result["tests"]:
        print(f"{'✅' if t['status'] == 'pass' else '❌'} {t['name']}: {t['score']}/{t['max_score']}")
    total, top = points(result)
    print(f"Points {_num(total)}/{_num(top)} for GitHub Classroom (status {result['status']})")
    out = os.environ.get("GITHUB_OUTPUT")
    if out:  # the step's output `result`, which the reporter step reads as M11-GRADE_RESULTS
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"result={encode(result)}\n")
    else:
        print("(GITHUB_OUTPUT is not set: nothing written for the reporter)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
