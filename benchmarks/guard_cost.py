"""The tamper guard's cost per check cell, in kernels with a lesson's imports, side by side in one run.

    python benchmarks/guard_cost.py [--repeats 5] [--cells 10]

`m11 grade` runs the guard (m11_helpers/grading/guard/driver.py) before and after every check cell: it restores
what learner code bent, scans every loaded library module for planted notebook code and compares the
kit's modules with their sources. With torch, accelerate and matplotlib loaded (~1,800 modules, ~170,000
values) the scan is most of it. Two kernels, each with those imports and its own guard:

- as shipped: the scan passes plain values, library functions and instances of an already judged class
  without a call (`_NO_CODE`, `_known` in guard/kernel.py), and the kit's sources are compiled once;
- as it was: the same guard's text with those shortcuts taken out (`_NO_CODE` empty, no function passed
  by its file, `_known` answering "don't know", a fresh compile cache every call), so every value goes
  through `_origin` as before (plus two failed comparisons each: the old scan was a little cheaper still);
  its parts still run from the code the baseline compiled (guard/driver.py), not sent and parsed every call.

Each round guards `--cells` one-line check cells in each kernel, interleaved, and reads the kernel's CPU
seconds; the script prints medians (`m11_helpers.timing.Timing`: CPU seconds here, not wall) and the
ratio. Both guards must find nothing and pass every cell.
"""

from __future__ import annotations

import argparse

import psutil
from jupyter_client import KernelManager

from m11_helpers.grading.guard.driver import Guard
from m11_helpers.timing import Timing

IMPORTS = ("import torch, torch.distributed as dist, accelerate, matplotlib.pyplot as plt\n"
           "from m11_helpers.launch import launch\n"
           "from m11_helpers.grading.checks import checking, expect_close, passed\n")
CHECK = 'with checking("1.1"):\n    x = 1\npassed("1.1")'


def as_it_was(guard: Guard) -> Guard:
    """The guard's kernel-side text without the scan's shortcuts and the compile cache."""
    kernel, ledger = guard.parts
    start = kernel.index("_NO_CODE = frozenset(")
    kernel = kernel[:start] + "_NO_CODE = frozenset()\n" + kernel[kernel.index("_WRAPPERS = "):]
    kernel = kernel.replace('    if id(t) in _WRAPPERS or t.__module__ == "functools":',
                            '    if True:  # as it was: never known', 1)
    kernel = kernel.replace("function, no_code = types.FunctionType, _NO_CODE", "function, no_code = None, _NO_CODE", 1)
    ledger = ledger.replace("_verify(name, source, code)", "_verify(name, source)", 1)  # compiled afresh
    assert "if True:  # as it was" in kernel and "function, no_code = None" in kernel and "(name, source)" in ledger
    guard.parts = (kernel, ledger)
    return guard


class Kernel:
    def __init__(self, variant: str) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(60)
        self.guard = Guard(self.kc) if variant == "shipped" else as_it_was(Guard(self.kc))
        self.guard.baseline()
        self.run(IMPORTS)
        self.proc = psutil.Process(self.km.provisioner.process.pid)

    def run(self, code: str) -> None:
        reply = self.kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]

    def check_cells(self, n: int) -> float:
        """Kernel CPU seconds per guarded check cell."""
        before = sum(self.proc.cpu_times()[:2])
        for _ in range(n):
            assert not self.guard.before("1.1", CHECK).tampering
            self.run(CHECK)
            after = self.guard.after("1.1")
            assert after.passed and not after.tampering and not after.error, after
        return (sum(self.proc.cpu_times()[:2]) - before) / n

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cells", type=int, default=10, help="check cells per round")
    args = ap.parse_args()
    kernels = {v: Kernel(v) for v in ("shipped", "as it was")}
    try:
        for k in kernels.values():
            k.check_cells(2)  # warm-up: the first calls judge every class once
        cpu: dict[str, list[float]] = {v: [] for v in kernels}
        for _ in range(args.repeats):  # interleaved: both see the same machine
            for v, k in kernels.items():
                cpu[v].append(k.check_cells(args.cells))
    finally:
        for k in kernels.values():
            k.close()
    t = {v: Timing(tuple(s)) for v, s in cpu.items()}
    print(f"kernel CPU per guarded check cell ({args.cells} cells a round, {args.repeats} rounds):")
    for v, timing in t.items():
        print(f"  {v + ':':<12}{timing}")
    print(f"  ratio as it was / shipped: {t['as it was'].median / t['shipped'].median:.2f}x")


if __name__ == "__main__":
    main()
