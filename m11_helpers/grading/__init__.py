"""Graded exercises, in rooms by audience; each room's docstring says who uses it and what it may import.

At this top level, the check-cell API: `checks` (expect_close, expect_equal, expect_true, passed,
checking), `plain`, `observe` and `faults`, which check cells and wrong-answer files import by
these paths, and the kernel runs (the guard verifies each of them); and two vocabularies every
room shares, importing nothing: `cells` (a notebook cell's `m11` metadata, roles, markers) and
`runenv` (the environment variables one graded run is steered by). The rooms below: `engine`
(`m11 grade`: run a notebook under nbval, score, report), `guard` (the tamper guard around each
check cell), `sandbox` (the isolation a graded notebook runs in), `authoring` (`m11
make-exercises`, recorded wrong answers) and `classroom` (a class's submissions: collect, check,
grade, merge, CI). The route from a check cell to its verdict is drawn in CONTRIBUTING.md, "The
grading route". The API modules import only each other and the kit (`launch`, `procs`), never a room.
"""
