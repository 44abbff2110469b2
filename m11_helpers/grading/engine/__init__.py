"""The grading engine: one notebook run under nbval, its cells' outcomes turned into scores and reports.

Used by the `m11 grade` command and class runs (classroom), the wrong-answer runner (authoring), the
tests and benchmarks. It may import the vocabularies (`grading.cells`, `grading.runenv`), the guard,
the sandbox and the kit (`procs`, `validate`, `tools`), never authoring or classroom: they import it.
`grader.grade_notebook` grades one notebook; `runner` builds the graded copy and runs it; `plugin` is
the pytest plugin inside that run (it records each cell and drives the guard); `results` and `report`
are the scores and their files.
"""
