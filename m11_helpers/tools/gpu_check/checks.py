"""What a GPU check is: a function `(ctx) -> Outcome` that runs one GPU branch of the course for real.

A check is a function `(ctx) -> Outcome`; it may raise `Skip("reason")` (e.g. a multi-rank check on a
one-GPU machine). Everything runs on the first visible GPU(s); nothing is simulated. The figures are
compared with lesson 01's datasheet table (`m11_helpers.hardware_specs`) where one applies.
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


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def datasheet_chip(device_name: str):
    """The row of lesson 01's table for a CUDA device name ('NVIDIA H100 80GB HBM3' -> 'H100 SXM'), or None."""
    from m11_helpers.hardware_specs import CHIPS

    name = device_name.upper()
    for key in ("B200", "H200", "H100", "A100", "MI300X"):
        if key in name:
            return next((c for n, c in CHIPS.items() if n.upper().startswith(key)), None)
    return None

