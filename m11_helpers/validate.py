"""Argument checks, the one way: bad input raises `ValueError` naming the parameter and what is allowed.

    n = positive_int("world_size", world_size)          # 1, 2, 3, …   (bool is refused: True is not a size)
    s = positive_real("bandwidth", bandwidth)           # finite and > 0 (NaN and inf are refused)
    f = fraction("mfu", mfu)                            # 0 < f <= 1
    p = one_of("parallel", parallel, ("ddp", "fsdp2"))

Each returns its value, so a check reads as an assignment. NaN fails every comparison, so a check
written `value <= 0` lets NaN through; these are written so that it cannot.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, TypeVar

__all__ = ["positive_int", "non_negative_int", "positive_real", "non_negative_real", "fraction", "one_of"]

T = TypeVar("T")


def _integer(name: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """`value` as an int >= 1."""
    v = _integer(name, value, "an integer >= 1")
    if v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return v


def non_negative_int(name: str, value: Any) -> int:
    """`value` as an int >= 0."""
    v = _integer(name, value, "an integer >= 0")
    if v < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return v


def _real(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def positive_real(name: str, value: Any) -> float:
    """`value` as a finite float > 0."""
    v = _real(name, value, "a finite number > 0")
    if not v > 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def non_negative_real(name: str, value: Any) -> float:
    """`value` as a finite float >= 0."""
    v = _real(name, value, "a finite number >= 0")
    if not v >= 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def fraction(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """`value` as a float in (0, 1] (or [0, 1] with allow_zero)."""
    what = "a number in [0, 1]" if allow_zero else "a number in (0, 1]"
    v = _real(name, value, what)
    if not (0 <= v <= 1 if allow_zero else 0 < v <= 1):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return v


def one_of(name: str, value: T, allowed: Iterable[T]) -> T:
    """`value` itself when it is one of `allowed`."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value
