"""`m11 doctor`: what will run where (CPU processes or GPUs, backend), the versions, and what is missing."""

from __future__ import annotations

import argparse
import shutil
import sys

from m11_helpers.environment import environment, package_version, setup_line
from m11_helpers.tools.setup_cell import install_spec


def checks() -> list[tuple[str, bool, str]]:
    """(what, ok, detail) for each thing the course uses; missing ones say how to get them."""
    out = []
    # the core (what a notebook imports), then what each extra adds: a missing extra is only a hint
    for pkg, why, extra in [("torch", "everything", None), ("accelerate", "launches", None),
                            ("ipywidgets", "labs and quizzes", None), ("matplotlib", "plots", None),
                            ("jupyterlab", "JupyterLab and RISE slides on this machine", "lab"),
                            ("nbconvert", "`m11 slides` / `m11 course`", "slides"),
                            ("nbval", "`m11 grade` and the tests", "grade")]:
        v = package_version(pkg)
        fix = f"pip install '{install_spec(extra=extra)}'" if extra else f"pip install {pkg}"
        out.append((pkg, v is not None, v or f"missing (needed for {why}): {sys.executable} -m {fix}"))
    from m11_helpers.tools.assets import assets_hint

    assets = assets_hint()
    out.append(("slide assets (reveal.js, MathJax)", assets is None, assets or "installed"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out.append(("chromium (browser tests only)", chromium is not None, chromium or "optional: apt-get install chromium"))
    return out


def main(argv: list[str] | None = None) -> int:
    """`m11 doctor`: print the environment report and what is missing."""
    argparse.ArgumentParser(prog="m11 doctor", description=__doc__.splitlines()[0]).parse_args(argv)
    env = environment()
    print("M11 doctor\n")
    for key, value in env.items():
        print(f"  {key:<20}{value}")
    print(f"\n  {setup_line(env)}\n")
    for what, ok, detail in checks():
        print(f"  [{'ok' if ok else '--'}] {what}: {detail}")
    if env["device"] == "cpu":
        print("\n  No GPU per process: every technique still runs for real on CPU processes (gloo), one thread each.")
    return 0
