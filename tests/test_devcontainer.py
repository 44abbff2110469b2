"""The dev container (.devcontainer/devcontainer.json, GitHub Codespaces): the course opens in JupyterLab,
installed with the CPU build of torch, by the same set-up as `make lab`.

1. The file: a Python image with Node (npm for the offline slide assets), `make setup TORCH_BUILD=cpu` as
   its post-create command, JupyterLab started on course/ at the forwarded port.
2. That post-create command is run for real in a clean environment by CI: `.ci/run` runs exactly this
   command in its fresh clone (no .venv) before `make test`, so every green CI run is the dev container's
   set-up passing from nothing, and the suite then runs in what it built (its browser tests start that
   venv's JupyterLab). Checked here: `.ci/run` runs the post-create command, before the test command.
   (A second fresh install inside the suite cost 160 s of a 15-minute budget for the same proof.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())


def test_devcontainer_sets_up_with_make_and_opens_jupyterlab_on_the_course() -> None:
    assert "python" in CONFIG["image"] and any("features/node" in f for f in CONFIG["features"])
    assert CONFIG["postCreateCommand"] == "make setup TORCH_BUILD=cpu"
    (lab,) = CONFIG["postAttachCommand"].values()
    assert ".venv/bin/jupyter lab course/" in lab and "--port=8888" in lab and 8888 in CONFIG["forwardPorts"]
    assert CONFIG["portsAttributes"]["8888"]["onAutoForward"] == "openBrowser"
    make_n = subprocess.run(["make", "-n", "-B", "setup", "TORCH_BUILD=cpu"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60).stdout
    assert '--torch-build "cpu"' in make_n and "m11_helpers.tools.assets --optional" in make_n


def test_ci_sets_up_its_fresh_clone_with_the_post_create_command() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "rm -rf .venv build reports" in lines  # a clean environment: nothing kept from an earlier set-up
    assert CONFIG["postCreateCommand"] in lines, "CI must set up with the dev container's post-create command"
    assert lines.index(CONFIG["postCreateCommand"]) < lines.index("make test")
