"""Launch overhead: M11's `launch` against a bare `torchrun` of the same function, 4 processes.

    python benchmarks/launch_overhead.py [--repeats 3]

Both run the same work (init the process group, one all-reduce, tear down) on 4 ranks, side by side
in one run; the script prints each one's median wall time and the ratio launch / torchrun. The
course's target is a ratio ≤ 1.3. `launch` forks from a warm interpreter (torch already imported);
torchrun starts fresh interpreters, each importing torch — which is what a learner would otherwise
pay from a notebook.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch
import torch.distributed as dist

from m11_helpers.launch import launch

WORLD = 4


def work() -> float:
    x = torch.ones(1024)
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


def time_launch() -> float:
    start = time.perf_counter()
    assert launch(work, num_processes=WORLD, show_output=False) == [float(WORLD)] * WORLD
    return time.perf_counter() - start


def time_torchrun(script: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
                    script], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(SCRIPT)
    try:
        ours, bare = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            ours.append(time_launch())
            bare.append(time_torchrun(f.name))
    finally:
        os.unlink(f.name)
    a, b = statistics.median(ours), statistics.median(bare)
    print(f"{WORLD} ranks, median of {args.repeats}:")
    print(f"  m11 launch   {a:7.3f} s")
    print(f"  torchrun     {b:7.3f} s")
    print(f"  ratio launch / torchrun = {a / b:.3f}  (target <= 1.3)")


if __name__ == "__main__":
    main()
