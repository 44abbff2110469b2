"""The grading engine: `m11 grade` runs one notebook under nbval and turns its cells' outcomes into scores.

Used by `m11 grade` (grader), the wrong-answer runner (authoring) and class runs (classroom). It
may import the vocabularies (`grading.cells`, `grading.runenv`), the guard, the sandbox and the kit
(`procs`, `validate`, `tools`), never authoring or classroom: they import it. `runner` builds the
graded copy and runs it; `plugin` is the pytest plugin inside that run (it records each cell and
drives the guard); `results` and `report` are the scores and their files.
"""
