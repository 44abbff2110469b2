"""Throw-away virtual environments for the packaging tests, built once and cached under build/venvs/.

    venv = colab_venv()                  # build/venvs/colab-<key>/: Colab's Jupyter pins + this torch
    pip(venv, "install", "--dry-run", "--report", "-", wheel)

A venv is keyed by what goes into it (the pins, the Python and torch versions): the same key is
reused, a new key builds a new one (in a temporary folder, renamed into place, under a lock, so
concurrent sessions never see half a venv). torch is not installed again (750 MB, ~1 min): the venv
gets a `.pth` line pointing at a folder of links to this interpreter's torch and the distributions
torch requires (torch 2.13.0, CPU, from the machine's wheel file), so pip in the venv sees torch as
installed, exactly as on Colab, where torch comes with the image. Pip itself is the running one
(`pip --python VENV/bin/python`): the venv needs none of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "venvs"

# Google Colab's Jupyter stack, which installing the course must leave alone (upgrading it breaks Colab's
# own front end): the versions its image has pinned for years (ipywidgets 7.7.1, jupyter-client 6.1.12,
# notebook 6.5.5, jupyter-server 1.24, tornado 6.3, traitlets 5.7), with the IPython/ipykernel it pairs them with.
COLAB_PINS = ("ipywidgets==7.7.1", "jupyter-client==6.1.12", "notebook==6.5.5", "jupyter-server==1.24.0",
              "tornado==6.3.3", "traitlets==5.7.1", "ipython==7.34.0", "ipykernel==5.5.6")
# what pip prints when it cannot reach an index: the one reason the Colab test may skip
OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                     r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|"
                     r"Max retries exceeded|No route to host|Could not fetch URL", re.I)


class RegistryUnreachable(RuntimeError):
    """pip could not reach the package index: the caller skips, saying so."""


def pip(venv: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """This interpreter's pip acting on venv (`pip --python`); raise on failure (RegistryUnreachable if offline)."""
    # cwd outside the repository: a cwd on sys.path would show the repository's m11_helpers.egg-info
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=venv.parent)
    if out.returncode != 0:
        if OFFLINE.search(out.stdout + out.stderr):
            raise RegistryUnreachable(f"pip {' '.join(args[:2])}: the package index is unreachable:\n"
                                      f"{out.stderr.strip()[-800:]}")
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return out


def _requirement_closure(name: str) -> list[md.Distribution]:
    """name's installed distribution and those it requires (markers evaluated here), recursively."""
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(key)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _link_torch(folder: Path) -> None:
    """Fill folder with links to torch and its requirements as installed for this interpreter."""
    folder.mkdir(parents=True)
    for dist in _requirement_closure("torch"):
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (folder / top).exists() and top not in ("bin", "__pycache__"):
                (folder / top).symlink_to(src)


def _key(parts: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:10]


@contextlib.contextmanager
def _lock(name: str):
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cached_venv(name: str, requirements: tuple[str, ...]) -> Path:
    """build/venvs/<name>-<key>: this torch (linked) + requirements; built once, then reused."""
    torch_version = md.version("torch")
    key = _key((sys.version, torch_version, *requirements))
    final = CACHE / f"{name}-{key}"
    with _lock(name):
        if (final / "m11-ready").is_file():
            return final
        shutil.rmtree(final, ignore_errors=True)
        tmp = CACHE / f".{name}-{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True, timeout=120)
            site = Path(subprocess.run([str(tmp / "bin" / "python"), "-c", "import sysconfig; print(sysconfig."
                                        "get_paths()['purelib'])"], capture_output=True, text=True,
                                       check=True, cwd=CACHE).stdout.strip())
            _link_torch(tmp / "torch-link")
            # a relative path in a .pth is taken from the .pth's folder: the venv can be renamed
            (site / "m11-torch-link.pth").write_text(os.path.relpath(tmp / "torch-link", site) + "\n")
            if requirements:
                pip(tmp, "install", "-q", "--no-compile", *requirements)
            (tmp / "m11-ready").write_text(json.dumps({"torch": torch_version, "requirements": requirements}))
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def colab_venv() -> Path:
    return cached_venv("colab", COLAB_PINS)


def installed(venv: Path) -> dict[str, str]:
    """{normalised name: version} of every distribution the venv's Python sees (torch's links included)."""
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version "
                          "for d in m.distributions()}))"], capture_output=True, text=True, check=True,
                         cwd=venv.parent)
    return {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in json.loads(out.stdout).items()}
