"""Points by exercise kind: how much of a lesson the learner builds, derives or measures, and how much is transcription.

    points_by_kind(nb)          # {"build": 9, "derive": 3, "transcribe": 1} for a solution notebook
    python -m m11_helpers.grading.authoring.kinds   # the table for every lesson

Every check cell declares its exercise's kind (`grading.cells.KINDS`); an exercise with several check
cells has one kind (its cells must agree). The course's rule, tested in tests/test_lessons_graded.py:
transcription is at most 10 % of each lesson's points.
"""

from __future__ import annotations

import sys
from collections import Counter

from m11_helpers.grading.cells import CHECK, KIND, KINDS, POINTS, TRANSCRIBE, exercise_of, m11_meta, role_of

__all__ = ["points_by_kind", "transcription_share", "MAX_TRANSCRIPTION"]

MAX_TRANSCRIPTION = 0.10  # of a lesson's points (issue: "transcription at most 10 % of each lesson's points")


def points_by_kind(nb) -> dict[str, float]:
    """{kind: points} over the notebook's check cells; ValueError naming the exercise when a kind is missing or unknown."""
    points: Counter = Counter()
    kind_of: dict[str, str] = {}
    for cell in nb["cells"]:
        if role_of(cell) != CHECK:
            continue
        meta, ex = m11_meta(cell), exercise_of(cell)
        kind = meta.get(KIND)
        if kind not in KINDS:
            raise ValueError(f"exercise {ex}: kind={kind!r}; every check cell declares one of {sorted(KINDS)}")
        if kind_of.setdefault(ex, kind) != kind:
            raise ValueError(f"exercise {ex}: its check cells declare kinds {kind_of[ex]!r} and {kind!r}; one kind per exercise")
        points[kind] += float(meta.get(POINTS) or 0)
    return dict(points)


def transcription_share(nb) -> float:
    """Transcription points / all points of the notebook's checks (0 when it has no points)."""
    points = points_by_kind(nb)
    total = sum(points.values())
    return points.get(TRANSCRIBE, 0) / total if total else 0.0


def main(argv: list[str] | None = None) -> int:
    import nbformat

    from m11_helpers.tools.paths import repo_root

    order = list(KINDS)
    print(f"{'lesson':<28}" + "".join(f"{k:>11}" for k in order) + f"{'transcribed':>13}")
    for path in sorted((repo_root() / "solutions").glob("[0-9][0-9]_*.ipynb")):
        try:
            points = points_by_kind(nbformat.read(path, as_version=4))
        except ValueError as exc:
            print(f"{path.stem:<28}{exc}")
            continue
        total = sum(points.values()) or 1
        print(f"{path.stem:<28}" + "".join(f"{points.get(k, 0):>11g}" for k in order)
              + f"{points.get(TRANSCRIBE, 0) / total:>12.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
