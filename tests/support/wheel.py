"""The package as a learner gets it: built into a wheel once per test session, installed into a folder.

    site = wheel_site()                  # /tmp/m11-wheel-…/site, holding m11_helpers from the wheel
    env = kernel_env(site, cwd_outside=ROOT)   # PYTHONPATH, IPYTHONDIR and the kernel-side check

Notebook kernels and grading subprocesses started with `kernel_env` import `m11_helpers` from that
folder, not from the repository's editable install (PYTHONPATH comes before site-packages, and the
editable finder sits after the path finder on sys.meta_path). They prove it themselves: the
IPython startup file `KERNEL_CHECK` runs in every kernel before the first cell, appends what it
found to a log (read by the session summary in tests/conftest.py) and kills the kernel (exit 86)
when `m11_helpers` does not come from the wheel, or, where asked, when the kernel's cwd is inside
the repository. The wheel is built from a copy of the sources (pyproject.toml, README.md, LICENSE,
m11_helpers/) so that concurrent sessions never share setuptools' build/ folder.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "m11_helpers")
CHECK_EXIT = 86  # the kernel's exit code when it did not import the wheel

STUCK_S = 45  # a kernel not past its startup file by then dumps its threads' stacks (nbval gives up at 60)
# Runs first in every Python process started with kernel_env (a sitecustomize on PYTHONPATH): in a kernel, it arms
# a dump of every thread's stack into stuck-<pid>.txt beside the site, which KERNEL_CHECK disarms. A kernel that
# hangs before its first cell (seen once in CI, with nothing on its stderr) then says where.
BOOT = '''\
import faulthandler, os, sys
if os.environ.get("M11_WHEEL_SITE") and "ipykernel_launcher" in " ".join(getattr(sys, "orig_argv", [])):
    _m11_stuck = open(os.path.join(os.path.dirname(os.environ["M11_WHEEL_SITE"]), f"stuck-{os.getpid()}.txt"), "w")
    # the file stays open (this module keeps it) until the dump or KERNEL_CHECK
    faulthandler.dump_traceback_later(float(os.environ.get("M11_STUCK_S", %d)), file=_m11_stuck)
''' % STUCK_S

# Runs in every kernel (IPython startup file) before the notebook's first cell.
KERNEL_CHECK = '''\
import json, os, sys
if getattr(sys.modules.get("sitecustomize"), "_m11_stuck", None):  # it got here: no dump, no file (BOOT)
    import faulthandler
    faulthandler.cancel_dump_traceback_later()
    sys.modules["sitecustomize"]._m11_stuck.close()
    os.remove(sys.modules["sitecustomize"]._m11_stuck.name)
_site, _mode = os.environ.get("M11_WHEEL_SITE"), os.environ.get("M11_KERNEL_CHECK", "")
if _site:
    import m11_helpers
    _where, _cwd = os.path.realpath(m11_helpers.__file__), os.path.realpath(os.getcwd())
    _repo = os.path.realpath(os.environ.get("M11_REPO_ROOT", "/nonexistent"))
    _record = {"pid": os.getpid(), "package": _where, "cwd": _cwd,
               "from_wheel": _where.startswith(os.path.realpath(_site) + os.sep),
               "cwd_in_repo": (_cwd + os.sep).startswith(_repo + os.sep),
               "cwd_entries": sorted(os.listdir(_cwd))[:20]}
    if os.environ.get("M11_WHEEL_LOG"):
        with open(os.environ["M11_WHEEL_LOG"], "a") as _log:
            _log.write(json.dumps(_record) + "\\n")
    _bad = [] if _record["from_wheel"] else [f"m11_helpers was imported from {_where}, not from the wheel in {_site}"]
    if "cwd" in _mode.split(",") and _record["cwd_in_repo"]:
        _bad.append(f"the kernel's cwd {_cwd} is inside the repository {_repo}")
    if _bad:
        sys.stderr.write("m11 wheel check failed: " + "; ".join(_bad) + "\\n")
        sys.stderr.flush()
        os._exit(%d)
''' % CHECK_EXIT


def build_wheel(dest: Path) -> Path:
    """`pip wheel --no-deps --no-build-isolation` of a copy of the sources into dest; the wheel's path."""
    src = dest / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(dest / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"building the wheel failed:\n{out.stdout}\n{out.stderr}")
    (wheel,) = (dest / "dist").glob("m11_helpers-*.whl")
    return wheel


@functools.cache
def wheel_site() -> Path:
    """Build the wheel and `pip install --no-deps --target` it, once per process; the target folder."""
    dest = Path(tempfile.mkdtemp(prefix="m11-wheel-"))
    wheel = build_wheel(dest)
    site = dest / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                          str(wheel)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"installing {wheel.name} failed:\n{out.stdout}\n{out.stderr}")
    startup = dest / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-m11-wheel-check.py").write_text(KERNEL_CHECK)
    (dest / "boot").mkdir()
    (dest / "boot" / "sitecustomize.py").write_text(BOOT)
    (dest / "kernels.jsonl").touch()
    return site


def wheel_file(site: Path) -> Path:
    (wheel,) = (site.parent / "dist").glob("m11_helpers-*.whl")
    return wheel


def kernel_env(site: Path, *, check_cwd: bool, base: dict | None = None) -> dict[str, str]:
    """Environment variables for a process whose kernels must run the wheel's package (see module doc)."""
    env = dict(os.environ if base is None else base)
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(site.parent / "boot"), *filter(None, [env.get("PYTHONPATH")])]),
               IPYTHONDIR=str(site.parent / "ipython"), M11_WHEEL_SITE=str(site),
               M11_WHEEL_LOG=str(site.parent / "kernels.jsonl"), M11_REPO_ROOT=str(ROOT),
               M11_KERNEL_CHECK="package,cwd" if check_cwd else "package")
    return env


def stuck_kernels(site: Path) -> str:
    """The stacks of kernels that hung before their first cell (BOOT's dumps), removed once read."""
    dumps = []
    for path in sorted(site.parent.glob("stuck-*.txt")):
        text = path.read_text(errors="replace").strip()
        if text:  # an empty file: a kernel still starting, or one killed before its dump was due
            dumps.append(f"kernel {path.stem.split('-')[1]}, not at its first cell yet:\n{text}")
            path.unlink()
    return "\n".join(dumps)


def kernel_records(site: Path) -> list[dict]:
    """What each kernel started with kernel_env found (one record per kernel)."""
    log = site.parent / "kernels.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def cleanup(site: Path) -> None:
    shutil.rmtree(site.parent, ignore_errors=True)
