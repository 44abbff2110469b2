"""Grade a submission in a sandbox: it sees its own copy, Python and the course package, nothing else.

`popen(cmd, ...)` stands in for `subprocess.Popen` where the grader starts nbval (`_run_once`). On
Linux with bubblewrap (`bwrap`, Debian package `bubblewrap`; no daemon, no root needed) the run gets

- a private copy of the submission's folder at /submission (the kernel's cwd), made afresh per run;
- a filesystem built from nothing: /usr, a few /etc files, the interpreter, its site-packages and
  m11_helpers, read-only; private /tmp and HOME. No course repository, solutions/, other submissions
  or reports; no network (only loopback, which the launcher and gloo use); its own pid namespace,
  so every process it starts dies with it; no capabilities (a root grader runs it as an unused uid,
  so that RLIMIT_NPROC holds); limits per process on memory, processes and file size (the run time
  is the grader's cell and notebook timeouts); only the environment variables a notebook needs.

`M11_GRADE_SANDBOX` picks the mode: `auto` (default: bubblewrap when it works, else unisolated with a
loud warning), `require` (refuse to grade without it: CI), `off` (the old, unisolated path).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import site
import subprocess
import sys
import warnings
from pathlib import Path

from m11_helpers.grading.runenv import CWD_ENV, LOG_ENV, MODE_ENV
from m11_helpers.grading.sandbox.walls import GIB, WALLS, Limits, annotate
from m11_helpers.validate import one_of

__all__ = ["MODE_ENV", "GIB", "Limits", "SandboxUnavailable", "mode", "available", "describe", "popen"]

MODES = ("auto", "require", "off")
INSIDE_CWD, INSIDE_HOME = "/submission", "/home/student"
# what a notebook may see of the grader's environment (everything else, tokens included, is dropped)
KEEP_ENV = {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH",
            "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "MPLBACKEND", "M11_STRICT",
            "CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV", "JUPYTER_PLATFORM_DIRS", "SOURCE_DATE_EPOCH",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}  # the grader's pytest loads only the plugins it names (engine/runner.py)
KEEP_PREFIXES = ("LC_", "M11_GRADE_")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf", "alternatives",
       "fonts", "mime.types")
SKIP_COPY = {".git", ".hg", ".svn", ".ipynb_checkpoints", "__pycache__", ".venv", "node_modules"}
PACKAGE = Path(__file__).resolve().parents[2]  # m11_helpers: the kernel imports it, read-only


class SandboxUnavailable(RuntimeError):
    """`M11_GRADE_SANDBOX=require` and bubblewrap cannot isolate on this machine."""


def mode() -> str:
    """The sandbox mode from `M11_GRADE_SANDBOX`: auto (default), require or off."""
    return one_of(MODE_ENV, os.environ.get(MODE_ENV, "auto").strip().lower() or "auto", MODES)


def _root() -> bool:  # no user namespace then: the sandbox runs as an unused uid instead
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def _options() -> str:
    """bwrap's --help: --size (0.7) and --disable-userns (0.8) are newer than some distributions' bwrap."""
    return subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30).stdout


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "bubblewrap") when a probe sandbox runs here, else (False, why not)."""
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap needs Linux namespaces; this is {sys.platform}"
    missing = [t for t in ("bwrap", "prlimit", *(["setpriv"] if _root() else [])) if not shutil.which(t)]
    if missing:
        return False, f"{', '.join(missing)} not installed (Debian/Ubuntu: apt-get install bubblewrap util-linux)"
    probe = _bwrap_args(binds=[("ro", "/usr", "/usr")], etc=None) + ["true"]
    proc = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:  # e.g. a container or WSL1 without user namespaces
        hint = ("; Ubuntu >= 23.10 restricts them: sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
                if "uid map" in proc.stderr else "")
        return False, f"bubblewrap cannot create namespaces here: {proc.stderr.strip()[:300]}{hint}"
    return True, "bubblewrap"


def describe(limits: Limits | None = None) -> str:
    """One line for a report: what isolates a graded notebook here, or a loud warning saying what does not."""
    limits = limits or Limits.from_env()
    if mode() == "off":
        return ("WARNING: NOT ISOLATED (M11_GRADE_SANDBOX=off): the notebook ran with the grader's permissions, "
                "filesystem and network")
    ok, why = available()
    if ok:
        return ("sandbox: bubblewrap. The notebook saw only its own copy (/submission), the OS, Python and the "
                "course package, read-only; not the course repository, solutions/, other submissions or reports. "
                f"No network (loopback only), its own process namespace, a scrubbed environment, {limits.text()}.")
    nproc = "" if _root() else f", {limits.processes} processes"
    return (f"WARNING: NOT ISOLATED ({why}). The notebook could read the course repository and solutions/, read "
            "and change other submissions and reports, and use the network. Only a private copy as its folder, a "
            f"scrubbed environment and limits ({limits.memory / GIB:g} GiB of memory per process{nproc}) applied. "
            "Install bubblewrap (apt-get install bubblewrap) or grade in a throw-away VM.")


def _bwrap_args(binds: list[tuple[str, str, str]], etc: Path | None, limits: Limits = Limits()) -> list[str]:
    """The bwrap command line: namespaces, then a root built only from `binds` (kind, source, dest)."""
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "m11-sandbox", "--die-with-parent", "--new-session"]
    if _root():  # no user namespace: keep only what setpriv needs to become the unused uid, then nothing
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", *(["--disable-userns"] if "--disable-userns" in _options() else []),
                 "--cap-drop", "ALL"]
    args += ["--proc", "/proc", "--dev", "/dev"]  # first: the binds below may lie under /tmp
    for folder, perms in (("/tmp", "1777"), ("/dev/shm", "1777"), (INSIDE_HOME, "0777")):
        size = ["--size", str(limits.tmpfs)] if "--size" in _options() else []
        args += ["--perms", perms, *size, "--tmpfs", folder]
    made: set[str] = set()
    for dest in [d for _, _, d in binds] + ["/etc/hosts"]:  # else bwrap makes parents 0700, as their sources
        for parent in reversed(Path(dest).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged-/usr symlinks, or real folders
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for kind, src, dest in binds:
        args += ["--perms", "0755", "--dir", dest] if kind == "dir" else [f"--{kind}-bind".replace("--rw-", "--"), src, dest]
    if etc is not None:
        for name in ETC:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for f in sorted(etc.iterdir()):
            args += ["--ro-bind", str(f), f"/etc/{f.name}"]
    return args


def _secrets(submission: Path) -> tuple[list[Path], list[Path]]:
    """(folders no bind may contain, folders no bind may lie in): the class folder, course repositories, cwd."""
    repos = [p for start in (Path(__file__).resolve().parent, Path.cwd().resolve())
             for p in (start, *start.parents) if (p / "pyproject.toml").is_file()]
    return [submission.parent, Path.cwd().resolve(), *repos], [submission.parent, *repos]


@functools.lru_cache(maxsize=1)
def _python_paths() -> tuple[str, ...]:
    """Where the interpreter and its packages live: what a fresh `python` puts on sys.path, and its prefixes."""
    out = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"], cwd="/",
                         capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
    paths = [p for p in json.loads(out.stdout or "[]") if p]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(), str(PACKAGE)]
    return tuple(dict.fromkeys(paths))


def _readonly_binds(submission: Path, pythonpath: str) -> list[tuple[str, str, str]]:
    """/usr, the interpreter, its packages and the PYTHONPATH the grader chose; never a folder with secrets."""
    contain, inside = _secrets(submission)
    trusted = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, PACKAGE)}
    binds: list[tuple[str, str, str]] = [("ro", "/usr", "/usr")]
    for p in [*_python_paths(), *filter(None, pythonpath.split(os.pathsep))]:
        for path in dict.fromkeys([Path(p).absolute(), Path(p).resolve()]):
            ok = path.exists() and str(path) != "/" and not str(path).startswith("/usr/") and not any(
                s == path or path in s.parents for s in contain) and (  # a venv may lie in the repository
                any(t == path or t in path.parents for t in trusted) or not any(s in path.parents for s in inside))
            if ok and not any(Path(b) == path or Path(b) in path.parents for _, b, _ in binds):
                binds.append(("ro", str(path), str(path)))
    return binds


def _copy(src: Path, dest: Path, budget: int = GIB // 4, count: int = 5000) -> None:
    """Copy the submission's folder: symlinks as links (never followed), files and folders only, up to
    `budget` bytes and `count` files (a notebook graded where it lies, in a big folder, gets what fits)."""
    if dest.exists():
        shutil.rmtree(dest)
    for folder, dirs, files in os.walk(src):
        count -= len(files)
        if count < 0:
            break
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = sorted(d for d in dirs if d not in SKIP_COPY and d not in links)
        target = dest / Path(folder).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(files) + links:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), target / name)
            elif os.path.isfile(path) and os.path.getsize(path) <= budget:  # not a FIFO, socket or device
                budget -= os.path.getsize(path)
                shutil.copyfile(path, target / name)


def _uid_count(uid: int) -> int:
    import psutil
    return sum(p.info["uids"] is not None and p.info["uids"].real == uid for p in psutil.process_iter(["uids"]))


def _environment(env: dict[str, str], inside_cwd: str, home: str) -> dict[str, str]:
    kept = {k: v for k, v in env.items() if k in KEEP_ENV or k.startswith(KEEP_PREFIXES)}
    if os.path.isdir(site.getusersitepackages()):  # `pip install --user` packages: found by base, not HOME
        kept["PYTHONUSERBASE"] = site.getuserbase()
    return dict(kept, HOME=home, USER="student", LOGNAME="student", TMPDIR="/tmp" if home == INSIDE_HOME else
                kept.get("TMPDIR", "/tmp"), **{CWD_ENV: inside_cwd}, PYTHONDONTWRITEBYTECODE="1")


class _Sandboxed(subprocess.Popen):
    """A Popen whose first completed `wait()` names, in the grader's cell log, the limits that stopped cells."""

    def __init__(self, cmd: list[str], log: Path | None, limits: Limits, walls: int, **kwargs) -> None:
        self._m11_log, self._m11_limits, self._m11_walls = log, limits, walls
        super().__init__(cmd, **kwargs)

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        if self._m11_log is not None:
            log, self._m11_log = self._m11_log, None
            annotate(log, self._m11_limits, self._m11_walls)
        return code


def popen(cmd: list[str], *, cwd: Path, env: dict[str, str], limits: Limits | None = None,
          **kwargs) -> subprocess.Popen:
    """Start the grader's `cmd` in the sandbox; `env` names the submission (M11_GRADE_CWD) and log (M11_GRADE_LOG)."""
    limits, how = limits or Limits.from_env(), mode()
    if how == "off":
        return subprocess.Popen(cmd, cwd=cwd, env=env, **kwargs)
    ok, why = available()
    if not ok and how == "require":
        raise SandboxUnavailable(f"{MODE_ENV}=require, but {why}")
    work, log = Path(cwd), Path(env[LOG_ENV]) if env.get(LOG_ENV) else None
    submission = Path(env.get(CWD_ENV) or work).resolve()
    copy = work / "submission"
    _copy(submission, copy)
    if not ok:
        warnings.warn(describe(limits), RuntimeWarning, stacklevel=2)
        nproc = [] if _root() else [f"--nproc={_uid_count(os.getuid()) + limits.processes}"]
        pre = [shutil.which("prlimit")] if shutil.which("prlimit") else []
        pre += [f"--data={limits.memory}", f"--fsize={limits.file_size}", "--core=0", *nproc] if pre else []
        walls = (3 if nproc else 2) if pre else 0  # only the limits prlimit set can have stopped a cell
        return _Sandboxed([*pre, *cmd], log, limits, walls, cwd=cwd, env=_environment(env, str(copy), str(copy)),
                          **kwargs)
    etc = work / "sandbox-etc"
    etc.mkdir(exist_ok=True)
    uid = 3_000_000 + os.getpid() % 1_000_000 if _root() else os.getuid()
    (etc / "passwd").write_text(f"student:x:{uid}:{uid}:student:{INSIDE_HOME}:/bin/sh\n")
    (etc / "group").write_text(f"student:x:{uid}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost m11-sandbox\n::1 localhost\n")
    (etc / "hostname").write_text("m11-sandbox\n")
    binds = _readonly_binds(submission, env.get("PYTHONPATH", "")) + [("dir", "", str(work))]
    binds += [("ro", str(work / n), str(work / n)) for n in ("graded.ipynb", "pytest.ini") if (work / n).exists()]
    binds.append(("rw", str(copy), INSIDE_CWD))
    inner = list(cmd)  # pytest makes itself undumpable (engine/plugin.py) before its kernel exists: no forged records
    if _root():
        for path in [copy, *copy.rglob("*"), *([log] if log else [])]:
            os.lchown(path, uid, uid)
        inner = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--", *inner]
        nproc = limits.processes  # a fresh uid: its count starts at zero
    else:
        nproc = _uid_count(os.getuid()) + limits.processes  # counted over all this user's processes
    limit = ["prlimit", f"--data={limits.memory}", f"--nproc={nproc}", f"--fsize={limits.file_size}", "--core=0"]
    # pytest itself stays in the grader's folder (as unsandboxed): a conftest.py in the submission is never loaded
    full = [*limit, *_bwrap_args(binds, etc, limits), "--chdir", str(work), "--", *inner]
    inside = _environment(env, INSIDE_CWD, INSIDE_HOME)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND) if log is not None else None
    if fd is not None:  # the cell log is no file in the sandbox: pytest inherits it, the kernel does not
        inside[LOG_ENV], kwargs["pass_fds"] = f"/proc/self/fd/{fd}", (*kwargs.get("pass_fds", ()), fd)
    try:
        return _Sandboxed(full, log, limits, len(WALLS), cwd=cwd, env=inside, **kwargs)
    finally:
        if fd is not None:
            os.close(fd)
