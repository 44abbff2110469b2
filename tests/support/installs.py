"""What a workflow step's `pip install` lines make importable, and running a command with nothing else.

    steps = ["python -m pip install --no-deps .", "python -m pip install nbformat psutil"]   # a job's run: scripts
    provided_imports(steps)                            # {"m11_helpers", "nbformat", "psutil", "traitlets", …}
    env = only_installed(steps, tmp_path, os.environ)  # PYTHONPATH + a sitecustomize that hides the rest
    subprocess.run([sys.executable, "-m", "m11_helpers.grading.classroom.ci", "merge", ...], env=env)

A fresh runner (actions/setup-python) has the standard library and what the job's install lines bring:
each named distribution and, unless `--no-deps`, everything it requires (with the extras asked for),
read from this machine's installed metadata. `only_installed` makes every other top-level package of
site-packages absent to an interpreter (None in `sys.modules`: `import` raises ModuleNotFoundError and
`importlib.util.find_spec` says None, as for a package never installed), so a module that imports
pytest or torch at the top fails here as it fails on the runner; their metadata is hidden too, so
pytest loads no plugin (pytest-timeout) the step did not install. The course itself (`.`, or the
`m11-helpers @ …` requirement) is always this checkout.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shlex
from pathlib import Path

from packaging.requirements import Requirement

ENV, DISTS_ENV = "M11_TEST_ONLY_IMPORTS", "M11_TEST_ONLY_DISTS"
_SITE = '''import os, sys
_ALLOWED = set(filter(None, os.environ.get("{env}", "").split(",")))
if _ALLOWED:  # what the step did not install is absent: None in sys.modules (import fails, find_spec says None)
    import importlib.metadata, pkgutil
    for _m in pkgutil.iter_modules([p for p in sys.path if "-packages" in p]):
        if _m.name not in _ALLOWED and _m.name not in sys.stdlib_module_names and _m.name not in sys.modules:
            sys.modules[_m.name] = None
    _DISTS, _every = set(os.environ.get("{dists}", "").split(",")), importlib.metadata.distributions

    def _installed(**kwargs):  # and so is its metadata: pytest loads no plugin the step did not install
        return (d for d in _every(**kwargs) if (d.metadata["Name"] or "").lower().replace("_", "-") in _DISTS)
    importlib.metadata.distributions = _installed
'''.format(env=ENV, dists=DISTS_ENV)


def install_lines(script: str) -> list[str]:
    """The `pip install …` commands of a `run:` script (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", script)
    lines = [line.split(" #")[0].strip() for line in text.splitlines()]
    return [line for line in lines if re.search(r"\bpip install\b", line)]


def _requirements(line: str) -> tuple[list[Requirement], bool]:
    words = shlex.split(line.split("pip install", 1)[1])
    reqs, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("--index-url", "-i", "--extra-index-url", "-c", "-r"):
            skip = True
        elif not w.startswith("-"):
            w = re.sub(r"^\.(\[[^\]]*\])?$", r"m11-helpers\1", w)  # `.` and `.[grade]`: this checkout
            reqs.append(Requirement(w))
    return reqs, "--no-deps" in words


def _closure(reqs: list[Requirement], deps: bool) -> set[str]:
    """Distribution names pip would install for `reqs` (as installed here)."""
    todo = [(r.name, frozenset(r.extras)) for r in reqs]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        name, extras = todo.pop()
        key = (name.lower().replace("_", "-"), extras)
        if key in seen:
            continue
        seen.add(key)
        if not deps:
            continue
        for text in md.distribution(name).requires or []:
            sub = Requirement(text)  # its marker is about this distribution's extras (and the platform)
            if not sub.marker or any(sub.marker.evaluate({"extra": e}) for e in (*extras, "")):
                todo.append((sub.name, frozenset(sub.extras)))
    return {name for name, _ in seen}


def provided(scripts: list[str]) -> tuple[set[str], set[str]]:
    """(distributions, top-level import names) the `pip install` lines of these scripts bring (the course included)."""
    dists: set[str] = {"m11-helpers"}
    for script in scripts:
        for line in install_lines(script):
            reqs, no_deps = _requirements(line)
            dists |= _closure(reqs, deps=not no_deps)
    names = {"m11_helpers"}
    for name, owners in md.packages_distributions().items():
        if any(o.lower().replace("_", "-") in dists for o in owners):
            names.add(name)
    return dists, names


def provided_imports(scripts: list[str]) -> set[str]:
    """Top-level import names the `pip install` lines of these scripts make available (the course included)."""
    return provided(scripts)[1]


def only_installed(scripts: list[str], folder: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` for an interpreter that has the standard library and what these scripts install, nothing else."""
    dists, names = provided(scripts)
    site = folder / "only-installed"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITE)
    paths = [str(site), *filter(None, env.get("PYTHONPATH", "").split(":"))]
    return dict(env, PYTHONPATH=":".join(paths), **{ENV: ",".join(sorted(names)), DISTS_ENV: ",".join(sorted(dists))})
