"""The dev container (.devcontainer/devcontainer.json, GitHub Codespaces): the course opens in JupyterLab,
installed with the CPU build of torch, by the same set-up as `make lab`.

1. The file: a Python image with Node (npm for the offline slide assets), `make setup TORCH_BUILD=cpu` as
   its post-create command, JupyterLab started on course/ at the forwarded port.
2. That post-create command, run for real in a clean environment: a fresh venv outside the repository,
   nothing inherited (no VIRTUAL_ENV, PYTHONPATH or this venv's PATH), the machine's own python3. torch is
   not downloaded again (750 MB): the fresh venv sees this interpreter's CPU torch through a `.pth` link,
   as tests/support/venvs.py gives it to the packaging venvs, so pip finds `torch==2.13.0` satisfied and
   installs the rest: the course with [lab,dev] (1.5–3 min on 2 cores, the suite's costliest set-up;
   without compiling bytecode). Then the venv's own python
   imports the course from this checkout, its JupyterLab starts, and its torch is a CPU build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from support.venvs import _link_torch

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


@pytest.mark.slow
def test_post_create_command_sets_up_a_clean_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300, cwd=tmp_path)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    _link_torch(tmp_path / "torch-link")
    (Path(purelib) / "m11-torch-link.pth").write_text(str(tmp_path / "torch-link") + "\n")
    keep = ("HOME", "LANG", "TMPDIR", "CI") + tuple(k for k in os.environ if k.startswith("PIP_"))
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = os.pathsep.join([str(Path(base).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    env["PIP_NO_COMPILE"] = "1"  # no .pyc for the ~150 packages: a third of pip's CPU here, nothing the test checks
    command = CONFIG["postCreateCommand"].split()  # make setup TORCH_BUILD=cpu, into the fresh venv
    out = subprocess.run([*command, f"VENV={venv}", f"PYTHON={base}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "[m11 set-up" in log and "torch: the CPU build (asked for)" in log, log[:2000]
    assert (venv / ".m11-installed").is_file()
    check = ("import m11_helpers, torch, jupyterlab; print(m11_helpers.__file__); "
             "print(torch.version.cuda is None and '+cpu' in torch.__version__)")
    got = subprocess.run([str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)
    assert got.returncode == 0, got.stderr
    where, cpu = got.stdout.split()
    # the fresh venv's torch is this one, linked: a CPU build on CI (a GPU box's .venv may hold CUDA's)
    assert Path(where).is_relative_to(ROOT) and cpu == str(torch.version.cuda is None and "+cpu" in torch.__version__)
    lab = subprocess.run([str(venv / "bin" / "jupyter"), "lab", "--version"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert lab.returncode == 0 and lab.stdout.strip()[0].isdigit(), lab.stdout + lab.stderr
    assert sysconfig.get_paths()["purelib"] != purelib  # it was another environment
