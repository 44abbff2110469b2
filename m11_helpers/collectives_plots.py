"""Lesson 02's pictures: the ring's schedule drawn from the ranks' own traces, and the α–β model over N.

    traces = [...]                       # one list per rank, from ring_all_reduce(t, trace=trace)
    plot_ring(traces)                    # one panel per step: whose data each chunk holds
    plot_scaling(sizes, ns, link)        # ring and binomial-tree time over N, per message size

Drawing only: every number comes from the traces or from `m11_helpers.comm_model`.
"""

from __future__ import annotations

import numpy as np

from m11_helpers import comm_model as cm

__all__ = ["plot_ring", "plot_scaling"]


def plot_ring(traces: list[list[dict]]):
    """One panel per step: rows = ranks, columns = chunks, the text lists whose data the chunk holds.

    Rank r must have started with 2**r in every element, so a chunk's value *is* the set of ranks summed.
    """
    import matplotlib.pyplot as plt

    n, steps = len(traces), len(traces[0])
    fig, axes = plt.subplots(1, steps + 1, figsize=(2.0 * (steps + 1), 2.3), sharey=True)
    start = [[2.0**r] * n for r in range(n)]  # before step 0, rank r holds only its own data (value 2^r)
    for k, ax in enumerate(axes):
        values = start if k == 0 else [t[k - 1]["values"] for t in traces]
        who = [[[b for b in range(n) if int(v) >> b & 1] for v in row] for row in values]
        ax.imshow([[len(w) for w in row] for row in who], cmap="Blues", vmin=0, vmax=n + 1)
        for r in range(n):
            for c in range(n):
                ax.text(c, r, "".join(map(str, who[r][c])), ha="center", va="center", fontsize=8)
            if k:  # the chunk this rank just received
                ax.add_patch(plt.Rectangle((traces[r][k - 1]["received"] - 0.5, r - 0.5), 1, 1, fill=False,
                                           edgecolor="crimson", lw=2))
        phase = "RS" if k and traces[0][k - 1]["phase"] == "reduce-scatter" else "AG"
        ax.set_title("start" if k == 0 else f"{phase} step {traces[0][k - 1]['step']}", fontsize=9)
        ax.set_xticks(range(n)), ax.set_yticks(range(n)), ax.grid(False)
        ax.set_xlabel("chunk", fontsize=8)
    axes[0].set_ylabel("rank")
    fig.suptitle(f"Ring all-reduce on {n} processes: whose data each chunk holds (red: just received)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_scaling(sizes: dict[str, float], ns: list[int], link: cm.Link, ax=None):
    """Ring and binomial-tree all-reduce time over N for each labelled size, relative to the ring at ns[0]."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.4))
    for label, size in sizes.items():
        t_ring = np.array([cm.ring_allreduce_time(size, n, link.alpha, link.beta) for n in ns])
        t_tree = np.array([cm.tree_allreduce_time(size, n, link.alpha, link.beta) for n in ns])
        line, = ax.loglog(ns, t_ring / t_ring[0], "o-", label=f"ring, {label}")
        ax.loglog(ns, t_tree / t_ring[0], "--", color=line.get_color(), alpha=0.6, label=f"binomial tree, {label}")
    ax.set(xlabel="ranks N", ylabel=f"time ÷ ring time at N = {ns[0]}",
           title=f"α–β model, {link.name} (α = {link.alpha_us:g} µs)")
    ax.legend(fontsize=7, ncol=2)
    return ax
