"""Where a guarded check cell's time goes, in one kernel with a lesson's imports (torch, the launcher, the checks).

    python benchmarks/guard_phases.py [--cells 10] [--repeats 5]

`m11 grade` and every lesson's wrong-answer run (m11_helpers/grading/authoring/wrong_answers.py) start a
kernel, take the guard's baseline (m11_helpers/grading/guard/driver.py) and call the guard before and
after every check cell, and once after every course cell that defines something (`mark`). This prints, in
CPU milliseconds (the kernel's, read with psutil; the grading process's, with `time.process_time`):

- the fixed costs of a run: the kernel's start, the baseline, the imports;
- per call, by mode: `before`, `after`, `mark` (that one is the cost of the request itself: ipykernel's
  execute path and the guard's frame), with the check cell alone for comparison;
- inside one call, each phase timed in the kernel (best of `--repeats`): running the guard's two parts
  from their text (what every call paid while the driver sent them as text) and from the code the
  baseline compiled, `restore_kernel`, `scan_modules` with its per-call caches empty (as each call runs
  it), each `_verify` of a kit module, `_rebind`.
"""

from __future__ import annotations

import argparse
import json
import time

import psutil
from jupyter_client import KernelManager

from m11_helpers.grading.guard.driver import Guard

IMPORTS = ("import torch, torch.distributed as dist\n"
           "from m11_helpers.launch import launch\n"
           "from m11_helpers.grading.checks import checking, expect_close, expect_equal, passed\n")
CHECK = 'with checking("1.1"):\n    x = 1\npassed("1.1")'
COURSE = "def helper():\n    return 1\n"

# Run in the kernel: the guard's parts in a namespace of their own (the ledger without its `_main`), each
# phase timed there. `{...}` fields are filled in by `phases`.
PHASES = '''
import json as _json, sys as _sys, time as _time
_held = _sys.modules["_m11_grade_guard"].state["holder"].x
_args, _out, _n = {args}, {{}}, {repeats}
def _best(label, fn):
    best = 1e9
    for _ in range(_n):
        t = _time.process_time(); fn(); best = min(best, _time.process_time() - t)
    _out[label] = round(best * 1000, 2)
_texts = {texts}
_best("run the two parts from their text", lambda: [exec(t, {{"ARGS": _args}}) for t in _texts])
_best("run the two parts from the baseline's code", lambda: [exec(c, {{"ARGS": _args}}) for c in _held[2]])
_ns = {{"ARGS": _args}}
exec(_texts[0], _ns)
exec(_texts[1], _ns)
_state, _shell = _sys.modules["_m11_grade_guard"].state, get_ipython()
def _fresh():
    for cache in (_ns["FOUND"], _ns["_files"], _ns["_types"]):
        cache.clear()
_best("restore_kernel", lambda: (_fresh(), _ns["restore_kernel"](_state, _shell)))
_best("scan_modules", lambda: (_fresh(), _ns["scan_modules"]()))
for _name, _source, _code in _held[3]:
    _best("_verify " + _name.removeprefix("m11_helpers."), lambda: _ns["_verify"](_name, _source, _code))
_best("_rebind", lambda: _ns["_rebind"](_state, _shell, True))
_out["found"] = list(_ns["FOUND"])
_out["modules"] = len(_sys.modules)
print(_json.dumps(_out))
'''


class Kernel:
    def __init__(self) -> None:
        self.guard = Guard(None)  # reads its code and the sources before the kernel runs anything, as the plugin does
        start = time.process_time()
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(60)
        self.proc = psutil.Process(self.km.provisioner.process.pid)
        self.fixed = {"kernel start (kernel CPU)": self.cpu(), "kernel start (driver CPU)": time.process_time() - start}
        self.guard.kc = self.kc
        self.fixed["baseline"] = self.timed(self.guard.baseline)[0]
        self.fixed["imports"] = self.timed(lambda: self.run(IMPORTS))[0]

    def cpu(self) -> float:
        return sum(self.proc.cpu_times()[:2])

    def timed(self, fn) -> tuple[float, float]:
        """(kernel, driver) CPU seconds of fn()."""
        k, d = self.cpu(), time.process_time()
        fn()
        return self.cpu() - k, time.process_time() - d

    def run(self, code: str, out: list | None = None) -> None:
        hook = (lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None) \
            if out is not None else (lambda m: None)
        reply = self.kc.execute_interactive(code, timeout=300, output_hook=hook)
        assert reply["content"]["status"] == "ok", reply["content"].get("evalue")

    def calls(self, n: int) -> dict[str, float]:
        """Mean CPU ms per call of each mode over n guarded check cells (and course cells)."""
        total: dict[str, float] = {}
        for _ in range(n):
            steps = {"before": lambda: self.guard.before("1.1", CHECK), "the check cell alone": lambda: self.run(CHECK),
                     "after": lambda: self.guard.after("1.1"), "mark": lambda: self.guard.mark(COURSE)}
            for label, fn in steps.items():
                kernel, driver = self.timed(fn)
                total[f"{label} (kernel)"] = total.get(f"{label} (kernel)", 0) + kernel
                if label != "the check cell alone":
                    total[f"{label} (driver)"] = total.get(f"{label} (driver)", 0) + driver
        return {k: v / n * 1000 for k, v in total.items()}

    def phases(self, repeats: int) -> dict:
        args = dict(mode="after", nonce="x", roots=self.guard.roots, state=self.guard.state, holder=self.guard.holder,
                    exercise="1.1", kit=self.guard.kit, free=["checking", "passed"])
        texts = [p[:p.index("\nif A:\n")] if "\nif A:\n" in p else p for p in self.guard.parts]
        out: list[str] = []
        self.run(PHASES.format(args=repr(args), repeats=repeats, texts=repr(texts)), out)
        return json.loads("".join(out))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=10, help="guarded check cells to average the calls over")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each phase (the best is printed)")
    args = ap.parse_args()
    k = Kernel()
    try:
        k.calls(2)  # warm-up
        calls, phases = k.calls(args.cells), k.phases(args.repeats)
    finally:
        k.close()
    print("fixed costs of a run, CPU ms:")
    for label, s in k.fixed.items():
        print(f"  {label:<46}{s * 1000:8.1f}")
    print(f"per call, CPU ms (mean of {args.cells} check cells):")
    for label, ms in calls.items():
        print(f"  {label:<46}{ms:8.1f}")
    assert not phases.pop("found"), "the guard found something in an honest kernel"
    print(f"inside one call, kernel CPU ms (best of {args.repeats}; {phases.pop('modules')} modules loaded):")
    for label, ms in phases.items():
        print(f"  {label:<46}{ms:8.2f}")


if __name__ == "__main__":
    main()
