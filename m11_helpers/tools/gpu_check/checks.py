"""What a GPU check is: a function `(ctx) -> Outcome` that runs one GPU branch of the course for real.

A check is a module-level function `(ctx) -> Outcome` (it runs in a process of its own, which imports
it by name); it may raise `Skip("reason")` (e.g. a multi-rank check on a one-GPU machine). Everything
runs on the first visible GPU(s); nothing is simulated. The figures are compared with lesson 01's
datasheet table (`m11_helpers.hardware_specs`) where one applies, through the course's one name
lookup (`m11_helpers.throughput.chip_for`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable


class Skip(Exception):
    """The check does not apply on this machine; the message says why."""


@dataclasses.dataclass
class Outcome:
    figure: str  # the measured figure(s), one line


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    what: str  # what it runs, for `--list`
    run: Callable[[dict], Outcome]


def datasheet_chip(device_name: str):
    """The `Chip` of lesson 01's table for a CUDA device name (`throughput.chip_for`'s row), or None."""
    from m11_helpers.hardware_specs import CHIPS
    from m11_helpers.throughput import chip_for

    row = chip_for(device_name)
    return CHIPS[row] if row else None
