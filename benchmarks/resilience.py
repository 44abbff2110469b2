"""Resilience without restarts, measured: live recovery against a checkpoint restart, and DiLoCo against data parallel.

    python benchmarks/resilience.py                  # both parts (minutes on 2 busy cores)
    python benchmarks/resilience.py --part recovery  # or --part diloco

1. Lesson 10's two drills on 3 real processes of the same training (the tiny GPT, 12 sequences per
   step): live_recovery_drill (SIGKILL a replica, survivors re-form, a spare rejoins) and
   restart_drill (SIGKILL a rank, the job dies, relaunch from a checkpoint every 4 steps). Prints the
   seconds lost from the kill until the killed step is done again, side by side, in step times too,
   and the restart again with the cost of one fresh interpreter importing torch added (the relaunch
   here forks a warm one; a cluster restart also waits for the scheduler and NCCL set-up).
2. DiLoCo on 4 ranks against data parallel on the same rows (m11_helpers.diloco.compare_rank):
   payload and wire bytes each rank all-reduced (the kit's CommCounter), the ratio to data parallel (1/H),
   and the held-out loss after the same tokens, for H = 1, 4, 16.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from m11_helpers.diloco import compare_rank
from m11_helpers.launch import launch
from m11_helpers.live_recovery import live_recovery_drill
from m11_helpers.restart_drill import restart_drill

MB = 1e6


def recovery() -> None:
    live = live_recovery_drill(replicas=3, steps=30, kill_at=7, rejoin_after=4, timeout=300)
    with tempfile.TemporaryDirectory() as d:
        restart = restart_drill(d, ranks=3, steps=16, kill_at=7, every=4, timeout=300)
    print(f"{'':34s}{'live recovery':>15s}{'restart':>10s}")
    print(f"{'dead rank noticed after (s)':34s}{live['detect_s']:>15.2f}{restart['detect_s']:>10.2f}")
    print(f"{'killed step done again after (s)':34s}{live['recovery_s']:>15.2f}{restart['lost_s']:>10.2f}")
    print(f"{'median step (s)':34s}{live['step_s']:>15.2f}{restart['step_s']:>10.2f}")
    print(f"{'lost, in steps':34s}{live['recovery_s'] / live['step_s']:>15.1f}{restart['lost_s'] / restart['step_s']:>10.1f}")
    print(f"{'steps redone':34s}{0:>15d}{restart['redone_steps']:>10d}")
    t0 = time.perf_counter()  # what the forked relaunch does not pay: a fresh interpreter importing torch
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True)
    fresh = time.perf_counter() - t0
    print(f"{'+ fresh processes (import torch)':34s}{'':>15s}{restart['lost_s'] + fresh:>10.2f}")
    print(f"restart ÷ live: {restart['lost_s'] / live['recovery_s']:.1f}× the time lost "
          f"({(restart['lost_s'] + fresh) / live['recovery_s']:.1f}× with fresh processes); the spare joined in "
          f"{live['join_wait_s']:.2f} s and cost the others {live['join_stall_s']:.2f} s of one step; "
          f"bit-identical: {len(set(live['checksums'].values())) == 1}")


def diloco(steps: int = 32, hs: tuple[int, ...] = (1, 4, 16)) -> None:
    runs = launch(compare_rank, steps=steps, hs=hs, num_processes=4, timeout=600)[0]
    base = runs[0]["bytes"]
    print(f"\n{'method':18s}{'H':>4s}{'payload MB/rank':>16s}{'wire MB/rank':>14s}{'÷ data parallel':>17s}"
          f"{'held-out loss':>15s}")
    for r in runs:
        print(f"{r['method']:18s}{r['h']:>4d}{r['bytes'] / MB:>16.2f}{r['wire'] / MB:>14.2f}{r['bytes'] / base:>17.3f}"
              f"{r['eval_loss']:>15.3f}")
    print(f"(same {steps} steps × 16 sequences for every run; fp32; wire = a ring's 2(N−1)/N of the payload)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("recovery", "diloco", "both"), default="both")
    part = ap.parse_args().part
    if part in ("recovery", "both"):
        recovery()
    if part in ("diloco", "both"):
        diloco()
