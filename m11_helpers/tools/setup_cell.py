"""The first code cell of every notebook, written in one place so that every lesson installs the same release.

On Colab or SageMaker a notebook opened alone has no course package: the cell installs it (core
dependencies only, pinned to this release's tag, every installed package a constraint, so the
host's Jupyter stack is left alone), then calls `m11_helpers.setup`. `tests/test_repo.py` checks
that every committed notebook's setup cell is exactly `setup_cell_source()`; `m11 new-lesson`
writes it, and after a change here (a new release tag) `python -m m11_helpers.tools.setup_refresh`
rewrites it in course/, solutions/ and exercises/. This module is imported by the core (no nbformat).
"""

from __future__ import annotations

from m11_helpers import REPO, __version__

__all__ = ["install_spec", "setup_cell_source", "repo_url", "badge_urls", "readme_row"]


def install_spec(version: str = __version__, extra: str = "") -> str:
    """The pip requirement a notebook installs: this release's tag of the course repository (+ an extra)."""
    return f"m11-helpers{f'[{extra}]' if extra else ''} @ git+https://github.com/{REPO}@v{version}"


def setup_cell_source(version: str = __version__) -> str:
    """The setup cell's source, the same in every course, solution and exercise notebook.

    The install takes every package already installed as a constraint (`pip list --format=freeze`):
    the course's packages are added, none of the host's is upgraded or downgraded. Without that,
    on a Colab-like host (jupyter-server 1.24, anyio 3.7) accelerate's newest dependencies
    (huggingface_hub 2 → httpx2 → anyio ≥ 4.10) make pip upgrade jupyter-server to 2.x and
    jupyter-client to 7, which breaks the host's notebook front end (tests/test_packaging.py).
    """
    return (
        "# Setup: works as-is locally, on Colab and on SageMaker Studio (installs the course package if missing).\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "import tempfile\n"
        "\n"
        'if importlib.util.find_spec("m11_helpers") is None:\n'
        "    # what is installed stays as it is (the host's Jupyter above all): it constrains the install\n"
        '    host = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)\n'
        '    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:\n'
        "        pins.write(host.stdout)\n"
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--constraint", pins.name,\n'
        f'                    "{install_spec(version)}"], check=True)\n'
        "from m11_helpers import setup\n"
        "\n"
        "env = setup(seed=0)"
    )


def repo_url(path: str = "") -> str:
    """The absolute GitHub address of a file in the course repository (README links must work on PyPI too)."""
    return f"https://github.com/{REPO}/blob/main/{path}" if path else f"https://github.com/{REPO}"


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
    return (f"| {number} | [{title}]({repo_url(f'course/{stem}.ipynb')}) · "
            f"[exercises]({repo_url(f'exercises/{stem}.ipynb')}) | "
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({links['colab']}) "
            f"[![Open In SageMaker Studio Lab](https://studiolab.sagemaker.aws/studiolab.svg)]({links['studiolab']}) |")

