"""The capstone run as a cluster starts it: your build, step and loop in every process `accelerate launch` starts.

    accelerate launch --config_file capstone.yaml $(m11 script capstone.py) --run my_run.pkl \\
        --bf16 --ac --ac-every 2 --accum 2 --dropout 0.1 --ckpt-dir ckpt           # train.py's flags after --run

`--run FILE` holds the functions of exercise 11.3's notebook (`capstone_command.freeze`: the build,
the step, the loop) and the notice to send (`signal_at`, `signal_rank`: a real SIGTERM to one rank in
the middle of that step, as a spot instance gets it); every other flag is the reference script's
(`scripts/train.py --help`), read by its own parser. Each rank runs `capstone_assembly.run_phase`:
your loop from the newest checkpoint in --ckpt-dir, and reports what it did (`launch.report`), which
the notebook compares with the same run on forked ranks, bit for bit. With `M11_CAPSTONE_REFERENCE`
set (`capstone_command.run_command(argv, reference=[...])`: flags appended to the run's), each process
first trains the script's own pieces with those flags and reports their losses (`reference_losses`),
before anything of the notebook's is thawed into it: the check's reference on the same 4 ranks,
without a second launch. Lesson 11.
"""

import argparse
import gc
import os
import shlex

import torch.distributed as dist

from m11_helpers.capstone_assembly import build_trial, forbid_reference_loop, run_phase
from m11_helpers.capstone_command import REFERENCE_ENV, thaw
from m11_helpers.launch import report
from m11_helpers.procs import exit_on_failure
from m11_helpers.reference_run import script_module


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description="The capstone: a notebook's build, step and loop on every rank.")
    p.add_argument("--run", required=True, help="the file capstone_command.freeze wrote")
    ours, flags = p.parse_known_args(argv)
    args = script_module().parse(flags)  # the reference script's flags, checked by its own parser
    if not args.ckpt_dir:
        raise ValueError("--ckpt-dir is required: the run checkpoints and resumes there")
    flags = [f for i, f in enumerate(flags) if f != "--ckpt-dir" and (i == 0 or flags[i - 1] != "--ckpt-dir")]
    if os.environ.get(REFERENCE_ENV) is not None:  # the script's pieces first: nothing of the notebook's runs yet
        report(reference_losses=build_trial(None, [[*flags, *shlex.split(os.environ[REFERENCE_ENV])]])[0]["losses"])
    run = thaw(ours.run)
    forbid_reference_loop()  # the script's loop is off limits here too
    result = run_phase(run["build"], run["step"], run["loop"], flags, args.ckpt_dir, signal_at=run.get("signal_at"),
                       signal_rank=run.get("signal_rank", 1))
    report(**result)
    return result


if __name__ == "__main__":
    exit_on_failure(main)  # a failed rank prints its traceback and leaves with its code at once (procs.py)
    gc.collect()
    dist.destroy_process_group()
