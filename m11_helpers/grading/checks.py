"""What check cells call: compare a learner's answer, print a pass line or explain what is wrong.

    from m11_helpers.grading.checks import expect_close, passed, checking
    with checking("0.2"):                      # a stub's NotImplementedError -> "not implemented yet"
        got = average_across_ranks(t)
    expect_close(got, torch.tensor([1.5, 1.5]), "avg", exercise="0.2",
                 hint="did you divide by the world size?")
    passed("0.2", points=2)                    # ✔ Exercise 0.2 passed (2 points)

A failure raises `AssertionError` whose first line names the exercise and what is wrong, then
expected / got / hint lines: the autograder copies that first line into its report.
Works with tensors, numpy arrays, numbers and nested lists/tuples/dicts of them; torch and numpy are
imported only when the values are theirs, so a check cell costs nothing extra.

An answer is made plain before anything compares it (plain.py): built-in types as they are, a subclass
of one (namedtuple, IntEnum, Parameter, ndarray subclass) converted by its base type's own C code, a C
type (numpy scalars, `torch.dtype`) as it is; anything else only if it is the expected value's own
class. What a class says about itself (`__module__`) is never trusted: an `int` subclass whose `__eq__`
says True, or a tensor subclass (or a torch function mode left on) that answers `allclose` itself,
would otherwise pass any check. Check cells must not catch these failures: under `m11 grade` a check
cell passes only if its own code reaches `passed(...)` with no failed check on the way (guard/driver.py).
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Iterator

from m11_helpers.grading.plain import Foreign, Named, as_written, plain, qualname

__all__ = ["expect_close", "expect_equal", "expect_true", "passed", "checking", "fail", "NOT_IMPLEMENTED"]

NOT_IMPLEMENTED = "not implemented yet"


def _show(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 300 else text[:300] + " …"


def fail(exercise: str, what: str, expected: Any = None, got: Any = None, hint: str = "",
         show_values: bool = True) -> None:
    """Raise the AssertionError every check raises: the exercise, what is wrong, expected, got, a hint."""
    lines = [f"Exercise {exercise}: {what}"]
    if show_values:
        lines += [f"  expected: {_show(expected)}", f"  got:      {_show(got)}"]
    if hint:
        lines.append(f"  hint: {hint}")
    raise AssertionError("\n".join(lines))


def _special_got(got: Any, name: str, exercise: str, expected: Any, hint: str) -> None:
    """Explain the two answers that mean 'no answer yet' before comparing anything."""
    if got is NotImplemented:
        fail(exercise, f"{name} is {NOT_IMPLEMENTED} (got NotImplemented).", expected, got, hint)
    if got is None and expected is not None:
        fail(exercise, f"{name} is None: did the function forget to `return` its result?",
              expected, got, hint)


def _kind(x: Any) -> str:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and hasattr(x, "shape"):
        return "tensor"
    if mod == "numpy" and hasattr(x, "shape") and getattr(x, "ndim", 0) > 0:
        return "array"
    if isinstance(x, (list, tuple)):
        return "seq"
    return "scalar"


def _as_tensor(x: Any):
    import torch  # only reached when a tensor is involved, so torch is already imported

    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _compare_tensors(g, e, path: str, rtol: float, atol: float) -> str | None:
    import torch

    if not (g.is_floating_point() or g.is_complex()) and (e.is_floating_point() or e.is_complex()):
        return f"{path} has dtype {g.dtype}, expected a floating dtype like {e.dtype}"
    g, e = g.detach().cpu(), e.detach().cpu()
    if tuple(g.shape) != tuple(e.shape):
        return f"{path} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
    dtype = e.dtype if e.is_complex() else torch.float64
    return None if torch.allclose(g.to(dtype), e.to(dtype), rtol=rtol, atol=atol, equal_nan=True) else f"{path} is wrong"


def _compare(got: Any, expected: Any, path: str, rtol: float, atol: float) -> str | None:
    """Return why `got` (made plain) is not close to `expected` (None when it is)."""
    kinds = {_kind(got), _kind(expected)}
    if "tensor" in kinds or "array" in kinds:
        if "tensor" in kinds:
            import torch

            with as_written(torch):
                return _compare_tensors(_as_tensor(got), _as_tensor(expected), path, rtol, atol)
        import numpy as np

        g, e = np.asarray(got), np.asarray(expected)
        if tuple(g.shape) != tuple(e.shape):
            return f"{path} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        return None if np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True) else f"{path} is wrong"
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return f"{path} should be a dict with keys {sorted(map(str, expected))}"
        return next((w for k in expected if (w := _compare(got[k], expected[k], f"{path}[{k!r}]", rtol, atol))),
                    None)
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{path} should be a {type(expected).__name__}, got a {type(got).__name__}"
        if len(got) != len(expected):
            return f"{path} has length {len(got)}, expected {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            why = _compare(g, e, f"{path}[{i}]", rtol, atol)
            if why:
                return why
        return None
    try:
        g, e = complex(got), complex(expected)
    except (TypeError, ValueError):
        return None if got == expected else f"{path} is wrong"
    if math.isnan(abs(e)) and math.isnan(abs(g)):
        return None
    return None if abs(g - e) <= atol + rtol * abs(e) else f"{path} is wrong"


def _equal(got: Any, expected: Any, path: str) -> str | None:
    """Why `got` (made plain) is not exactly `expected` (None when it is); containers element by element."""
    if {_kind(got), _kind(expected)} & {"tensor", "array"}:
        return _compare(got, expected, path, rtol=0.0, atol=0.0)
    if isinstance(expected, dict) and isinstance(got, dict) and set(got) == set(expected):
        return next((w for k in expected if (w := _equal(got[k], expected[k], f"{path}[{k!r}]"))), None)
    if isinstance(expected, (list, tuple)) and isinstance(got, type(expected)) and len(got) == len(expected):
        return next((w for i, (g, e) in enumerate(zip(got, expected)) if (w := _equal(g, e, f"{path}[{i}]"))), None)
    return None if bool(expected == got) else f"{path} is wrong"


def _judge(got: Any, expected: Any, name: str, compare) -> tuple[str | None, Any]:
    """(why `got` fails, what to show): its plain value compared, or why it has none."""
    try:
        value = plain(got, expected, name)
    except Foreign as e:
        return str(e), Named(qualname(type(got)))
    return compare(value), value


def expect_close(got: Any, expected: Any, name: str, *, exercise: str, hint: str = "",
                 rtol: float = 1e-5, atol: float = 1e-8) -> None:
    """Assert |got - expected| <= atol + rtol·|expected| elementwise (shapes must match)."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol={rtol}, atol={atol}: tolerances must be >= 0")
    _special_got(got, name, exercise, expected, hint)
    why, got = _judge(got, expected, name, lambda g: _compare(g, expected, name, rtol, atol))
    if why:
        fail(exercise, why + ".", expected, got, hint)


def expect_equal(got: Any, expected: Any, name: str, *, exercise: str, hint: str = "") -> None:
    """Assert got == expected exactly (tensors/arrays: same shape and every element equal)."""
    _special_got(got, name, exercise, expected, hint)
    why, got = _judge(got, expected, name, lambda g: _equal(g, expected, name))
    if why:
        fail(exercise, why + ".", expected, got, hint)


def expect_true(cond: Any, message: str, *, exercise: str, hint: str = "") -> None:
    """Assert `cond` is truthy; `message` says what should hold (e.g. "the loss went down")."""
    try:
        cond = plain(cond, True, "the condition")
    except Foreign as e:
        fail(exercise, f"{e}.", hint=hint, show_values=False)
    torch = sys.modules.get("torch")
    if type(cond) is getattr(torch, "Tensor", None):
        with as_written(torch):
            cond = bool(cond)
    if not cond:
        fail(exercise, f"expected {message}.", hint=hint, show_values=False)


def passed(exercise: str, points: float | None = None) -> str:
    """Print and return the pass line, e.g. `✔ Exercise 0.2 passed (2 points)`."""
    if points is None:
        line = f"✔ Exercise {exercise} passed"
    else:
        shown = int(points) if float(points).is_integer() else points
        line = f"✔ Exercise {exercise} passed ({shown} point{'' if shown == 1 else 's'})"
    print(line)
    return line


@contextlib.contextmanager
def checking(exercise: str, hint: str = "") -> Iterator[None]:
    """Turn a stub's `NotImplementedError` inside the block into a clear 'not implemented yet'."""
    try:
        yield
    except NotImplementedError as e:
        detail = "" if NOT_IMPLEMENTED in str(e) or not str(e) else f" ({e})"
        lines = [f"Exercise {exercise}: {NOT_IMPLEMENTED}{detail}.",
                 "  replace `raise NotImplementedError(...)` in the exercise cell with your code"]
        if hint:
            lines.append(f"  hint: {hint}")
        raise AssertionError("\n".join(lines)) from None
