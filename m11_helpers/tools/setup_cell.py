"""The first code cell of every notebook, written in one place so that every lesson installs the same release.

On Colab or SageMaker a notebook opened alone has no course package: the cell installs it (core
dependencies only, pinned to this release's tag, so the host's Jupyter stack is left alone), then
calls `m11_helpers.setup`. `tests/test_repo.py` checks that every committed notebook's setup cell is
exactly `setup_cell_source()`; `m11 new-lesson` writes it.
"""

from __future__ import annotations

from m11_helpers import REPO, __version__

__all__ = ["install_spec", "setup_cell_source", "badge_urls", "readme_row"]


def install_spec(version: str = __version__) -> str:
    """The pip requirement a notebook installs: this release's tag of the course repository."""
    return f"m11-helpers @ git+https://github.com/{REPO}@v{version}"


def setup_cell_source(version: str = __version__) -> str:
    """The setup cell's source, the same in every course, solution and exercise notebook."""
    return (
        "# Setup: works as-is locally, on Colab and on SageMaker Studio (installs the course package if missing).\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if importlib.util.find_spec("m11_helpers") is None:\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
        f'                    "{install_spec(version)}"], check=True)\n'
        "from m11_helpers import setup\n"
        "\n"
        "env = setup(seed=0)"
    )


def badge_urls(notebook: str) -> dict[str, str]:
    """Open-in-Colab and Studio Lab links for a notebook path in the repository (e.g. "course/00_welcome.ipynb")."""
    return {
        "colab": f"https://colab.research.google.com/github/{REPO}/blob/main/{notebook}",
        "studiolab": f"https://studiolab.sagemaker.aws/import/github/{REPO}/blob/main/{notebook}",
    }


def readme_row(number: str, topic: str, title: str) -> str:
    """The README's row for a lesson: title linked to the notebook, its exercises, and the two badges."""
    stem = f"{number}_{topic}"
    links = badge_urls(f"course/{stem}.ipynb")
    return (f"| {number} | [{title}](course/{stem}.ipynb) · [exercises](exercises/{stem}.ipynb) | "
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({links['colab']}) "
            f"[![Open In SageMaker Studio Lab](https://studiolab.sagemaker.aws/studiolab.svg)]({links['studiolab']}) |")
