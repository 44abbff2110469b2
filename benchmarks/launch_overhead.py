"""Launch overhead: what M11's launchers cost over the bare tools they wrap, side by side in one run.

    python benchmarks/launch_overhead.py [--repeats 3]

1. `launch(fn)` against a bare `torchrun` of the same work (init the process group, one all-reduce,
   tear down), 4 ranks. `launch` forks from a warm interpreter (torch already imported); torchrun
   starts fresh interpreters, each importing torch: what a learner would otherwise pay from a
   notebook. Target: ratio <= 1.3.
2. `launch_script(script)` against a bare `accelerate launch` of the same script, 2 ranks: the price
   of the supervisor that stops the whole tree when the caller dies (`m11_helpers.tether.tethered`),
   of reading the results and of retagging the output. Target: ratio <= 1.1.
3. The supervisor alone: `python -c pass` through `tethered_popen` against a plain `Popen`.
4. How long a tethered tree outlives a SIGKILLed caller: from the caller's death to the moment
   none of its processes is left (the supervisor polls its parent every 20 ms).
5. What `gc.freeze()` saves each forked rank: `launch(fn)` from this interpreter (torch loaded, plus
   a notebook's worth of live objects) against the same launch with the ranks' `gc.freeze()` made a
   no-op, wall time and the ranks' CPU seconds. Without it each rank's one collection visits, and so
   copies, every page it shares with the caller (docs/cpu-distributed-facts.md, section 4).

Rounds are interleaved, so every variant sees the same machine load; each figure is the median
(`m11_helpers.timing`) of `--repeats` rounds.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

import m11_helpers.launch.fork as fork
from m11_helpers.launch import launch, launch_script, rank_device
from m11_helpers.tether import tethered_popen
from m11_helpers.timing import Timing, format_seconds, time_it

WORLD = 4


def work() -> float:
    x = torch.ones(1024, device=rank_device())
    dist.all_reduce(x)
    return x[0].item()


SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x = torch.ones(1024)
    dist.all_reduce(x)
    assert x[0].item() == dist.get_world_size()
    dist.destroy_process_group()
""")

CALLER = textwrap.dedent("""
    import sys, time
    from m11_helpers.tether import tethered_popen
    tethered_popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("started", flush=True)
    time.sleep(60)
""")


def once(fn) -> float:
    """One timed call, through the course's one timer."""
    return time_it(fn, repeats=1, warmup=0).samples[0]


def run_launch() -> None:
    assert launch(work, num_processes=WORLD, show_output=False) == [float(WORLD)] * WORLD


def run_torchrun(script: str) -> None:
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
                    script], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)


def run_launch_script(script: str) -> None:
    launch_script(script, num_processes=2, device="cpu", echo=False, timeout=300)


def run_accelerate(script: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                    "--main_process_port", "0", script], check=True, env=env, capture_output=True)


def orphan_lifetime() -> float:
    """Seconds from a caller's SIGKILL until nothing of its tethered tree is left."""
    caller = subprocess.Popen([sys.executable, "-c", CALLER], stdout=subprocess.PIPE, text=True)
    caller.stdout.readline()
    while len(tree := psutil.Process(caller.pid).children(recursive=True)) < 2:  # supervisor, program
        time.sleep(0.01)
    time.sleep(0.5)  # a run in progress, not one still starting
    caller.kill()
    caller.wait()
    start = time.perf_counter()
    while any(_alive(p) for p in tree) and time.perf_counter() - start < 10:
        time.sleep(0.001)
    return time.perf_counter() - start


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class _NoFreeze:
    """`gc` as the ranks see it, with `freeze` doing nothing: the launch as it was before."""

    def __getattr__(self, name):
        return (lambda: None) if name == "freeze" else getattr(gc, name)


def freeze_or_not(frozen: bool) -> tuple[float, float]:
    """One launch's wall seconds and its ranks' CPU seconds, with or without the ranks' gc.freeze()."""
    fork.gc = gc if frozen else _NoFreeze()
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = once(run_launch)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        fork.gc = gc
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = str(Path(tmp) / "allreduce.py")
        Path(script).write_text(SCRIPT)
        samples: dict[str, list[float]] = {k: [] for k in ("launch", "torchrun", "launch_script", "accelerate",
                                                           "tethered", "popen", "orphan")}
        run_launch()  # warm-up: the first launch imports torch.distributed in this process
        for _ in range(args.repeats):  # interleaved, so all see the same machine load
            samples["launch"].append(once(run_launch))
            samples["torchrun"].append(once(lambda: run_torchrun(script)))
            samples["launch_script"].append(once(lambda: run_launch_script(script)))
            samples["accelerate"].append(once(lambda: run_accelerate(script)))
            samples["tethered"].append(once(lambda: tethered_popen([sys.executable, "-c", "pass"]).wait()))
            samples["popen"].append(once(lambda: subprocess.Popen([sys.executable, "-c", "pass"]).wait()))
            samples["orphan"].append(orphan_lifetime())
        heap = [{"cell": i, "value": [i]} for i in range(300_000)]  # a notebook's objects, shared by every fork
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for frozen, key in ((True, "frozen"), (False, "unfrozen")):
                wall, used = freeze_or_not(frozen)
                samples.setdefault(key, []).append(wall)
                cpu[frozen].append(used)
        del heap
    t = {k: Timing(tuple(v)) for k, v in samples.items()}
    print(f"median of {args.repeats} rounds:")
    print(f"  m11 launch ({WORLD} ranks)   {t['launch']}")
    print(f"  torchrun                {t['torchrun']}")
    print(f"  ratio launch / torchrun = {t['launch'].median / t['torchrun'].median:.3f}  (target <= 1.3)")
    print(f"  launch_script (2 ranks) {t['launch_script']}")
    print(f"  accelerate launch       {t['accelerate']}")
    print(f"  ratio launch_script / accelerate launch = "
          f"{t['launch_script'].median / t['accelerate'].median:.3f}  (target <= 1.1)")
    print(f"  python -c pass, tethered {t['tethered']}; plain Popen {t['popen']}; "
          f"the supervisor adds {format_seconds(t['tethered'].median - t['popen'].median)}")
    print(f"  a SIGKILLed caller's tethered tree is gone {t['orphan']} after its death")
    frozen_cpu, unfrozen_cpu = (sorted(cpu[k])[len(cpu[k]) // 2] for k in (True, False))
    print(f"  launch, ranks gc.freeze() first   {t['frozen']}, ranks' CPU {frozen_cpu:.2f} s")
    print(f"  launch, ranks collect the heap    {t['unfrozen']}, ranks' CPU {unfrozen_cpu:.2f} s")
    print(f"  ratio unfrozen / frozen = {t['unfrozen'].median / t['frozen'].median:.2f} (wall), "
          f"{unfrozen_cpu / max(frozen_cpu, 1e-3):.1f} (CPU)")


if __name__ == "__main__":
    main()
