"""Score reports for `m11 grade`: Markdown for people, JSON for scripts, JUnit XML for CI.

`write_reports(results, out)` writes `report.md` (a table per notebook: exercise, points, max,
status, why), `report.json` and `junit.xml` (one testcase per exercise); `terminal_table` is what
the command prints and `class_table` the class summary (class.csv itself: classroom.write_csv).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Iterable
from xml.etree import ElementTree as ET

from m11_helpers.grading.engine.results import NotebookResult

__all__ = ["write_reports", "terminal_table", "markdown", "junit_xml", "class_table"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def _one_line(text: str, width: int = 0) -> str:
    text = "; ".join(s.strip() for s in _ANSI.sub("", text).splitlines() if s.strip())
    return text if not width or len(text) <= width else text[: width - 1] + "…"


def _percent(score: float, top: float) -> str:
    return f"{100 * score / top:.0f}%" if top else "-"


def markdown(results: Iterable["NotebookResult"]) -> str:
    """The Markdown report: a heading and a table per notebook, then the total."""
    results = list(results)
    parts = ["# Grading report", ""]
    for r in results:
        parts += [f"## {r.notebook}: {_num(r.score)} / {_num(r.max_score)} "
                  f"({_percent(r.score, r.max_score)}, {r.seconds:.0f} s)", ""]
        parts += [f"> {_one_line(n)}" for n in r.notes] + ([""] if r.notes else [])
        parts += ["| exercise | points | max | status | why |", "|---|---:|---:|---|---|"]
        for e in r.exercises:
            why = _one_line(e.why, 400).replace("|", "\\|")
            parts.append(f"| {e.exercise} | {_num(e.points)} | {_num(e.max_points)} | {e.status} | {why} |")
        parts.append("")
    score, top = sum(r.score for r in results), sum(r.max_score for r in results)
    parts.append(f"**Total: {_num(score)} / {_num(top)} ({_percent(score, top)})**")
    return "\n".join(parts) + "\n"


def junit_xml(results: Iterable["NotebookResult"]) -> str:
    """JUnit XML: a testsuite per notebook, a testcase per exercise (failed when not passed)."""
    root = ET.Element("testsuites", name="m11 grade")
    for r in results:
        failures = sum(e.status != "passed" for e in r.exercises)
        suite = ET.SubElement(root, "testsuite", name=r.notebook, tests=str(len(r.exercises)),
                              failures=str(failures), errors="0", time=f"{r.seconds:.1f}")
        for e in r.exercises:
            case = ET.SubElement(suite, "testcase", classname=Path(r.notebook).stem,
                                 name=f"Exercise {e.exercise}", time="0")
            if e.status != "passed":
                fail = ET.SubElement(case, "failure", message=_one_line(e.why, 300) or e.status,
                                     type="tampering" if getattr(e, "tampering", None) else e.status)
                fail.text = _ANSI.sub("", e.why)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def terminal_table(results: Iterable["NotebookResult"]) -> str:
    """A plain-text table for the terminal: one row per exercise, a total line."""
    results = list(results)
    lines = []
    for r in results:
        lines.append(f"{r.notebook}  {_num(r.score)}/{_num(r.max_score)}  ({r.seconds:.0f} s)")
        for n in r.notes:
            lines.append(f"  note: {_one_line(n, 100)}")
        for e in r.exercises:
            mark = "✔" if e.status == "passed" else "✘"
            lines.append(f"  {mark} {e.exercise:<8} {_num(e.points):>5}/{_num(e.max_points):<5} "
                         f"{e.status:<8} {_one_line(e.why, 80)}")
    score, top = sum(r.score for r in results), sum(r.max_score for r in results)
    lines.append(f"total {_num(score)}/{_num(top)} ({_percent(score, top)})")
    return "\n".join(lines)


def write_reports(results: list["NotebookResult"], out: Path) -> None:
    """Write report.md, report.json and junit.xml into `out` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(results), encoding="utf-8")
    data = {"score": sum(r.score for r in results), "max_score": sum(r.max_score for r in results),
            "notebooks": [dict(asdict(r), score=r.score, max_score=r.max_score) for r in results]}
    (out / "report.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "junit.xml").write_text(junit_xml(results), encoding="utf-8")


def class_table(rows: list[tuple[str, str, float, float]]) -> str:
    """The class summary printed after `m11 grade --class`."""
    lines = [f"{'student':<20} {'notebook':<28} score"]
    lines += [f"{s:<20} {nb:<28} {_num(score)}/{_num(top)}" for s, nb, score, top in rows]
    return "\n".join(lines)
