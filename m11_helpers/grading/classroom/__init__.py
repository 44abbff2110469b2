"""Class runs: an instructor's class of submissions collected, checked, graded and merged, here and in CI.

Used by `m11 grade --class` (grade_class), the instructor repository's workflow (`python -m
m11_helpers.grading.classroom.ci`) and the student template's GitHub Classroom step (`points`). It
may import every other room (the engine to grade, the sandbox to say what isolated a run, authoring
to know the learner's copy of an exercise) and `grading.cells`; nothing in the other rooms imports
it. `collect`, `ci` and `points` must import without pytest or torch (the workflow's collect and
merge jobs install neither).
"""
