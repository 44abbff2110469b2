"""Ring all-reduce (ours, point-to-point send/recv) vs the backend's own all-reduce, side by side in one run.

    python benchmarks/collectives.py                    # 64 MB, 4 ranks, 5 alternating rounds
    python benchmarks/collectives.py --mb 16 --ranks 2 --rounds 3

Both implementations run in the same processes, alternating every round, so load from other
processes on the machine hits both alike. Prints algorithm and bus bandwidth (nccl-tests
definitions: busbw = algbw · 2(N-1)/N) and the ratio ours / backend. Target: >= 0.8.
The ceiling: one thread's copy rate in the same ranks, all at once (lesson 01's
`hardware.copy_bandwidth` counts read + write, 2S/t; a copy of S bytes runs at half that, S/t).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.distributed as dist

from m11_helpers import comm_model as cm
from m11_helpers.collectives import IMPLEMENTATIONS, ring_all_reduce, time_collective
from m11_helpers.hardware import copy_bandwidth
from m11_helpers.launch import launch, launch_plan, rank_device


def _bench(nbytes: int, rounds: int) -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((nbytes // 4,), float(rank + 1), device=rank_device())  # (S/4,) float32
    y = x.clone()
    ring_all_reduce(y)
    assert bool((y == n * (n + 1) / 2).all()), "ring all-reduce is wrong"  # correct before timing it
    times: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
    for _ in range(rounds):
        for name, op in IMPLEMENTATIONS.items():
            times[name] += time_collective(op, x, iters=1, warmup=0 if times[name] else 1)
    dist.barrier()
    return {"times": times, "memcpy": copy_bandwidth(nbytes, repeats=5) / 2}  # S/t of one copy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64.0, help="message size in MiB (default 64)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    nbytes = int(args.mb * 2**20) // 4 * 4
    res = launch(_bench, nbytes, args.rounds, num_processes=args.ranks, device="cpu", timeout=900, show_output=False)
    n = args.ranks
    print(f"all-reduce of {nbytes / 2**20:g} MiB float32 on {launch_plan(n, 'cpu')}, {args.rounds} alternating rounds, median:")
    bus = {}
    for name, ts in res[0]["times"].items():
        t = statistics.median(ts)
        bus[name] = cm.busbw("all_reduce", nbytes, t, n)
        print(f"  {name:<12} {t * 1e3:9.1f} ms   algbw {cm.algbw(nbytes, t) / 1e9:6.3f} GB/s   "
              f"busbw {bus[name] / 1e9:6.3f} GB/s   (all rounds: {', '.join(f'{x * 1e3:.0f}' for x in ts)} ms)")
    memcpy = min(r["memcpy"] for r in res)
    ratio = bus["ring (ours)"] / bus["backend"]
    times = res[0]["times"]
    best = min(times["backend"]) / min(times["ring (ours)"])  # least-disturbed round of each
    print(f"  copy rate S/t, one thread per rank, all ranks at once: {memcpy / 1e9:.3f} GB/s (ceiling)")
    print(f"  ratio ours / backend busbw: {ratio:.2f} of medians, {best:.2f} of best rounds  "
          f"(target >= 0.8: {'met' if min(ratio, best) >= 0.8 else 'NOT met' if max(ratio, best) < 0.8 else 'unclear: noisy machine'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
