"""What counts as a plain answer, and how a check gets one: nothing a learner's class says about itself is believed.

`plain(got, expected, name)` returns `got` as a value whose comparisons run only library code, or raises
`Foreign` saying why it has none:

- built-in numbers, strings, bytes and None exactly as they are; lists, tuples, dicts and sets rebuilt
  from their base type's own copy, element by element;
- a subclass of one of them (a namedtuple, an IntEnum, numpy's float64) converted by its base type's own
  C method called unbound (`int.__pos__`, `tuple.__getitem__(x, slice(None))`): never its `__iter__`,
  `__eq__` or `__index__`;
- a tensor: exactly `torch.Tensor`, or a subclass detached with `__torch_function__` off (a Parameter
  becomes its values; a subclass that still answers for itself is refused); an ndarray viewed as a
  plain ndarray, never one of Python objects;
- a type written in C that holds no other values (numpy scalars, `torch.dtype`, `Decimal`), told apart
  by its real `Py_TPFLAGS_IMMUTABLETYPE` flag, which no class a notebook writes can carry;
- anything else only when it is the expected value's own class and holds only plain values.

Why: `class Anything(int): __module__ = "builtins"; __eq__ = lambda s, o: True` passed `expect_equal`
when plain meant "its `__module__` names a library", and so did a `torch.Tensor` subclass claiming
`__module__ = "torch"` whose `__torch_function__` answers `torch.allclose` with True. `as_written(torch)`
runs the comparisons with every torch function and dispatch mode off, so a mode the notebook left on
cannot answer for them either. The guard (guard/driver.py) verifies this module like checks.py itself.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

__all__ = []  # checks.py is its one user; guard/driver.py reads a verified module's __all__ as names a notebook may not rebind

# (module-level values stay plain data: the guard compares this module's globals with a fresh run of its source)
_IMMUTABLE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: set on types written in C, never on a class a notebook makes
_EXACT = frozenset({int, float, bool, complex, str, bytes, type(None)})
_BASES = (int, float, complex, str, bytes)


class _NO:
    """No expected value alongside (a dict key, a container the expected value does not mirror)."""


class Foreign(Exception):
    """An answer whose comparison could run its own class's code: refused before anything compares it."""


def qualname(t: type) -> str:
    return type.__dict__["__qualname__"].__get__(t)


class Named(str):
    def __repr__(self) -> str:  # a refused value is never asked for its own repr: its class's name instead
        return f"<a {self} object>"


def _c_scalar(t: type) -> bool:
    """A type written in C that holds no other values: numpy scalars, torch.dtype, Decimal (C compares them)."""
    flags = type.__dict__["__flags__"].__get__(t)  # the real flags: a metaclass could shadow `__flags__`
    return bool(flags & _IMMUTABLE) and not hasattr(t, "__iter__") and (
        t.__dictoffset__ == 0 or t.__eq__ is object.__eq__)


def _inner_ok(x: Any, depth: int = 0) -> bool:
    """x is plain as it stands, all the way down (what an object of the expected value's own class may hold)."""
    t, torch, np = type(x), sys.modules.get("torch"), sys.modules.get("numpy")
    if t in _EXACT or t is type:
        return True
    if depth > 50:
        return False
    if t in (list, tuple, set, frozenset):
        return all(_inner_ok(v, depth + 1) for v in x)
    if t is dict:
        return all(_inner_ok(k, depth + 1) and _inner_ok(v, depth + 1) for k, v in x.items())
    if torch is not None and t is torch.Tensor or np is not None and t is np.ndarray and not x.dtype.hasobject:
        return True
    return _c_scalar(t)


def _fields(x: Any) -> list:
    """What an object holds: its __dict__'s and __slots__' values (read past its own __getattribute__)."""
    slots = [k.__dict__.get("__slots__") or () for k in type(x).__mro__[:-1]]
    held: list = []
    for name in ["__dict__", *(n for s in slots for n in ((s,) if isinstance(s, str) else s))]:
        try:
            v = object.__getattribute__(x, name)
        except (AttributeError, TypeError):
            continue
        held += list(v.values()) if name == "__dict__" else [v]
    return held


def plain(got: Any, expected: Any, path: str) -> Any:
    """`got` as a value only library code compares; `Foreign` when it cannot be one. Calls nothing of got's class."""
    t = type(got)
    if t in _EXACT:
        return got
    if issubclass(t, (list, tuple)):
        base = list if issubclass(t, list) else tuple
        items = base.__getitem__(got, slice(None))  # the base type's copy: not the subclass's __iter__ or __len__
        mirror = isinstance(expected, (list, tuple)) and len(expected) == len(items)
        return base(plain(v, expected[i] if mirror else _NO, f"{path}[{i}]") for i, v in enumerate(items))
    if issubclass(t, dict):
        out = {}
        for k, v in list(dict.items(got)):
            k = plain(k, _NO, f"a key of {path}")
            out[k] = plain(v, expected.get(k, _NO) if isinstance(expected, dict) else _NO, f"{path}[{k!r}]")
        return out
    if issubclass(t, (set, frozenset)):
        base = set if issubclass(t, set) else frozenset
        return base(plain(v, _NO, f"an element of {path}") for v in base.__iter__(got))
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")  # a tensor (an array) means they are imported
    if torch is not None and issubclass(t, torch.Tensor):
        if t is not torch.Tensor:  # Parameter, or a subclass with its own __torch_function__: its plain values
            with torch._C.DisableTorchFunctionSubclass():
                got = torch.Tensor.detach(got)
            if type(got) is not torch.Tensor:
                raise Foreign(f"{path} is a tensor subclass ({qualname(t)}) that answers for itself: return "
                               "a plain tensor")
        return got
    if np is not None and issubclass(t, np.ndarray):
        got = got if t is np.ndarray else np.ndarray.view(got, np.ndarray)
        if got.dtype.hasobject:
            raise Foreign(f"{path} is an array of Python objects: return an array of numbers")
        return got
    for base in _BASES:  # a subclass of a number or a string: its value, copied by the base type's own C code
        if issubclass(t, base):
            return base.__getitem__(got, slice(None)) if base is bytes else (
                str.__str__(got) if base is str else base.__pos__(got))
    if t is type or _c_scalar(t):
        return got
    if t is type(expected) and all(_inner_ok(v) for v in _fields(got)):  # the check's own class (a dataclass)
        return got
    raise Foreign(f"{path} is an instance of {qualname(t)}, not a plain value: return a tensor, an "
                   "array, a number, or a list/tuple/dict of them")


@contextlib.contextmanager
def as_written(torch) -> Iterator[None]:
    """torch functions as torch wrote them: no __torch_function__ or dispatch mode left on answers for them."""
    from torch.utils._python_dispatch import _disable_current_modes

    with torch._C.DisableTorchFunction(), _disable_current_modes():
        yield
