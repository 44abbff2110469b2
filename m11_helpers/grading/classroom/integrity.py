"""Is a submission usable, and did it touch the course's checks? Answered before a notebook is graded.

`inspect(student_folder, "05_zero_fsdp.ipynb", solutions)` gives one of
- `graded`: the notebook to grade (found by its name, or else by its exercise ids under another name),
  with notes on every check cell that differs from the course's: edited, deleted or added (the grader
  runs the course's checks in their place, hidden tests included: `runner.prepare`);
- `not a notebook`: the file is not a readable notebook, or a PDF/.py was handed in under that name, or
  it (or the student's folder) is a symbolic link, or lies under one, or resolves outside the folder:
  the grader reads notebooks on the host, outside the sandbox, where a link reaches another student's
  work or `solutions/` (other links in the folder are ignored, and named in the notes);
- `wrong lesson`: the notebook holds another lesson's exercises;
- `missing`: nothing of the lesson in the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from m11_helpers.grading.cells import CHECK, EXERCISE, exercise_of, m11_meta, role_of

__all__ = ["read_notebook", "exercise_ids", "integrity", "inspect"]


def read_notebook(path: Path):
    """The notebook at `path` (nbformat 4); raises on anything that is not one."""
    import nbformat
    return nbformat.read(path, as_version=4)


def exercise_ids(nb) -> set[str]:
    """The exercise ids its cells carry in `metadata.m11`."""
    return {exercise_of(c) for c in nb.cells if m11_meta(c).get(EXERCISE) is not None}


def _checks(nb) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for c in nb.cells:
        if role_of(c) == CHECK:
            found.setdefault(exercise_of(c), []).append(
                "\n".join(line.rstrip() for line in c.source.strip().splitlines()))
    return found


def integrity(nb, source, name: str) -> list[str]:
    """What a submission changed in the course's check cells (the grader runs the course's instead)."""
    from m11_helpers.grading.authoring.exercises import make_exercise
    given, full, theirs = _checks(make_exercise(source, name)), _checks(source), _checks(nb)
    notes = []
    for ex in given:
        if ex not in theirs:
            notes.append(f"integrity: the check cell of exercise {ex} was deleted; the course's was run")
        elif any(s not in (given[ex] + full[ex]) for s in theirs[ex]) or len(theirs[ex]) != len(given[ex]):
            notes.append(f"integrity: the check cell of exercise {ex} was edited; the course's was run instead")
    notes += [f"integrity: a check cell for exercise {ex}, which the course does not have, was ignored"
              for ex in theirs if ex not in given]
    return notes


def _linked(path: Path, folder: Path) -> bool:
    """A symbolic link, under one, or anything that resolves outside the student's own folder."""
    parts = [path, *path.relative_to(folder).parents]
    return any((folder / p if p != path else p).is_symlink() for p in parts) or \
        not path.resolve().is_relative_to(folder.resolve())


def inspect(folder: Path, expected: str, source_dir: Path | None) -> tuple[str, Path | None, list[str]]:
    """(status, notebook to grade, notes) for one expected notebook in a student's folder."""
    if folder.is_symlink():  # the grader reads notebooks here, outside the sandbox: a link is someone else's work
        return "not a notebook", None, [f"not a notebook: the submission's folder is a symbolic link (to "
                                        f"{os.readlink(folder)}), not the student's own work"]
    source = read_notebook(source_dir / expected) if source_dir and (source_dir / expected).is_file() else None
    lesson = exercise_ids(source) if source is not None else set()
    found = folder.rglob("*") if folder.is_dir() else []  # a roster name with nothing collected: "missing"
    every = sorted((p for p in found if (p.is_file() or p.is_symlink()) and ".ipynb_checkpoints" not in p.parts),
                   key=lambda p: (len(p.parts), str(p)))
    links = [p for p in every if _linked(p, folder)]
    if any(p.name == expected for p in links):
        target = next(os.readlink(p) for p in links if p.name == expected and p.is_symlink())
        return "not a notebook", None, [f"{expected} is not a notebook: a symbolic link (to {target}), not the "
                                        "student's own work"]
    files = [p for p in every if p not in links and p.is_file()]
    ignored = [f"ignored symbolic links: {', '.join(str(p.relative_to(folder)) for p in links)}"] if links else []
    status, path, notes = _find(folder, expected, source, lesson, files)
    return status, path, notes + ignored


def _find(folder: Path, expected: str, source, lesson: set[str], files: list[Path]) -> tuple[str, Path | None, list[str]]:
    named = [p for p in files if p.name == expected]
    for path in named + [p for p in files if p.suffix == ".ipynb" and p not in named]:
        try:
            nb = read_notebook(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file is "not a notebook", never a crash
            if path in named:
                return "not a notebook", None, [f"{path.name} is not a readable notebook ({type(e).__name__})"]
            continue
        ids = exercise_ids(nb)
        if source is None or ids & lesson or (path in named and not ids):
            notes = [] if path in named else [f"graded {path.relative_to(folder)} (expected name: {expected})"]
            if source is not None and not ids:
                notes.append("the notebook has no exercise metadata: the course's checks were added at the end")
            return "graded", path, notes + (integrity(nb, source, expected) if source is not None else [])
        if path in named:
            return "wrong lesson", None, [f"{expected} holds exercises {', '.join(sorted(ids))}, "
                                          f"not this lesson's ({', '.join(sorted(lesson))})"]
    stem = Path(expected).stem
    other = [p.name for p in files if p.stem == stem]
    if other:
        return "not a notebook", None, [f"handed in {', '.join(other)}, not {expected}"]
    found = ", ".join(p.name for p in files if p.suffix == ".ipynb")
    return "missing", None, [f"no {expected} in the submission" + (f" (it holds {found})" if found else "")]
