"""The reference script (`scripts/train.py`) from Python: on forked ranks in seconds, or as the launcher runs it.

    from m11_helpers.launch import launch, launch_script
    from m11_helpers.reference_run import SendSignal, loss_curve, run_train
    part = launch(run_train, "--steps", 12, "--ckpt-dir", d, observer=SendSignal(5, signal.SIGTERM),
                  num_processes=4)                            # a spot notice after step 5: checkpoint 6, stop
    rest = launch(run_train, "--steps", 12, "--ckpt-dir", d, num_processes=2)   # resumes on 2 ranks (resharded)
    loss_curve(part[0], rest[0])                              # {step: loss} across both runs
    run = launch_script("train.py", "--ckpt-dir", d, "--crash-at", "6", num_processes=2, max_restarts=1)
    exit_codes(run.output), run.restarts                                          # [1], 1

`run_train` is the script's own `main`, run in each rank `launch` forks: the same code as under
`accelerate launch`, minus the seconds every new process spends importing torch — what a notebook
cell can afford. `observer` (optional) is an object with `on_build(model)`, `on_step(record)` and
`on_end(model)` methods: instrumentation (counters, kill switches) stays beside the script, not in it.
Lesson 10.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import threading
from pathlib import Path

from m11_helpers.resources import script_path
from m11_helpers.validate import non_negative_int, non_negative_real

__all__ = ["script_module", "run_train", "loss_curve", "SendSignal", "exit_codes"]


@functools.cache
def script_module(name: str = "train.py"):
    """A course script imported as a module (its `main` does not run on import): `scripts/train.py` by default,
    or `"train_spot.py"` (its `main(argv)` returns what the run reports)."""
    path = script_path(name)
    spec = importlib.util.spec_from_file_location(f"m11_reference_{Path(name).stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # so pickling and dataclasses find it
    spec.loader.exec_module(module)
    return module


# Imported here, in the caller, on purpose: ranks forked by `launch` inherit the script and what it
# imports (FSDP, DCP: seconds per rank otherwise).
script_module()


def run_train(*argv, observer=None) -> dict:
    """The script's `main` with these command-line arguments, on this rank (call it through `launch`)."""
    return script_module().main([str(a) for a in argv], observer=observer)


def loss_curve(*results: dict) -> dict[int, float]:
    """{step: loss} over one or more runs' results, in order: a later run (after a resume or a
    rollback that redid steps) overrides the earlier value of the same step."""
    curve: dict[int, float] = {}
    for r in results:
        curve.update(zip(r["steps"], r["losses"]))
    return dict(sorted(curve.items()))


class SendSignal:
    """An observer that sends this process a real signal after step `at` (and after any save that step began).

    `SendSignal(5, signal.SIGTERM, rank=1)`: a spot notice to rank 1 only (the ranks agree, checkpoint
    step 6 and stop); `SendSignal(7, signal.SIGKILL, delay=0.02)`: rank 0 dies 20 ms later, mid-step.
    """

    def __init__(self, at: int, sig: int, rank: int = 0, delay: float = 0.0):
        self.at, self.sig, self.rank = non_negative_int("at", at), sig, non_negative_int("rank", rank)
        self.delay = non_negative_real("delay", delay)

    def on_step(self, record: dict) -> None:
        import torch.distributed as dist

        if record["step"] == self.at and dist.get_rank() == self.rank:
            send = functools.partial(os.kill, os.getpid(), self.sig)  # a real signal, as the cloud or a crash sends it
            threading.Timer(self.delay, send).start() if self.delay else send()


_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


def exit_codes(output: str) -> list[int]:
    """The failed workers' exit codes in torchrun's failure reports (`exitcode  : 1`), in order of appearance."""
    return [int(m.group(1)) for m in _EXIT.finditer(output)]
