"""m11_helpers: the companion package of M11 · Training at Scale.

    from m11_helpers import setup            # every lesson's first cell
    from m11_helpers.launch import launch    # N real processes from a notebook

The package has three layers (CONTRIBUTING.md, "The layout"): the **kit** every lesson uses
(`launch/`, `models`, `data`, `config`, `quiz`, …) at the top, each **lesson's** own modules (named in
`m11_helpers/lessons.py`, the lesson table), and the **tools** behind the `m11` command (`tools/`, `grading/`).
This file stays light so `import m11_helpers` is instant: torch is imported by the modules that need it.
"""

from m11_helpers.environment import setup

__version__ = "0.2.0"
# Where the course is published: the README's badges and every setup cell's install line use it.
REPO = "m11-course/training-at-scale"

__all__ = ["setup", "__version__", "REPO"]
