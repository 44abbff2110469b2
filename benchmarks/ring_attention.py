"""Causal ring attention, contiguous chunks vs the zigzag layout, side by side in one run.

    python benchmarks/ring_attention.py                        # T = 2048, 4 ranks, 5 alternating rounds
    python benchmarks/ring_attention.py --seq 4096 --rounds 3

Lesson 12 counts the score tiles each rank computes (contiguous: rank r does r + 1 blocks; zigzag:
2N + 1 quarter-blocks everywhere). This measures what that does to time: every rank runs the same
forward + backward under both layouts, alternating every round so load from other processes hits
both alike; a step lasts as long as its slowest rank (max over ranks of each round's time). Prints
each layout's median step, each rank's own time (which includes waiting for its neighbours), and the
ratio contiguous / zigzag, next to the tile count's prediction: the ring waits for the busiest rank at
every step, so contiguous chunks cost N whole blocks and zigzag 2N + 1 quarter blocks,
`context_parallel.critical_path_tiles` — 4N/(2N + 1) = 1.78× at N = 4 when attention dominates.
Measured on the shared 2-core machine (T = 1024, 4 ranks, 3 rounds): 248 ms vs 118 ms, 2.10× (the
contiguous layout also computes its diagonal block whole, then masks it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from m11_helpers.context_parallel import LAYOUTS, critical_path_tiles, ring_attention, shard_sequence
from m11_helpers.launch import launch, rank_device


def _bench(seq: int, heads: int, dim: int, rounds: int) -> dict:
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq, dim, generator=g).to(rank_device()) for _ in range(3))  # (B, H, T, D)
    out = {lay: {"step": [], "mine": []} for lay in LAYOUTS}
    for i in range(rounds + 1):  # round 0 warms up
        for lay in LAYOUTS:
            mine = [shard_sequence(t, r, n, lay).requires_grad_() for t in (q, k, v)]
            dist.barrier()
            t0 = time.perf_counter()
            ring_attention(*mine, True, layout=lay).sum().backward()
            mine_s = time.perf_counter() - t0
            step = torch.tensor([mine_s], dtype=torch.float64, device=q.device)
            dist.all_reduce(step, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank does
            if i:
                out[lay]["step"].append(float(step))
                out[lay]["mine"].append(mine_s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    res = launch(_bench, args.seq, args.heads, args.dim, args.rounds, num_processes=args.ranks, device="cpu",
                 timeout=600, show_output=False)
    med = {}
    for lay in LAYOUTS:
        med[lay] = statistics.median(res[0][lay]["step"])
        per_rank = [statistics.median(r[lay]["mine"]) for r in res]
        print(f"{lay:>10}: step {med[lay] * 1e3:8.1f} ms (median of {args.rounds}, slowest rank); per-rank "
              f"{' '.join(f'{t * 1e3:.0f}' for t in per_rank)} ms (each includes waiting for its neighbours)")
    predicted = critical_path_tiles(args.ranks, "contiguous") / critical_path_tiles(args.ranks, "zigzag")
    print(f"contiguous / zigzag: {med['contiguous'] / med['zigzag']:.2f}× (critical path in score tiles: "
          f"{predicted:.2f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
