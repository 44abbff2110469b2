"""The grader's guard as it runs INSIDE a graded kernel (part 2: the modules, the names, the ledger).

Executed after `guard/kernel.py` in the same namespace (see its docstring); importing it normally
(tests, linters) takes part 1's helpers from their module instead.
"""

import builtins
import json
import os
import sys

if "flag" not in globals():  # a plain import, not the guard's run inside a kernel
    from m11_helpers.grading.guard.kernel import (  # noqa: F401
        ALIASES,
        CHECK_NAMES,
        CHECKS,
        FOUND,
        KEY,
        KIT_NAMES,
        A,
        flag,
        restore_kernel,
        scan_modules,
        snapshot,
        types,  # the interpreter's own types (guard/kernel.py), never the `types` module's names
    )


# set by the caller (guard/driver.py): the kernel's exec, the builtins copy, the guard's parts compiled and the
# kit's (name, source, code), all kept by the baseline; at the baseline itself only the parts
HELD = globals().get("HELD") or (None, None, (), ())


def _same(a, b, depth=0):
    """Two functions with equal code, defaults and (wrapped) closures."""
    if type(a) is not type(b):
        return False
    if type(a) in (staticmethod, classmethod):
        return _same(a.__func__, b.__func__, depth)
    if type(a) is property:
        return all(_same(x, y, depth) if x or y else True for x, y in zip((a.fget, a.fset), (b.fget, b.fset)))
    if type(a) is not types.FunctionType:
        return True
    if a.__code__ != b.__code__ or not _equal(a.__defaults__, b.__defaults__) \
            or not _equal(a.__kwdefaults__, b.__kwdefaults__):
        return False
    cells = zip(a.__closure__ or (), b.__closure__ or ())
    return depth > 3 or all(_same(x.cell_contents, y.cell_contents, depth + 1) for x, y in cells
                            if type(x.cell_contents) is types.FunctionType)


_PLAIN = (int, float, str, bytes, bool, type(None), tuple, frozenset, list, dict, set)
_TYPEVAR = type(sys.modules["typing"].TypeVar("T")) if "typing" in sys.modules else None


def _equal(w, v) -> bool:
    """Plain values compared by value: a set's repr order differs between a .pyc and a fresh compile."""
    if type(w) is not type(v):
        return False
    if type(v) is float and v != v:  # NaN equals nothing, itself included
        return w != w
    try:
        return bool(w == v)
    except Exception:  # noqa: BLE001 - an exotic value: fall back to its text
        return repr(w) == repr(v)


def _verify(name, source, code=None):
    """Compare the live module with a fresh run of its installed source; restore it when they differ.

    `code`: that source compiled, once per kernel, by the baseline (compiled here without it: tests). Its file
    name is the driver's, which may not be the live module's: code objects compare equal whatever their file.
    """
    live = sys.modules.get(name)
    if live is None:
        return
    if type(live) is not types.ModuleType:
        flag(f"sys.modules[{name!r}] is not a module")
        sys.modules.pop(name)
        return
    d = live.__dict__
    fresh = {k: d[k] for k in ("__name__", "__file__", "__package__", "__spec__", "__path__") if k in d}
    if code is None:
        code = compile(source, d.get("__file__") or name, "exec")
    exec(code, fresh)
    bad = []
    for k, v in fresh.items():
        w = d.get(k, KEY)
        if k.startswith("__") and k.endswith("__") or type(v) is types.ModuleType:
            continue
        if type(v) is types.FunctionType or type(v) in (staticmethod, classmethod, property):
            ok = _same(w, v)
        elif issubclass(type(v), type) and vars(v).get("__module__") == name:
            ok = issubclass(type(w), type) and all(_same(vars(w).get(m), f) for m, f in vars(v).items())
        elif type(v) in _PLAIN:
            ok = _equal(w, v)
        elif type(v) is _TYPEVAR:  # `T = TypeVar("T")` makes a new one each run: the same kind, by name
            ok = type(w) is _TYPEVAR and w.__name__ == v.__name__
        else:
            ok = w is v
        if not ok:
            bad.append(k)
    extra = [k for k, v in d.items() if k not in fresh and not k.startswith("__")
             and sys.modules.get(f"{name}.{k}") is not v]
    if bad or extra:  # put back only what differs: names the notebook imported from it stay valid
        flag(f"{name} was patched ({', '.join(sorted(bad + extra))})")
        for k in extra:
            del d[k]
        d.update({k: fresh[k] for k in bad if k in fresh})


def _used(state, free):
    """The names a check cell reads, and, through the course's functions it calls, the globals they read."""
    course, seen, todo = state.setdefault("course", {}), set(), list(free)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        codes = [course[name].__code__] if type(course.get(name)) is types.FunctionType else []
        while codes:
            code = codes.pop()
            todo += code.co_names
            codes += [c for c in code.co_consts if type(c) is types.CodeType]
    return seen


def _rebind(state, shell, before):
    """The names a check cell relies on: the real check functions, kit functions, the course's helpers."""
    ns, checks, ours = shell.user_ns, sys.modules.get(CHECKS), state.get("wrappers") or {}
    used, course = _used(state, A.get("free", ())), state.setdefault("course", {})
    when = "in the notebook" if before else "while the check ran"
    for name in used:
        v = ns.get(name, KEY)
        if name in CHECK_NAMES:  # the ledger binds them again; a callable put there is a fake check
            if v is not KEY and callable(v) and v is not getattr(checks, name, None) and v is not ours.get(name):
                flag(f"the name {name} was rebound {when}")
            continue
        real = getattr(sys.modules.get(KIT_NAMES.get(name, "")), name, KEY)
        if real is not KEY and v is not real and (name not in course or v is not course[name]):
            if callable(v) or type(v) is types.ModuleType:
                flag(f"the name {name} was rebound {when}")
            ns[name] = course[name] = real
        elif name in course and v is not course[name]:
            if callable(v) or type(v) is types.ModuleType:
                flag(f"{name}, which the course defines, was redefined {when}")
            ns[name] = course[name]
        elif type(v) is types.ModuleType and sys.modules.get(v.__name__) is not v:
            flag(f"{name} in the notebook is not the real module {v.__name__}")
        elif name in ALIASES and ALIASES[name] in sys.modules and v is not sys.modules[ALIASES[name]] \
                and v is not KEY:
            flag(f"{name} in the notebook is not the module {ALIASES[name]}")


def _install_ledger(state, shell, source):
    """Pristine check functions that record, for this check cell only, whether ITS code passed or failed."""
    from ipykernel.compiler import get_file_name

    checks = sys.modules.get(CHECKS)
    if checks is None:
        import importlib

        checks = importlib.import_module(CHECKS)
    real = {n: getattr(checks, n) for n in CHECK_NAMES}
    ledger = {"file": get_file_name(source), "passed": [], "fails": []}
    get_frame = sys._getframe

    def record(fn, *args, **kwargs):
        mine = get_frame(2).f_code.co_filename == ledger["file"]
        try:
            out = real[fn](*args, **kwargs)
        except AssertionError as e:
            if mine:
                ledger["fails"].append(str(e).splitlines()[0][:300] if str(e) else "AssertionError")
            raise
        if fn == "passed" and mine:
            ledger["passed"].append(str(args[0] if args else kwargs.get("exercise")))
        return out

    def expect_close(*a, **k):
        return record("expect_close", *a, **k)

    def expect_equal(*a, **k):
        return record("expect_equal", *a, **k)

    def expect_true(*a, **k):
        return record("expect_true", *a, **k)

    def passed(*a, **k):
        return record("passed", *a, **k)

    class checking:
        def __init__(self, *a, **k):
            self.cm, self.mine = real["checking"](*a, **k), get_frame(1).f_code.co_filename == ledger["file"]

        def __enter__(self):
            return self.cm.__enter__()

        def __exit__(self, *exc):
            try:
                return self.cm.__exit__(*exc)
            except AssertionError as e:
                if self.mine:
                    ledger["fails"].append(str(e).splitlines()[0][:300])
                raise

    wrappers = {"expect_close": expect_close, "expect_equal": expect_equal, "expect_true": expect_true,
                "passed": passed, "checking": checking}
    for name, w in wrappers.items():
        w.__doc__ = real[name].__doc__
        setattr(checks, name, w)
        shell.user_ns[name] = w
    state.update(ledger=ledger, wrappers=wrappers, real=real)


def _uninstall_ledger(state, shell):
    checks, real, wrappers = sys.modules.get(CHECKS), state.pop("real", None), state.get("wrappers") or {}
    if checks is None or real is None:
        return
    for name, fn in real.items():
        if getattr(checks, name, None) is not wrappers.get(name):
            flag(f"{CHECKS}.{name} was replaced while the check ran")
        setattr(checks, name, fn)
        if shell.user_ns.get(name) is wrappers.get(name):
            shell.user_ns[name] = fn


def _main():
    mode = A["mode"]
    shell = sys.modules["IPython"].get_ipython()
    if mode == "baseline":
        import ctypes
        import signal

        if sys.platform.startswith("linux"):  # die with the grading process, even when it is SIGKILLed
            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != A["ppid"]:
                os._exit(1)
        state = {"base": snapshot(shell)}
        # later calls run the guard with these, never with what the notebook then calls `exec` (guard/driver.py):
        # its parts as the baseline compiled them, and the kit's sources compiled for `_verify`
        kit = tuple((name, source, compile(source, file, "exec")) for name, file, source in A["sources"])
        kept = (exec, dict(vars(builtins)), HELD[2], kit)
        state["holder"] = type(A["holder"], (), {"__slots__": (), "x": kept})
        sys.modules[KEY] = types.SimpleNamespace(state=state)
        return {"state": id(state)}
    holder = sys.modules.get(KEY)
    state = getattr(holder, "state", None)
    if id(state) != A["state"]:
        flag("the grader's guard state was replaced or removed")
        return {}
    if mode == "mark":  # after a course cell: what it defined is the course's
        ns, course = shell.user_ns, state.setdefault("course", {})
        course.update({n: ns[n] for n in A["names"] if n in ns and (callable(ns[n]) or type(ns[n]) is types.ModuleType)})
        return {}
    result = {}
    if mode == "after":
        _rebind(state, shell, before=False)
        _uninstall_ledger(state, shell)
        ledger = state.pop("ledger", None) or {"passed": [], "fails": []}
        result = {"passed": A["exercise"] in ledger["passed"], "fails": ledger["fails"]}
    restore_kernel(state, shell)
    scan_modules()
    for name, source, code in HELD[3]:
        _verify(name, source, code)
    if mode == "before":
        _rebind(state, shell, before=True)
        _install_ledger(state, shell, A["source"])
    return result


if A:
    try:
        _result = _main()
        _result.update(nonce=A["nonce"], findings=FOUND)
    except BaseException as _e:  # noqa: BLE001 - whatever broke the guard is reported, never raised in the notebook
        _result = {"nonce": A["nonce"], "findings": FOUND, "error": f"{type(_e).__name__}: {_e}"}
    OUT = json.dumps(_result)
