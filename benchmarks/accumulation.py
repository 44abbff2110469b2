"""Gradient accumulation under DDP: one optimizer step of K micro-batches, with and without no_sync, side by side.

    python benchmarks/accumulation.py [--repeats 7] [--ranks 2]

Lesson 07's claim, measured: `no_sync` skips K−1 of every K all-reduces, so the step gets cheaper as K
grows (the forward/backward work is the same either way). On gloo within one machine an all-reduce of
the course MLP's 22 KB is a memory copy plus a rendezvous, so the ratio here is the latency part only;
on a cluster each skipped all-reduce moves the whole gradient over the network (the lesson gives the
7B's bytes). Medians through `m11_helpers.timing.time_it`; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os

import torch

from m11_helpers.gradient_accumulation import no_sync_step_times
from m11_helpers.launch import launch
from m11_helpers.timing import format_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}, course MLP, {args.ranks} ranks (gloo)\n")
    print("    K  with no_sync  all-reduce every micro-batch  ratio")
    for k in (1, 2, 4, 8, 16):
        t = launch(no_sync_step_times, k, repeats=args.repeats, num_processes=args.ranks, show_output=False)[0]
        print(f"{k:>5}  {format_seconds(t['no_sync']):>12}  {format_seconds(t['every micro-batch']):>28}"
              f"  {t['every micro-batch'] / t['no_sync']:.2f}×")


if __name__ == "__main__":
    main()
