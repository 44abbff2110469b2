"""The tools layer: what the `m11` command does (notebook storage, slides, assets, course runner, doctor, new-lesson,
where, gpu-check), each subcommand in its own module (`cli.COMMANDS`).

Imported only by tools and the grader (`m11_helpers.grading`), and by one notebook: lesson 00 shows
`tools.doctor`'s checks (CONTRIBUTING.md, "The layout"; tests/support/import_rules.py enforces it).
Importing this package imports nothing else.
"""
