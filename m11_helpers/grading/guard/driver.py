"""The tamper guard around each check cell, as the grader drives it from OUTSIDE the kernel.

    guard = Guard(kernel_client)        # reads the guard's code and the kit's pristine sources, now
    guard.baseline()                    # once, before the notebook's first cell
    guard.mark(course_cell_source)      # after each course cell: what it defined is the course's
    report = guard.before("0.2", check_cell_source)
    ...                                 # nbval runs the check cell
    report = guard.after("0.2")         # report.tampering: what learner code bent; report.passed: did
                                        # the check cell's own code reach its `passed("0.2")`?

A check cell counts as passed only when nbval saw it pass AND the guard saw, in pristine check
functions it bound for that cell, the cell's own code call `passed(...)` with no failed check on the
way, AND the guard found nothing bent before or after it. What is checked, restored and flagged is
in `guard/kernel.py` / `guard/ledger.py` (the code that runs in the kernel); why, and what no
in-kernel guard can stop, in docs/instructor-guide.md, "What the grader defends against".

Everything the guard compares against is read HERE, before the notebook runs: its own code, the
sources of the check, observe and launch modules, and where the installed libraries live. The
baseline sends the code and the sources once, in `user_expressions` of a silent request (see
guard/kernel.py), and the kernel compiles them then, before any cell; each later call sends only its
arguments and a new nonce, and runs that code with the `exec` and the builtins the kernel had before
the notebook ran (`Guard._expression`). Sending and parsing ~160 KB of code and sources with every
call cost a guard call ~10 ms of kernel and driver CPU (benchmarks/guard_phases.py).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import secrets
import site
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Callable

from m11_helpers.grading.guard.quiet import Quiet

__all__ = ["VERIFIED", "KIT_MODULES", "verified_modules", "kernel_facing_modules", "GuardReport", "Guard", "library_roots", "defined_names", "free_names"]

CHECK_NAMES = ("expect_close", "expect_equal", "expect_true", "passed", "checking")
_HERE = Path(__file__).resolve().parent
_PARTS = (_HERE / "kernel.py", _HERE / "ledger.py")
_PACKAGE = _HERE.parents[1]  # m11_helpers
# What the kernel runs of the course: every module at grading's top level (the check-cell API and its
# vocabularies: the rooms below it are never imported by a kernel) and every module of the launcher.
KERNEL_FACING = ("m11_helpers.grading", "m11_helpers.launch")


def _module_file(name: str) -> Path | None:
    """The source file of the course module `name` (m11_helpers.x.y), found on disk without importing it."""
    here = _PACKAGE.joinpath(*name.split(".")[1:])
    return next((p for p in (here / "__init__.py", here.with_suffix(".py")) if p.is_file()), None)


def _course_imports(path: Path) -> list[str]:
    """The course modules a file imports, at any depth (a lazy import runs in the kernel too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return sorted({n for n in found if n.startswith("m11_helpers.") and _module_file(n)})


def kernel_facing_modules() -> tuple[str, ...]:
    """Every module of the kernel-facing packages, as it is on disk now: one added there is in."""
    roots = []
    for package in KERNEL_FACING:
        folder = _module_file(package).parent
        roots += [package] if package != "m11_helpers.grading" else []  # grading's __init__ is a docstring
        roots += [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]
    return tuple(roots)


def verified_modules() -> tuple[str, ...]:
    """Modules compared, function by function, with their installed source before and after each check cell:
    the kernel-facing ones and the course modules they import (procs, validate, tether, …)."""
    roots, done = list(kernel_facing_modules()), []
    while roots:
        name = roots.pop(0)
        if name not in done:
            done.append(name)
            roots += _course_imports(_module_file(name))
    return tuple(done)


VERIFIED = verified_modules()
# names a notebook may not rebind: the kernel-facing modules' `__all__` (not their helpers': a learner's
# `fraction` must stay the learner's)
KIT_MODULES = kernel_facing_modules()


@dataclasses.dataclass
class GuardReport:
    """What one guard call found: tampering (flagged), the ledger's verdict (after), or why it could not run."""

    tampering: list[str] = dataclasses.field(default_factory=list)
    passed: bool = False  # after: the check cell's own code reached passed(<its exercise>)
    fails: list[str] = dataclasses.field(default_factory=list)  # after: failed checks its own code hid
    error: str = ""  # the guard did not answer, or answered something it did not write


def library_roots() -> list[str]:
    """Folders whose code counts as a library: the interpreter's, site-packages, the m11_helpers package."""
    paths = [*sysconfig.get_paths().values(), *site.getsitepackages(),
             *sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix}).values()]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    spec = importlib.util.find_spec("m11_helpers")
    paths += list(spec.submodule_search_locations or []) if spec else []
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # only folders that exist now, before the notebook runs: one it creates later (a user site) is no library
    roots = {os.path.join(q, "") for p in paths if os.path.isdir(p) for q in (os.path.abspath(p), os.path.realpath(p))}
    # never a folder that holds the notebook: a module it writes there is not a library
    here = [os.path.join(os.path.realpath(p), "") for p in (os.getcwd(), os.environ.get("M11_GRADE_CWD") or ".")]
    roots = {r for r in roots if r != os.sep and not any(h.startswith(r) for h in here)}
    roots.add(os.path.join(os.path.realpath(tempfile.gettempdir()), "torchinductor_"))  # torch.compile's code
    return sorted(roots)


def _sources() -> dict[str, tuple[str, str]]:
    """name -> (its file, its text) for each verified module, as installed now."""
    out = {}
    for name in VERIFIED:
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and os.path.isfile(spec.origin):
            out[name] = (spec.origin, Path(spec.origin).read_text(encoding="utf-8"))
    return out


def _kit_names(sources: dict[str, str]) -> dict[str, str]:
    """name -> module for every public name of the verified modules (their `__all__`), but the checks'."""
    names: dict[str, str] = {}
    for module, text in sources.items():
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                for name in ast.literal_eval(node.value):
                    if name not in CHECK_NAMES:
                        names.setdefault(name, module)
    return names


def _tree(source: str) -> ast.Module:
    lines = [ln if not ln.lstrip().startswith(("%", "!")) else "" for ln in source.splitlines()]  # magics
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def defined_names(source: str) -> list[str]:
    """Functions, classes and imports a cell binds at its top level (what a course cell provides)."""
    names = []
    for node in _tree(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]
    return names


def free_names(source: str) -> list[str]:
    """Names a cell reads but never binds itself: what it takes from the notebook."""
    tree, loads, bound = _tree(source), set(), set(defined_names(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names}
    return sorted(loads - bound)


class Guard:
    """Drives the in-kernel guard through a jupyter_client blocking kernel client."""

    def __init__(self, kc, timeout: float = 60.0) -> None:
        self.kc, self.timeout = kc, timeout
        self.parts = tuple(p.read_text(encoding="utf-8") for p in _PARTS)
        found, self.roots = _sources(), library_roots()
        self.sources = {name: text for name, (_, text) in found.items()}
        self.paths = {name: path for name, (path, _) in found.items()}
        self.kit = _kit_names({m: s for m, s in self.sources.items() if m in KIT_MODULES})
        self.holder = f"_m11_guard_{secrets.token_hex(8)}"  # the class that keeps the kernel's exec and builtins
        self.state: int | None = None
        self.error = ""
        # set by the plugin: does the kernel still answer its control channel? (engine/plugin.py, `Quiet`)
        self.answering: Callable[[], bool] | None = None
        self.stalled = False

    def _expression(self, mode: str, payload: dict) -> str:
        """The guard's code and arguments as one expression, run by `exec` and builtins captured at baseline.

        Before the notebook runs (baseline) `exec` and `compile` are the kernel's own: the baseline compiles
        the guard's parts (sent once, here) and keeps them, with that `exec`, a copy of the builtins and the
        kit's sources compiled, in a class it makes. After, nothing is looked up in the notebook's namespace
        or in `builtins`, and no code is sent: the expression reaches that class (by its secret name, through
        `object.__subclasses__()`, itself reached from a literal `()`), checks with the real `type` that the
        `exec` it holds is still the built-in one and the parts it holds are code, and runs them with the
        copy of the builtins. A notebook `exec` never sees the guard's arguments (or its nonce); a swapped
        reference fails the check closed.
        """
        ns = "{'ARGS': %r, 'HELD': (E, B, P, S)}" % payload if mode == "baseline" else \
            "{'__builtins__': B, 'ARGS': %r, 'HELD': (E, B, P, S)}" % payload
        run = f"(lambda ns: E(P[0], ns) or E(P[1], ns) or ns['OUT'])({ns})"
        if mode == "baseline":
            parts = ", ".join(f"C({text!r}, '<string>', 'exec')" for text in self.parts)
            return f"(lambda E, C: (lambda B, P, S: {run})(None, ({parts},), None))(exec, compile)"
        lost = json.dumps({"nonce": payload["nonce"], "error": "the guard's own exec, captured before the notebook "
                           "ran, was replaced (or the class holding it was, or the code it keeps)"})
        subclasses = "().__class__.__base__.__subclasses__"
        code = "T((lambda: 0).__code__)"
        return (f"(lambda T: (lambda H: (lambda E, B, P, S: {run} if T(E) is T({subclasses}) and E.__name__ == 'exec' "
                f"and T(B) is T({{}}) and T(P) is T(()) and T(P[0]) is T(P[-1]) is {code} else {lost!r})"
                f"(*(T.__dict__['__dict__'].__get__(H[0])['x'] if H else (None, None, (None,), None))))"
                f"([c for c in {subclasses}() if T.__dict__['__name__'].__get__(c) == {self.holder!r}][:1]))"
                f"(().__class__.__class__)")

    def _call(self, mode: str, **args) -> dict:
        nonce = secrets.token_hex(16)
        payload = dict(args, mode=mode, nonce=nonce, roots=self.roots, state=self.state, holder=self.holder)
        expr = self._expression(mode, payload)
        msg_id = self.kc.execute("", silent=True, store_history=False, user_expressions={"m11": expr},
                                 allow_stdin=False, stop_on_error=False)
        start = time.monotonic()
        deadline, quiet = start + self.timeout, Quiet(self.answering) if self.answering else None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"error": f"the kernel did not answer the grader's guard within {self.timeout:g} s"}
            try:
                msg = self.kc.get_shell_msg(timeout=min(left, 1.0))
            except Empty:
                if quiet is not None and quiet.stalled(start):
                    self.stalled = True
                    return {"error": f"the kernel stopped answering the guard after {time.monotonic() - start:.0f} s"}
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                break
        value = msg["content"].get("user_expressions", {}).get("m11")
        if msg["content"].get("status") != "ok" or not value:
            return {"error": "the kernel refused to run the grader's guard "
                             f"({msg['content'].get('ename', '')}: {msg['content'].get('evalue', '')})"}
        if value.get("status") != "ok":
            return {"error": f"the grader's guard failed in the kernel: {value.get('ename')}: {value.get('evalue')}"}
        try:
            out = json.loads(ast.literal_eval(value["data"]["text/plain"]))
        except (KeyError, ValueError, SyntaxError, TypeError) as e:
            return {"error": f"the grader's guard answered something it did not write ({type(e).__name__})"}
        if not isinstance(out, dict) or out.get("nonce") != nonce:
            return {"error": "the grader's guard answered something it did not write (wrong nonce)"}
        return out

    def _report(self, out: dict) -> GuardReport:
        error = out.get("error", "") or self.error
        return GuardReport(list(out.get("findings", [])), bool(out.get("passed")), list(out.get("fails", [])), error)

    def baseline(self) -> GuardReport:
        """Once, before any cell: remember the kernel's pristine state (and die with this process); compile the
        kit's sources there, to compare the live modules with before and after every check cell."""
        sources = [(name, self.paths[name], text) for name, text in self.sources.items()]
        out = self._call("baseline", ppid=os.getpid(), sources=sources)
        self.state = out.get("state")
        if self.state is None:
            self.error = out.get("error") or "the grader's guard could not start in the kernel"
        return self._report(out)

    def mark(self, source: str) -> GuardReport:
        """After a course cell: remember what it defined (functions, classes, imports) as the course's."""
        names = defined_names(source)
        if self.state is None or not names:
            return self._report({})
        return self._report(self._call("mark", names=names))

    def before(self, exercise: str, source: str) -> GuardReport:
        """Before a check cell: restore and flag, verify the kit, bind the ledger's check functions."""
        if self.state is None:
            return self._report({})
        self._free = free_names(source)
        return self._report(self._call("before", exercise=str(exercise), source=source, kit=self.kit,
                                       free=self._free))

    def after(self, exercise: str) -> GuardReport:
        """After it: flag what the cell's run bent, restore the names, read the ledger."""
        if self.state is None:
            return self._report({})
        return self._report(self._call("after", exercise=str(exercise), kit=self.kit,
                                       free=getattr(self, "_free", [])))
