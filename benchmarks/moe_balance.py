"""Expert balancing side by side: no balancing, the auxiliary loss and DeepSeek-V3's bias, on one router and data.

    python benchmarks/moe_balance.py [--steps 40] [--alpha 0.01] [--gamma 0.01]

Prints, per method, the load imbalance (max expert load / mean) at a few steps and over the last ten, the
assignments a capacity of 1.25 drops over the run (dropless routing drops none), and the last task loss;
ratios to no balancing side by side (`m11_helpers.moe_balance.compare_balancing`). One process: the
routing decision is the same on one rank as under expert parallelism.
"""

from __future__ import annotations

import argparse
import statistics

from m11_helpers.display import show_table
from m11_helpers.moe_balance import compare_balancing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--gamma", type=float, default=0.01)
    args = ap.parse_args()
    dropless = compare_balancing(args.steps, alpha=args.alpha, gamma=args.gamma)
    capped = compare_balancing(args.steps, alpha=args.alpha, gamma=args.gamma, capacity_factor=1.25)
    last = {m: statistics.mean(r["imbalance"][-10:]) for m, r in dropless.items()}
    drops = {m: sum(r["dropped"]) for m, r in capped.items()}
    marks = sorted({0, 9, args.steps // 2, args.steps - 1})
    rows = [[m] + [f"{r['imbalance'][s]:.2f}" for s in marks] + [f"{last[m]:.2f}", f"{last[m] / last['none']:.2f}",
            drops[m], f"{drops[m] / max(drops['none'], 1):.2f}", sum(r["dropped"]), f"{r['loss'][-1]:.4f}"]
            for m, r in dropless.items()]
    show_table(rows, ["method"] + [f"step {s + 1}" for s in marks] + ["last 10", "× none", "dropped (cf 1.25)", "× none",
                                                                      "dropped (dropless)", "task loss"],
               title=f"max/mean expert load, 8 experts, top-2, 64 tokens per step, {args.steps} steps")


if __name__ == "__main__":
    main()
