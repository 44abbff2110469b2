"""Run a function, or a script, on N real processes: gloo on CPU, NCCL with one GPU per process.

    results = launch(fn, *args, num_processes=4)          # fn may be defined in a notebook cell
    run = launch_script("train.py", "--steps", "20", num_processes=4)   # `accelerate launch` underneath

`launch` forks the ranks from the running interpreter, the way `accelerate.notebook_launcher` does,
and covers its gaps (see docs/cpu-distributed-facts.md, measured on torch 2.13 / accelerate
1.15): it returns every rank's return value, picks its own port and never clashes with another
launch, forks real processes on Colab's CPU runtime too (where Accelerate runs the function once,
in-process), pins one OpenMP thread per rank (a forked child that uses more after the kernel has
hangs forever), and turns a crash, a dead rank or a hang into a `LaunchError` naming the rank,
within seconds or at `timeout`, with no process left behind.

`launch_script` runs `accelerate launch` (command.py) under a supervisor that kills the agent and
every rank when the caller ends, however it ends (script.py says why and how), and reads back what
the ranks `report()` (results.py).
"""

import os as _os

from m11_helpers.launch.base import LaunchError, LaunchPlan, LaunchTimeout, launch_plan, rank_device
from m11_helpers.launch.command import accelerate_command
from m11_helpers.launch.fork import launch
from m11_helpers.launch.results import RESULTS_ENV, report
from m11_helpers.launch.script import ScriptRun, launch_script

if _os.environ.get(RESULTS_ENV) and "LOCAL_RANK" in _os.environ \
        and "1" in (_os.environ.get("M11_STRICT"), _os.environ.get("M11_DEVICE_CHECK")):
    # A rank of a script under launch_script in the suite's strict mode: check its buffers' devices
    # as launch() checks a forked rank's (m11_helpers.device_check). Scripts import report() from here.
    from m11_helpers import device_check as _device_check

    _device_check.install()

__all__ = ["LaunchError", "LaunchTimeout", "LaunchPlan", "ScriptRun", "accelerate_command", "launch",
           "launch_script", "launch_plan", "rank_device", "report", "RESULTS_ENV"]
