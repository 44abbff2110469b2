"""What the device check costs a rank: a tiny-GPT training step with and without `DeviceCheck`, side by side.

    .venv/bin/python benchmarks/device_check.py

The check (m11_helpers.device_check) is a TorchFunctionMode: every torch call of a checked rank passes
through one Python function, so its cost is per op, largest on tiny ops. Measured here on the course's
tiny GPT (the size of most lesson runs), interleaved so load on a shared machine hits both alike.
Installing it in a rank (patching the collectives, entering the mode) is timed too.
"""

from __future__ import annotations

import time

import torch

from m11_helpers.device_check import DeviceCheck, install
from m11_helpers.models import tiny_gpt
from m11_helpers.timing import format_seconds, time_it


def main() -> None:
    torch.set_num_threads(1)
    model, x = tiny_gpt(0), torch.randint(0, 64, (4, 32))  # (B, T)

    def step():
        model(x, x).backward()

    def checked():
        with DeviceCheck():
            step()

    plain, check = [], []
    for _ in range(5):  # interleaved rounds: a busy moment slows both, not one
        plain.append(time_it(step, repeats=3, warmup=1).median)
        check.append(time_it(checked, repeats=3, warmup=1).median)
    p, c = min(plain), min(check)
    t0 = time.perf_counter()
    install()
    print(f"tiny-GPT forward+backward: plain {format_seconds(p)}, checked {format_seconds(c)}, ratio {c / p:.3f} "
          f"(best of 5 interleaved medians); install() {format_seconds(time.perf_counter() - t0)}")


if __name__ == "__main__":
    main()
