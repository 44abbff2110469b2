"""What a learner installs: a core that leaves the host's Jupyter alone, extras for the rest, true floors.

1. Installing the course's core into a Colab-like environment (Colab's Jupyter pins + torch 2.13)
   changes no installed package (`pip install --dry-run --report`).
2. Every module imports with the core alone (a venv with only the core's requirements and the
   wheel), or, for a tool, fails only for a package its extra declares; statically, every import
   statement of a module names the core or that module's extra.
3. (tests/test_version_floors.py: the floors cover the APIs used; fallbacks with newer APIs hidden.)
4. The kernel-side proof of "imported from the wheel" fires when it should (tests/support/wheel.py).
5. Set-up without npm: the Makefile's asset step exits 0 and says what decks then need.
6. The Makefile: torch from the index TORCH_INDEX names (torch only), the suite with the GPUs hidden;
   the [dev] extra brings the build backend the wheel tests build with (no build isolation).

The two venvs are cached under build/venvs/ (keyed by what goes in); the tests skip, saying why,
only when the package index is unreachable.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from m11_helpers import REPO
from m11_helpers.tools import setup_venv
from m11_helpers.tools.setup_cell import install_spec, repo_url, setup_cell_source
from support.venvs import COLAB_PINS, RegistryUnreachable, cached_venv, colab_venv, installed, pip
from support.wheel import CHECK_EXIT, kernel_env, wheel_file

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


CORE = [Requirement(r) for r in PROJECT["dependencies"]]


def _extra(name: str) -> set[str]:
    """Distribution names an extra brings directly, self-references (m11-helpers[a,b]) followed."""
    names = set()
    for line in PROJECT["optional-dependencies"][name]:
        req = Requirement(line)
        names |= set().union(*(_extra(e) for e in req.extras)) if _norm(req.name) == "m11-helpers" else {_norm(req.name)}
    return names


CORE_NAMES = {_norm(r.name) for r in CORE}
# modules a notebook (or the `m11` entry point itself) imports: they must need nothing beyond the core
CORE_TOOLS = {"m11_helpers.grading", "m11_helpers.grading.checks", "m11_helpers.grading.observe",
              "m11_helpers.tools", "m11_helpers.tools.cli", "m11_helpers.tools.doctor", "m11_helpers.tools.paths",
              "m11_helpers.tools.setup_cell", "m11_helpers.tools.scripts", "m11_helpers.tools.assets"}


def module_extra(module: str) -> str | None:
    """The extra a module may need beyond the core (None: the core alone)."""
    if module in CORE_TOOLS or not module.startswith(("m11_helpers.tools.", "m11_helpers.grading.")):
        return None
    if module in ("m11_helpers.tools.slides", "m11_helpers.tools.course"):
        return "slides"
    if module in ("m11_helpers.tools.course_site", "m11_helpers.tools.site_pages"):
        return "site"
    return "grade" if module.startswith("m11_helpers.grading.") else "dev"  # contributor tools: nbclean, new-lesson


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every importable module of the package under root (the training scripts run under `accelerate launch`)."""
    out = {}
    for path in sorted((root / "m11_helpers").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        if "scripts" in rel.parts or "templates" in rel.parts or rel.name == "__main__":
            continue
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return md.packages_distributions()  # top-level import name -> distributions (a scan: once)


def third_party_imports(path: Path) -> set[str]:
    """Distributions named by the module's import statements (any level), stdlib and the package excluded."""
    dists = _distributions()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("m11_helpers", "__future__"):
                found |= {_norm(d) for d in dists.get(top, [top])}
    return found


# ------------------------------------------------------------------------------------------------
# 1. the core and a Colab-like environment
# ------------------------------------------------------------------------------------------------

def test_the_notebooks_install_the_core_of_this_release_only() -> None:
    spec = install_spec()
    assert "[" not in spec.split("@")[0], f"the setup cell must install the core, no extras: {spec}"
    assert spec.endswith(f"@v{md.version('m11-helpers')}") and REPO in spec


def _would_change(venv: Path, before: dict[str, str], *args: str) -> tuple[dict[str, str], list[str]]:
    """(installed packages a `pip install --dry-run` would change, every package it would install)."""
    report = json.loads(pip(venv, "install", "-q", "--dry-run", "--report", "-", *args).stdout)
    wanted = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    return {n: f"{before[n]} -> {v}" for n, v in wanted.items() if n in before}, sorted(wanted)


@pytest.mark.slow
def test_installing_the_core_into_a_colab_like_environment_changes_no_package(wheel: Path, tmp_path: Path) -> None:
    """The setup cell's install (`pip install --constraint <pip list --format=freeze> SPEC`), dry-run on
    Colab's Jupyter pins with this session's wheel as SPEC: nothing installed changes."""
    cell = setup_cell_source()
    assert '"pip", "list", "--format=freeze"' in cell and '"--constraint", pins.name' in cell
    try:
        venv = colab_venv()
        before = installed(venv)
        pins = tmp_path / "host.txt"
        pins.write_text(pip(venv, "list", "--format=freeze").stdout)
        plain, _ = _would_change(venv, before, str(wheel_file(wheel)))
        changed, added = _would_change(venv, before, "--constraint", str(pins), str(wheel_file(wheel)))
    except RegistryUnreachable as err:
        pytest.skip(str(err))
    assert {_norm(p.split("==")[0]): p.split("==")[1] for p in COLAB_PINS}.items() <= before.items()
    print(f"\ndry run into {venv.name} ({len(before)} packages): packages changed: {changed or 'none'}; "
          f"added: {', '.join(added)}\n(a plain `pip install` without the constraint would change: {plain or 'none'})")
    assert "m11-helpers" in added
    assert changed == {}, f"the setup cell's install would change the host's packages: {changed}"


# ------------------------------------------------------------------------------------------------
# 2. each module needs what its extra declares, and the core alone for everything a notebook imports
# ------------------------------------------------------------------------------------------------

def test_every_import_statement_names_the_core_or_the_modules_extra() -> None:
    wrong = {}
    for module, path in package_modules().items():
        extra = module_extra(module)
        allowed = CORE_NAMES | (_extra(extra) if extra else set())
        if extra == "dev":
            allowed |= _extra("slides") | _extra("grade")
        stray = third_party_imports(path) - allowed
        if stray:
            wrong[module] = (extra or "core", sorted(stray))
    assert not wrong, f"modules importing what their extra does not declare (module: (extra, packages)): {wrong}"


IMPORT_ALL = """
import importlib, json, sys, traceback
result = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
        result[name] = None
    except ModuleNotFoundError as err:
        result[name] = ["missing", err.name]
    except Exception as err:
        result[name] = ["error", "".join(traceback.format_exception_only(type(err), err)).strip()]
print(json.dumps(result))
"""


@pytest.mark.slow
def test_every_module_imports_in_a_venv_with_only_the_core(wheel: Path, tmp_path: Path) -> None:
    try:
        venv = cached_venv("core", tuple(str(r) for r in CORE))
    except RegistryUnreachable as err:
        pytest.skip(str(err))
    have = installed(venv)
    jupyter = sorted(n for n in have if n in {"notebook", "jupyterlab", "jupyter-server", "nbconvert", "nbclient",
                                              "nbval", "pytest", "jupyterlab-rise"})
    assert not jupyter, f"the core pulls in Jupyter/test packages a notebook host already has: {jupyter}"
    modules = package_modules(wheel)  # what this session's wheel holds (the tree may be edited meanwhile)
    env = dict(kernel_env(wheel, check_cwd=True), M11_STRICT="1")
    out = subprocess.run([str(venv / "bin" / "python"), "-W", "error::DeprecationWarning", "-c", IMPORT_ALL,
                          json.dumps(list(modules))], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    bad = {}
    for module, problem in result.items():
        extra = module_extra(module)
        if problem is None:
            continue
        if extra and problem[0] == "missing" and _norm(problem[1].split(".")[0]) in _extra(extra) | (
                _extra("slides") | _extra("grade") if extra == "dev" else set()):
            continue  # a tool whose extra is not installed: `m11` says which extra to install
        bad[module] = (extra or "core", problem)
    assert not bad, f"modules that do not import with the core alone: {bad}"
    # the `m11` command works with the core, and a command whose extra is missing says which to install
    m11 = [str(venv / "bin" / "python"), "-m", "m11_helpers.tools.cli"]
    assert subprocess.run([*m11, "--version"], cwd=tmp_path, env=env, capture_output=True, timeout=120).returncode == 0
    slides = subprocess.run([*m11, "slides", "x.ipynb"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert slides.returncode == 2 and "[slides] extra" in slides.stderr and "Traceback" not in slides.stderr, slides


# ------------------------------------------------------------------------------------------------
# 4. the kernel-side proof, and 5. set-up without npm
# ------------------------------------------------------------------------------------------------

def test_kernel_check_passes_for_the_wheel_and_kills_otherwise(wheel: Path, tmp_path: Path) -> None:
    check = wheel.parent / "ipython" / "profile_default" / "startup" / "00-m11-wheel-check.py"
    env = dict(kernel_env(wheel, check_cwd=True), M11_WHEEL_LOG=str(tmp_path / "kernels.jsonl"))

    def run(cwd, **change):
        return subprocess.run([sys.executable, str(check)], cwd=cwd, env=dict(env, **change), capture_output=True,
                              text=True, timeout=60)

    assert run(tmp_path).returncode == 0
    repo_package = run(tmp_path, PYTHONPATH=str(ROOT))
    assert repo_package.returncode == CHECK_EXIT and "not from the wheel" in repo_package.stderr
    in_repo = run(ROOT)
    assert in_repo.returncode == CHECK_EXIT and "inside the repository" in in_repo.stderr


def test_setup_without_npm_skips_the_slide_assets_and_says_what_to_do(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    recipe = subprocess.run(["make", "-n", "-B", "--no-print-directory", f"{venv}/.m11-installed", f"VENV={venv}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    (line,) = [ln for ln in recipe.splitlines() if "m11_helpers.tools.assets" in ln]
    bare = tmp_path / "bin"  # a PATH with a shell and nothing else: no npm
    bare.mkdir()
    (bare / "sh").symlink_to("/bin/sh")
    env = dict(os.environ, PATH=str(bare), M11_ASSETS=str(tmp_path / "assets"))
    out = subprocess.run(["/bin/sh", "-c", line], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "npm was not found" in out.stdout and "m11 slides --cdn" in out.stdout
    assert f"{sys.executable} -m m11_helpers.tools.assets" in out.stdout  # this interpreter, not `.venv/`
    assert not (tmp_path / "assets").exists()


def _tarball(path: Path) -> Path:
    """An npm-pack-like tarball: require.js, plus members that try to land outside the folder."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data in [("package/require.js", tarfile.REGTYPE, b"// require.js"),
                                 ("package/../../escaped.txt", tarfile.REGTYPE, b"x"),
                                 ("/tmp/m11-absolute.txt", tarfile.REGTYPE, b"x"),
                                 ("package/link", tarfile.SYMTYPE, b"")]:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mode = kind, len(data), 0o4755  # setuid: must not survive
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            tar.addfile(info, io.BytesIO(data))
    return path


def test_slide_assets_unpack_safely_on_a_python_without_tar_filters(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import tarfile

    from m11_helpers.tools import assets

    # Python 3.10.0-3.10.11 (the floor is 3.10): no data_filter, and extractall(filter=...) is a TypeError
    real = tarfile.TarFile.extractall

    def extractall_3_10_11(self, path=".", members=None, *, numeric_owner=False, **unknown):
        if unknown:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(unknown))!r}")
        return real(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.delattr(tarfile, "data_filter")
    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall_3_10_11)
    npm_dir = tmp_path / "npm"
    npm_dir.mkdir()
    tgz = _tarball(npm_dir / "requirejs-2.3.8.tgz")
    fake_npm = npm_dir / "npm"  # `npm pack NAME@VERSION`: the tarball in cwd, its name on stdout
    fake_npm.write_text(f"#!/bin/sh\ncp {tgz} .\necho {tgz.name}\n")
    fake_npm.chmod(0o755)
    monkeypatch.setattr(assets, "_npm", lambda: str(fake_npm))
    work, dest = tmp_path / "work" / "deep", tmp_path / "dest"
    work.mkdir(parents=True)
    assets._fetch("requirejs", "2.3.8", work, dest)  # set-up's path: it must not raise
    kept = dest / "require.js" / "require.js"
    assert kept.read_bytes() == b"// require.js" and not kept.stat().st_mode & 0o7000
    unpacked = work / "requirejs-unpacked"
    assert sorted(p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*")) == ["package", "package/require.js"]
    assert not (work / "escaped.txt").exists()  # where package/../../ points
    assert not Path("/tmp/m11-absolute.txt").exists()


def _make_n(*args: str) -> list[str]:
    """The commands `make` would run (nothing runs), with this interpreter's venv as VENV."""
    out = subprocess.run(["make", "-n", "--no-print-directory", f"VENV={sys.prefix}", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_setup_takes_torch_alone_from_the_index_named_by_torch_index() -> None:
    (line,) = [ln for ln in _make_n("-B", f"{sys.prefix}/.m11-installed", "TORCH_INDEX=https://example.org/whl")
               if "setup_venv.py" in ln]
    assert '--torch-index "https://example.org/whl"' in line and '--torch-spec "torch==2.13.0"' in line
    told = setup_venv.plan(Path("v"), "lab,dev", "torch==2.13.0", "https://example.org/whl", "auto", None, None, None)
    installs = [cmd for _, cmd in told.steps if "install" in cmd and "pip" not in cmd[-1]]
    assert installs[0][-3:] == ["--index-url", "https://example.org/whl", "torch==2.13.0"]
    assert installs[1][-2:] == ["-e", ".[lab,dev]"] and "--index-url" not in installs[1]  # the rest: pip's index


def test_setup_picks_the_torch_build_by_the_machine_in_one_resolver_pass(tmp_path: Path) -> None:
    plan = lambda build="auto", gpu=None, wheel=None, uv=None: [  # noqa: E731
        cmd for _, cmd in setup_venv.plan(tmp_path / "v", "lab,dev", "torch==2.13.0", "", build, uv, gpu, wheel).steps
        if "install" in cmd and "pip" not in cmd[-1]]
    # an NVIDIA GPU: PyPI's torch (the CUDA build) and the course, one pass
    assert plan(gpu="nvidia-smi is on PATH") == [[str(tmp_path / "v/bin/python"), "-m", "pip", "install",
                                                   "torch==2.13.0", "-e", ".[lab,dev]"]]
    # none: PyTorch's CPU index for torch alone (never PyPI's CUDA build), then the course
    (torch, course) = plan()
    assert torch[-3:] == ["--index-url", setup_venv.CPU_INDEX, "torch==2.13.0"] and course[-2:] == ["-e", ".[lab,dev]"]
    assert plan(build="cpu", gpu="nvidia-smi is on PATH")[0][-2] == setup_venv.CPU_INDEX
    # a CPU wheel of the pinned version in pip's find-links (this project's machines): taken as is, one pass
    store = tmp_path / "wheels"
    store.mkdir()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheel = store / f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    (store / f"torch-2.12.0+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert setup_venv.local_cpu_wheel("torch==2.13.0", [str(tmp_path / "none"), str(store)]) == wheel
    assert setup_venv.local_cpu_wheel("torch>=2.6", [str(store)]) is None  # only an exact pin names one file
    assert plan(wheel=wheel) == [[str(tmp_path / "v/bin/python"), "-m", "pip", "install", str(wheel), "-e", ".[lab,dev]"]]
    # uv when present: its venv (with pip seeded, which the tests use) and its installer
    uv = setup_venv.plan(tmp_path / "v", "lab,dev", "torch==2.13.0", "", "auto", "/bin/uv", None, wheel)
    assert uv.steps[0][1] == ["/bin/uv", "venv", "--seed", str(tmp_path / "v")]
    assert uv.steps[-1][1][:5] == ["/bin/uv", "pip", "install", "--python", str(tmp_path / "v/bin/python")]
    with pytest.raises(ValueError, match="torch_build='gpu'"):
        setup_venv.plan(tmp_path / "v", "", "torch", "", "gpu", None, None, None)


def test_make_test_runs_the_cpu_suite_with_the_gpus_hidden() -> None:
    stamp = ("-o", f"{sys.prefix}/.m11-installed")  # as if set up: only the test commands
    for target in (["test"], ["test-lesson", "N=05"]):
        (line,) = [ln for ln in _make_n(*stamp, *target) if "-m pytest" in ln]
        assert re.search(r"(^|\s)CUDA_VISIBLE_DEVICES= ", line), line  # an empty value: no GPU visible


def test_the_dev_extra_brings_the_build_backend_the_wheel_tests_build_with() -> None:
    assert "--no-build-isolation" in (ROOT / "tests" / "support" / "wheel.py").read_text(encoding="utf-8")
    build = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]]
    dev = {_norm(r.name): r for r in map(Requirement, PROJECT["optional-dependencies"]["dev"])}
    for req in build:
        assert _norm(req.name) in dev and dev[_norm(req.name)].specifier == req.specifier, \
            f"[dev] must bring {req} (the wheel is built without build isolation)"


# ------------------------------------------------------------------------------------------------
# metadata a package index shows
# ------------------------------------------------------------------------------------------------

def test_metadata_licence_urls_classifiers_and_absolute_readme_links() -> None:
    assert PROJECT["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert all(url.startswith(repo_url()) for url in PROJECT["urls"].values())
    classifiers = set(PROJECT["classifiers"])
    assert {"Operating System :: POSIX :: Linux", "Framework :: Jupyter"} <= classifiers
    floor = Version(PROJECT["requires-python"].removeprefix(">="))
    assert f"Programming Language :: Python :: {floor.major}.{floor.minor}" in classifiers
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [u for u in links if not re.match(r"https?://", u)]
    assert links and not relative, f"README links must be absolute (they are shown on the package index): {relative}"
    for url in (u for u in links if u.startswith(repo_url("") + "/blob/main/")):
        assert (ROOT / url.removeprefix(repo_url("") + "/blob/main/")).exists(), f"{url}: no such file in the repo"
