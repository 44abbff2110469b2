"""Ulysses against ring attention side by side on 4 real ranks: bytes each rank sends, and time, per sequence length.

    python benchmarks/ulysses_vs_ring.py [--seq 64 256 1024] [--heads 8]

Both compute causal attention of a (1, H, T, 16) q, k, v sharded by sequence over 4 ranks, forward and
backward, in one launch. Bytes are counted by each implementation (what leaves the rank) next to their
formulas (`ulysses_bytes_per_rank`, `ring_bytes_per_rank`); the ratio ring / Ulysses is N/2 = 2 at equal
K/V width. Times are medians of `time_it` on this machine: 2 shared cores, so they show the CPU's cost of
each, not a GPU cluster's link.
"""

from __future__ import annotations

import argparse

from m11_helpers.context_parallel import ring_bytes_per_rank
from m11_helpers.display import show_table
from m11_helpers.launch import launch
from m11_helpers.ulysses import ulysses_bytes_per_rank

D = 16


def _rank(seqs: list[int], heads: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from m11_helpers.context_parallel import ring_attention
    from m11_helpers.timing import time_it
    from m11_helpers.ulysses import ulysses_attention

    n = dist.get_world_size()
    out = []
    for t in seqs:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, t // n, D, generator=g).requires_grad_(True) for _ in range(3))
        for name, fn in (("ulysses", ulysses_attention), ("ring", ring_attention)):
            stats: dict = {}
            fn(q, k, v, causal=True, stats=stats).sum().backward()
            timing = time_it(lambda: (fn(q, k, v, causal=True).sum().backward(), dist.barrier()), repeats=3)
            out.append({"impl": name, "seq": t, "fwd": stats["bytes_sent"], "bwd": stats["bytes_sent_backward"],
                        "ms": timing.median * 1e3})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--heads", type=int, default=8)
    args = ap.parse_args()
    res = launch(_rank, args.seq, args.heads, num_processes=4, timeout=600, show_output=False)[1]
    rows = []
    for t in args.seq:
        u, r = (next(x for x in res if x["seq"] == t and x["impl"] == i) for i in ("ulysses", "ring"))
        fu = ulysses_bytes_per_rank(t, 4, args.heads * D, dtype_bytes=4)["forward"]
        fr = ring_bytes_per_rank(t, 4, args.heads * D, dtype_bytes=4)["forward"]
        rows.append([t, round(u["fwd"]), round(fu), round(r["fwd"]), round(fr), f"{r['fwd'] / u['fwd']:.2f}",
                     round(u["bwd"]), round(r["bwd"]), f"{u['ms']:.1f}", f"{r['ms']:.1f}", f"{r['ms'] / u['ms']:.2f}"])
    show_table(rows, ["T", "Ulysses fwd B", "formula", "ring fwd B", "formula", "ring/Ulysses", "Ulysses bwd B",
                      "ring bwd B", "Ulysses ms", "ring ms", "ring/Ulysses"],
               title=f"4 ranks, {args.heads} heads × {D}, fp32, per rank (rank 1)")


if __name__ == "__main__":
    main()
