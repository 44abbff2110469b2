"""The suite's scheduler units and what each costs: the longest are sent to the xdist workers first.

    scope = unit_of(nodeid)          # the unit a test runs in (a test file; the course; one lesson's wrong answers)
    units = unit_seconds(seconds)    # {nodeid: s} -> {unit: s}, what `m11 units:` prints
    items.sort(key=cost_order(items))    # most expensive unit first, each unit's tests in their own order

A unit runs whole on one worker (tests/conftest.py's scheduler). pytest-xdist sends units in the order
they first appear in the collection (with `--loadscope-reorder`, its default, by number of tests: the
contract test's 175 quick ones first, a lesson's one 90 s wrong-answer run last). Sent longest first
(LPT), no worker is left running a long unit alone at the end. What a unit costs is the sum of the
seconds its SELECTED tests took in the last run that ran them: per test, not per unit, because
`make test-lesson` runs a slice of the shared units (one course notebook of thirteen, one lesson's
graded exercise): priced whole, the course (~450 s in `make test`, ~25 s of it one lesson's) went out
first and lesson 10's wrong-answer parts and its elastic restart last, a longer and busier run
(100-109 s against 85-88 s, the same code, runs alternated). The seconds come from this machine's last runs
(build/test-artifacts/test-seconds.json, updated at the end of every run, the tests it ran replaced),
else from tests/data/test-seconds.json, a clean-clone CI run's (refresh it by copying the first after a
full run). A unit none of whose tests has seconds ranks by its number of tests, after the rest. Only the
order depends on these seconds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "build" / "test-artifacts" / "test-seconds.json"
COMMITTED = ROOT / "tests" / "data" / "test-seconds.json"
# the course, and the tests that read its executed copies (`after_course`: decks, site, quiz answers)
COURSE_FILES = ("tests/test_browser.py", "tests/test_site.py", "tests/test_quizzes.py")
KEEP_S = 0.05  # a test quicker than this is kept as 0 s: the file lists the ~third of the tests that cost


def unit_of(nodeid: str) -> str:
    """The scheduler unit of a test: its file, except the course's one unit and one unit per lesson's wrong answers."""
    path = nodeid.split("::")[0]
    if path.startswith("course/") or path in COURSE_FILES:
        return "course"
    if path == "tests/test_wrong_answers.py" and nodeid.endswith("]"):
        return f"{path}::{nodeid.rsplit('[', 1)[1].rstrip(']').split('-')[0]}"  # [02_collectives], [00_welcome-0]
    return path


def known_seconds() -> dict[str, float]:
    """{nodeid: seconds} of the last recorded runs (this machine's, else the committed one); {} when neither reads."""
    for path in (MEASURED, COMMITTED):
        try:
            return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            continue
    return {}


def cost_order(nodeids: list[str], seconds: dict[str, float] | None = None):
    """A sort key over nodeids: units by the recorded seconds of their tests among `nodeids` (units with none
    recorded by their number of tests, after), stable inside a unit."""
    seconds = known_seconds() if seconds is None else seconds
    counts: dict[str, int] = defaultdict(int)
    cost: dict[str, float] = defaultdict(float)
    for nodeid in nodeids:
        unit = unit_of(nodeid)
        counts[unit] += 1
        cost[unit] += seconds.get(nodeid, 0.0)

    def key(nodeid: str) -> tuple:
        unit = unit_of(nodeid)
        return (-cost[unit], -counts[unit], unit)

    return key


def unit_seconds(test_seconds: dict[str, float]) -> dict[str, float]:
    """{unit: seconds} summed from {nodeid: seconds} (setup, call and teardown already added per test)."""
    units: dict[str, float] = defaultdict(float)
    for nodeid, s in test_seconds.items():
        units[unit_of(nodeid)] += s
    return dict(units)


def record(test_seconds: dict[str, float], path: Path = MEASURED) -> None:
    """Write {nodeid: seconds} for the next run's order: the tests that ran replace their last seconds, the rest
    keep theirs (a lesson's run leaves the others' as they were); the costliest first, quick ones left out."""
    merged = {**known_seconds(), **test_seconds}
    kept = {k: round(v, 2) for k, v in sorted(merged.items(), key=lambda kv: -kv[1]) if v >= KEEP_S}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=0) + "\n")
