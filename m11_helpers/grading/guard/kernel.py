"""The grader's guard as it runs INSIDE a graded kernel (part 1: find and undo what learner code bent).

Never imported by a kernel. `guard/driver.py`, in the grading process outside the kernel, reads this file
and `guard/ledger.py` (part 2), and the pristine sources of the check, observe and launch modules,
before the notebook runs, and sends their text once, with the baseline, in the `user_expressions` of a
silent execute request: the baseline compiles them and keeps the code (see below). Every call is
evaluated as `(lambda ns: E(PART1, ns) or E(PART2, ns) or ns["OUT"])({"ARGS": {...}, "HELD": ...})`
with `E` the kernel's own `exec` and PART1, PART2 this code compiled: no input or AST transformer, no
cell event and no custom exception handler touches it.
`ARGS["mode"]` is one of

- `baseline` (once, before the first cell): remember the builtins, the IPython hooks and trace
  functions as the kernel started, and die with the grading process (PR_SET_PDEATHSIG);
- `before` (before each check cell): restore all of that, flag what differed ("tampering: ..."),
  compare the check/observe/launch modules with their sources, rebind the check names in the
  notebook to pristine functions that write a ledger;
- `after` (after it): the same again, then read the ledger: did the check cell's OWN code reach its
  `passed(...)` line, and did any check it called fail?

`OUT` is a JSON string echoing `ARGS["nonce"]`, so a reply the guard did not write is refused. After
the baseline the expression does not look up `exec` where the notebook can rebind it: the baseline
keeps the kernel's `exec`, a copy of its builtins, this code compiled and the kit's sources compiled in
a class with a secret name, and every later call runs this code with them (guard/driver.py,
`Guard._expression`): nothing is sent or parsed again but the call's arguments. Below, `builtins` and `sys` must be the
interpreter's own (an `exec` that is built in belongs to the first; a fake `sys` cannot hold the
second's functions as its own), or the guard refuses to run: the check fails closed.
"""

import builtins
import os
import sys

if builtins is not exec.__self__ or type(sys.getrecursionlimit) is not type(exec) \
        or sys.getrecursionlimit.__self__ is not sys:
    raise RuntimeError("sys.modules['builtins'] or sys.modules['sys'] was replaced: the guard will not run on them")


def _a_function():
    pass


class _Probe:
    def method(self):
        pass


class types:  # noqa: N801 - stands where `import types` would: the guard's parts read `types.X`
    """The interpreter's own types, taken from objects made here: a notebook can rebind the names of the
    `types` module (`types.FunctionType = int` would blind the scan to every function)."""

    FunctionType = type(_a_function)
    CodeType = type(_a_function.__code__)
    MethodType = type(_Probe().method)
    ModuleType = type(sys)
    SimpleNamespace = type(sys.implementation)
    BuiltinFunctionType = type(len)
    WrapperDescriptorType = type(object.__init__)
    MethodDescriptorType = type(str.join)
    GetSetDescriptorType = type(type(_a_function).__dict__["__code__"])
    MemberDescriptorType = type(type(_a_function).__dict__["__globals__"])
    ClassMethodDescriptorType = type(dict.__dict__["fromkeys"])
    MethodWrapperType = type(object().__str__)

KEY = "_m11_grade_guard"
CHECK_NAMES = ("expect_close", "expect_equal", "expect_true", "passed", "checking")
CHECKS = "m11_helpers.grading.checks"
A = globals().get("ARGS") or {}  # set by the caller's namespace (see the module docstring); {} on import
# public names of the verified modules (guard/driver.py reads their __all__): a notebook binding must be the real one
KIT_NAMES = A.get("kit") or {"launch": "m11_helpers.launch", "record_comm": "m11_helpers.grading.observe"}
ALIASES = {"torch": "torch", "dist": "torch.distributed", "F": "torch.nn.functional", "np": "numpy"}
VOLATILE_BUILTINS = {"_", "__", "___"}
ROOTS = tuple(A.get("roots", ()))
FOUND: list = []
_files: dict = {}
_types: dict = {}
# Types are compared by id, never with `in (...)`: that asks a class's metaclass whether it equals one of
# them, and a notebook's metaclass can say yes (then the scan would misread it, or fail on it).
_METHODS = frozenset(map(id, (types.MethodType, staticmethod, classmethod)))
_CODE_HOLDERS = frozenset(map(id, (types.FunctionType, staticmethod, classmethod, property)))


def _foreign_file(fn):
    """True for code compiled from the notebook, or from a file outside the installed libraries."""
    if fn not in _files:
        if not fn or fn.startswith("<"):  # <frozen …>; <string>: dataclass and namedtuple methods
            _files[fn] = fn.startswith("<ipython-input")
        else:
            _files[fn] = not (fn.startswith(ROOTS) or os.path.realpath(fn).startswith(ROOTS))
    return _files[fn]


def _where(fn):
    return "the notebook" if "ipykernel_" in fn or fn.startswith("<ipython") else fn


def _class_origin(t):
    if id(t) not in _types:
        _types[id(t)] = (t, "")
        if vars(t).get("__module__") == "__main__":
            _types[id(t)] = (t, "the notebook")
        else:
            for v in list(vars(t).values()):
                if id(type(v)) in _CODE_HOLDERS:
                    o = _origin(v, 1)
                    if o:
                        _types[id(t)] = (t, o)
                        break
    return _types[id(t)][1]


def _origin(obj, depth=0):
    """Where `obj`'s code comes from when that is the notebook (or a file it wrote); '' for library code."""
    t = type(obj)
    if t is types.FunctionType:
        fn = obj.__code__.co_filename
        return _where(fn) if _foreign_file(fn) else ""
    if depth > 2:
        return ""
    if id(t) in _METHODS:
        return _origin(obj.__func__, depth + 1)
    if t is property:
        return next((o for o in (_origin(f, depth + 1) for f in (obj.fget, obj.fset, obj.fdel) if f) if o), "")
    if t.__module__ == "functools" and t.__name__ == "partial":  # or a class that only says it is one
        return _origin(obj.func, depth + 1) or _class_origin(t)
    if issubclass(t, type):
        return _class_origin(obj) if depth == 0 else ""
    return _class_origin(t)


def flag(text):
    if text not in FOUND:
        FOUND.append(text)


# Static types whose instances hold no code and lead to none: `_origin` is '' for every one of them (their
# class dicts are the interpreter's, and it never looks inside a container). A scan reads ~170,000 values
# with torch loaded, most of them of these types or functions; passing those by one set lookup or one
# cached file lookup, and instances of a class already judged this call by one more (`_known`), halves
# the scan, which runs before and after every check cell. Exact types only, and by id (see _METHODS).
_NO_CODE = frozenset(map(id, (str, int, float, complex, bool, type(None), bytes, bytearray, tuple, list, dict,
                              set, frozenset, types.ModuleType, types.BuiltinFunctionType,
                              types.WrapperDescriptorType, types.MethodDescriptorType, types.GetSetDescriptorType,
                              types.MemberDescriptorType, types.ClassMethodDescriptorType, types.MethodWrapperType,
                              types.CodeType)))
_WRAPPERS = _METHODS | _CODE_HOLDERS  # the kinds `_origin` opens


def _known(t, depth):
    """`_origin(x)` for an x of class `t` when that is already known this call (an instance, or at depth 1 a
    class, neither of a kind `_origin` looks into); None otherwise. Without `_origin`'s calls: see _NO_CODE."""
    if id(t) in _WRAPPERS or t.__module__ == "functools":
        return None
    if issubclass(t, type):
        return "" if depth else None
    known = _types.get(id(t))
    return None if known is None else known[1]


def scan_modules():
    """Library modules (and the classes they define) holding notebook code: a patch, not restorable."""
    user_ns = sys.modules["IPython"].get_ipython().user_ns
    function, no_code = types.FunctionType, _NO_CODE
    for name, mod in list(sys.modules.items()):
        if type(mod) is not types.ModuleType or mod.__dict__ is user_ns:  # __main__ (and __mp_main__)
            continue
        d = mod.__dict__
        if d.get("__file__") and _foreign_file(d["__file__"]):
            continue  # a module the notebook wrote itself: its code is its own business
        for key, value in list(d.items()):
            t = type(value)
            if id(t) in no_code or t is function and not _foreign_file(value.__code__.co_filename):
                continue  # what `_origin` would say, without its calls: ''
            if issubclass(t, type) and vars(value).get("__module__") == name:
                for k, v in list(vars(value).items()):
                    tv = type(v)
                    if id(tv) in no_code or tv is function and not _foreign_file(v.__code__.co_filename):
                        continue
                    o = _known(tv, 1)
                    o = _origin(v, 1) if o is None else o
                    if o:
                        flag(f"{name}.{value.__qualname__}.{k} was replaced by code from {o}")
            elif key != "__builtins__":
                o = _known(t, 0)
                o = _origin(value) if o is None else o
                if o:
                    flag(f"{name}.{key} was replaced by code from {o}")
                    if name == "threading" and key in ("_trace_hook", "_profile_hook"):
                        d[key] = None  # threading.settrace/setprofile: every new thread would get it


def _objects(shell):
    """The kernel's machinery whose attributes, lists and hooks learner code could bend."""
    kernel = getattr(shell, "kernel", None)
    objs = {"shell": shell, "shell.events": shell.events, "shell.compile": shell.compile,
            "shell.displayhook": shell.displayhook, "shell.display_pub": shell.display_pub,
            "shell.display_formatter": shell.display_formatter,
            "shell.input_transformer_manager": shell.input_transformer_manager,
            "shell.display_pub.session": getattr(shell.display_pub, "session", None),
            "shell.display_pub.pub_socket": getattr(shell.display_pub, "pub_socket", None)}
    if kernel is not None:  # the messages that carry a cell's error (and the reply) go through these
        objs.update({"kernel": kernel, "kernel.session": getattr(kernel, "session", None),
                     "kernel.iopub_socket": getattr(kernel, "iopub_socket", None)})
    return {k: v for k, v in objs.items() if v is not None}


def _inner(obj):
    d = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    d.update(d.pop("_trait_values", None) or {})
    return d


def snapshot(shell):
    return {"builtins": dict(vars(builtins)), "objects": {k: (o, _inner(o)) for k, o in _objects(shell).items()},
            "hooks": (sys.gettrace(), sys.getprofile(), sys.excepthook, sys.displayhook),
            "custom": (shell.custom_exceptions, vars(shell).get("CustomTB")),
            "cell_name": os.environ.get("IPYKERNEL_CELL_NAME")}


def restore_kernel(state, shell):
    """Builtins, IPython hooks, trace functions: back to the kernel's start; flag each difference."""
    base = state["base"]
    for k, v in base["builtins"].items():
        if k not in VOLATILE_BUILTINS and vars(builtins).get(k, KEY) is not v:
            flag(f"builtins.{k} was replaced")
            setattr(builtins, k, v)
    ns = shell.user_ns
    own = ns.get("__builtins__", builtins)
    if own is not builtins and own is not vars(builtins):  # by identity: an impostor can claim to be equal
        flag("the notebook's __builtins__ was replaced")
        ns["__builtins__"] = builtins
    now = _objects(shell)
    for label, (obj, attrs) in base["objects"].items():
        if now.get(label) is not obj:
            flag(f"{label} was replaced")
            continue
        inner = _inner(obj)
        for k, v in inner.items():
            o = _origin(v)
            if o and attrs.get(k, KEY) is not v:
                flag(f"{label}.{k} was replaced by code from {o}")
                if k in attrs:
                    setattr(obj, k, attrs[k])
                elif k in vars(obj):
                    delattr(obj, k)
            elif type(v) in (list, dict):  # transformer lists, event callbacks
                lists = v.values() if type(v) is dict else [v]
                for lst in (x for x in lists if type(x) is list):
                    for item in list(lst):
                        o = _origin(item)
                        if o:
                            flag(f"{label}.{k} holds code from {o} (a hook that runs around every cell)")
                            lst.remove(item)
    custom, tb = base["custom"]
    if shell.custom_exceptions != custom or vars(shell).get("CustomTB") is not tb:
        flag("a custom exception handler was installed (set_custom_exc)")
        shell.custom_exceptions = custom
        if tb is None:
            vars(shell).pop("CustomTB", None)
        else:
            shell.CustomTB = tb
    trace, profile, excepthook, displayhook = base["hooks"]
    if sys.gettrace() is not trace or sys.getprofile() is not profile:
        flag("a trace or profile function (sys.settrace/sys.setprofile) was left installed")
        sys.settrace(trace)
        sys.setprofile(profile)
    if sys.excepthook is not excepthook or sys.displayhook is not displayhook:
        flag("sys.excepthook or sys.displayhook was replaced")
        sys.excepthook, sys.displayhook = excepthook, displayhook
    if os.environ.get("IPYKERNEL_CELL_NAME") != base["cell_name"]:
        flag("IPYKERNEL_CELL_NAME was set (every cell would share one file name)")
        os.environ.pop("IPYKERNEL_CELL_NAME", None)
