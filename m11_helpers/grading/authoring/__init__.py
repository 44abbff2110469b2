"""Authoring: what a course author runs to turn solutions into exercises and prove wrong answers score 0.

Used by `m11 make-exercises` and `new-lesson` (exercises), tests/test_wrong_answers.py and a
lesson's author (wrong_answers), and classroom (its integrity check compares a submission with the
generated exercise). It may import `grading.cells`, the engine (wrong answers run through the
grader's own runner) and `tools` (notebook storage, the repository root), never classroom.
"""
