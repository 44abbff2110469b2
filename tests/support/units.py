"""The suite's scheduler units and what each costs: the longest are sent to the xdist workers first.

    scope = unit_of(nodeid)          # the unit a test runs in (a test file; the course; one lesson's wrong answers)
    units = unit_seconds(seconds)    # {nodeid: s} -> {unit: s}, what `m11 units:` prints and record() keeps
    items.sort(key=cost_order(items))    # most expensive unit first, each unit's tests in their own order

A unit runs whole on one worker (tests/conftest.py's scheduler). pytest-xdist sends units in the order
they first appear in the collection (with `--loadscope-reorder`, its default, by number of tests: the
contract test's 175 quick ones first, a lesson's one 90 s wrong-answer run last). Sent longest first
(LPT), no worker is left running a long unit alone at the end. The seconds come from the last run
on this machine (build/test-artifacts/unit-seconds.json, written at the end of every `make test`), else
from tests/data/unit-seconds.json, a clean-clone CI run's (refresh it by copying the first after a full
run). A unit neither knows ranks by its number of tests. Only the order depends on these seconds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "build" / "test-artifacts" / "unit-seconds.json"
COMMITTED = ROOT / "tests" / "data" / "unit-seconds.json"
# the course, and the tests that read its executed copies (`after_course`: decks, site, quiz answers)
COURSE_FILES = ("tests/test_browser.py", "tests/test_site.py", "tests/test_quizzes.py")


def unit_of(nodeid: str) -> str:
    """The scheduler unit of a test: its file, except the course's one unit and one unit per lesson's wrong answers."""
    path = nodeid.split("::")[0]
    if path.startswith("course/") or path in COURSE_FILES:
        return "course"
    if path == "tests/test_wrong_answers.py" and nodeid.endswith("]"):
        return f"{path}::{nodeid.rsplit('[', 1)[1].rstrip(']').split('-')[0]}"  # [02_collectives], [00_welcome-0]
    return path


def known_seconds() -> dict[str, float]:
    """{unit: seconds} of the last recorded run (this machine's, else the committed one); {} when neither reads."""
    for path in (MEASURED, COMMITTED):
        try:
            return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            continue
    return {}


def cost_order(nodeids: list[str], seconds: dict[str, float] | None = None):
    """A sort key over nodeids: units by recorded seconds (unknown ones by their number of tests, after), stable inside."""
    seconds = known_seconds() if seconds is None else seconds
    counts: dict[str, int] = defaultdict(int)
    for nodeid in nodeids:
        counts[unit_of(nodeid)] += 1

    def key(nodeid: str) -> tuple:
        unit = unit_of(nodeid)
        return (-seconds.get(unit, 0.0), -counts[unit], unit)

    return key


def unit_seconds(test_seconds: dict[str, float]) -> dict[str, float]:
    """{unit: seconds} summed from {nodeid: seconds} (setup, call and teardown already added per test)."""
    units: dict[str, float] = defaultdict(float)
    for nodeid, s in test_seconds.items():
        units[unit_of(nodeid)] += s
    return dict(units)


def record(units: dict[str, float], path: Path = MEASURED) -> None:
    """Write {unit: seconds} (the costliest first) for the next run's order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(units.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
