"""The cell vocabulary: what marks a notebook cell as an exercise's answer, its check, or the course's own.

Every reader of a graded notebook takes its words from here: the exercise generator
(authoring/exercises.py), the grader's runner and plugin (engine/), the integrity check
(classroom/integrity.py), notebook storage (tools/notebooks.py) and the tests. It imports nothing,
so anything may import it (the guard and the sandbox too).

A cell's `metadata.m11` is a dict: `{"exercise": "3.2", "role": "solution"}` around the answer,
`{"exercise": "3.2", "role": "check", "points": 2, "kind": "build"}` on a check cell (`kind`: one of
KINDS, what the exercise asks of the learner), and `{"role": "course"}`, which
only the grader writes, on the course's own cells in the graded copy (the guard keeps what they define).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["META", "EXERCISE", "ROLE", "POINTS", "SOLUTION", "CHECK", "COURSE", "AUTHOR_ROLES",
           "BEGIN_SOLUTION", "END_SOLUTION", "BEGIN_HIDDEN", "END_HIDDEN", "CODE_STUB", "ANSWER_STUB",
           "CHECK_OUTPUT", "KIND", "KINDS", "TRANSCRIBE", "m11_meta", "role_of", "exercise_of"]

META = "m11"  # the cell metadata key
EXERCISE, ROLE, POINTS = "exercise", "role", "points"  # its keys
SOLUTION, CHECK, COURSE = "solution", "check", "course"  # its roles
KIND = "kind"  # a check cell's key: what the exercise asks of the learner, one of KINDS
TRANSCRIBE = "transcribe"
KINDS = {  # the exercise kinds, as authoring/kinds.py counts points (at most 10 % transcription per lesson)
    "build": "write the mechanism itself (a collective, a schedule, a sharded optimizer), checked on real ranks",
    "derive": "work out a quantity or a rule the lesson did not print, from first principles",
    "measure": "design and run a measurement, then read the mechanism from it",
    "diagnose": "find and fix what a broken run or an implementation gets wrong",
    TRANSCRIBE: "turn a rule the lesson printed into code",
}
AUTHOR_ROLES = (SOLUTION, CHECK)  # what an author writes; COURSE is the grader's alone

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"  # the answer: a stub in exercises/
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"  # cases the learner never sees
CODE_STUB = "# YOUR CODE HERE"  # what replaces a code answer (then a NotImplementedError naming the exercise)
ANSWER_STUB = "YOUR ANSWER HERE"  # what replaces a markdown answer
CHECK_OUTPUT = "# NBVAL_CHECK_OUTPUT"  # a code cell's first line: its stored outputs are kept and compared


def m11_meta(cell: Mapping[str, Any]) -> dict:
    """The cell's `metadata.m11` ({} when absent or not a dict)."""
    meta = (cell.get("metadata") or {}).get(META, {})
    return meta if isinstance(meta, dict) else {}


def role_of(cell: Mapping[str, Any]) -> str | None:
    """The cell's role (`solution`, `check`, `course`) or None."""
    return m11_meta(cell).get(ROLE)


def exercise_of(cell: Mapping[str, Any]) -> str:
    """The cell's exercise id as text ("None" when it has none, as the grader has always keyed it)."""
    return str(m11_meta(cell).get(EXERCISE))
