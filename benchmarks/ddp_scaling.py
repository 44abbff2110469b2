"""DDP on this machine: throughput at 1, 2 and 4 ranks, with and without overlap, side by side in one run.

    python benchmarks/ddp_scaling.py [--steps 10] [--batch 8]

Lesson 03's claims, measured: "DDP is N times faster minus communication" (speed-up vs ranks, and
the step with vs without its all-reduce) and "communication is hidden behind compute": the course
MLP (3.7 MB of gradients) under DDP's defaults (a 1 MiB first bucket, then 25 MiB: two buckets), with
bucket_cap_mb=25 written out (one bucket, nothing to overlap) and with 0.25 MiB (four buckets).
Prints ratios; run it on an idle machine (other programs on the cores move every number).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from m11_helpers.ddp_overlap import hidden_fraction, measure_step, record_timeline
from m11_helpers.launch import launch


def timeline_cost(cap_mb: float | None) -> tuple[float, float]:
    """Median backward time (with DDP's all-reduces) and hidden share, over iterations 1.., at one bucket cap."""
    its = record_timeline(cap_mb, iterations=8)["iterations"][1:]  # iteration 0 uses one bucket whatever the cap
    times = sorted(it["backward_s"] for it in its)
    return times[len(times) // 2], sum(hidden_fraction(it) for it in its) / len(its)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank (weak scaling)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}, tiny GPT, {args.batch} sequences per rank\n")

    rows = {}
    for n in (1, 2, 4):
        start = time.perf_counter()
        rows[n] = launch(measure_step, steps=args.steps, batch=args.batch, num_processes=n, show_output=False)[0]
        rows[n]["wall"] = time.perf_counter() - start
    base = rows[1]["samples_per_s"]
    print("ranks  step ms  no-sync ms  comm share  samples/s  speed-up  ideal")
    for n, r in rows.items():
        share = max(0.0, 1 - r["local_s"] / r["step_s"])
        print(f"{n:>5}  {r['step_s'] * 1e3:7.1f}  {r['local_s'] * 1e3:10.1f}  {share:10.0%}  {r['samples_per_s']:9.0f}"
              f"  {r['samples_per_s'] / base:7.2f}×  {n}×")

    print("\nbucket_cap_mb  backward+all-reduce ms  hidden share   (2 ranks, course MLP)")
    res = launch(lambda: {cap: timeline_cost(cap) for cap in (None, 25, 0.25)}, num_processes=2,
                 show_output=False)[0]
    for cap, (t, hidden) in res.items():
        print(f"{str(cap):>13}  {t * 1e3:22.1f}  {hidden:12.0%}")
    print(f"ratio one bucket (25 written out) / default: {res[25][0] / res[None][0]:.2f}×; "
          f"/ 0.25 MiB: {res[25][0] / res[0.25][0]:.2f}×")


if __name__ == "__main__":
    main()
