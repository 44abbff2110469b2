"""The latency–bandwidth (α–β) cost model of collectives, bus bandwidth, and fitting α, β to timings.

A message of S bytes between two ranks costs α + S·β: α is the per-message latency (seconds), β the
inverse bandwidth (seconds per byte). Algorithms differ in how many such steps they take and how
many bytes each carries (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1), §2 "Cost model"; Patarasuk & Yuan
2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2)).

    ring_allreduce_time(S, n, alpha, beta)   = 2(n-1)·α + 2(n-1)/n · S·β
    tree_allreduce_time(S, n, alpha, beta)   = 2⌈log2 n⌉·(α + S·β)          (binomial reduce + broadcast)
    crossover_bytes(n, alpha, beta)          message size where the two are equal

Bus bandwidth follows nccl-tests (NVIDIA, `doc/PERFORMANCE.md`): algbw = S / t, and busbw =
algbw × a factor that makes the number comparable with the link's peak whatever n is.
"""

from __future__ import annotations

import math

from m11_helpers.hardware_specs import IB_400G, NVLINK_H100, Link  # the one Link type; re-exported for lesson 02
from m11_helpers.validate import non_negative_real, one_of, positive_int, positive_real

__all__ = ["COLLECTIVES", "bus_factor", "algbw", "busbw", "ring_allreduce_time", "tree_allreduce_time",
           "ring_bytes_sent", "crossover_bytes", "fit_alpha_beta", "explore", "NVLINK_H100", "IB_400G",
           "Link"]

# nccl-tests doc/PERFORMANCE.md, "Bus bandwidth": the factor busbw/algbw for each collective.
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw: all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce 1.

    Source: nccl-tests, doc/PERFORMANCE.md ("Bus bandwidth"). For reduce_scatter and all_gather
    nccl-tests' S is the *full* (gathered) size, n times the per-rank chunk.
    """
    positive_int("n", n)
    one_of("collective", collective, COLLECTIVES)
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce


def algbw(nbytes: float, seconds: float) -> float:
    """algbw = S / t in bytes per second (nccl-tests)."""
    non_negative_real("nbytes", nbytes)
    positive_real("seconds", seconds)
    return nbytes / seconds


def busbw(collective: str, nbytes: float, seconds: float, n: int) -> float:
    """busbw = algbw · bus_factor(collective, n): comparable with the link's peak for any n (nccl-tests)."""
    return algbw(nbytes, seconds) * bus_factor(collective, n)


def ring_bytes_sent(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce: 2(n-1)·S/n, below 2S for every n (Patarasuk & Yuan 2009: the lower bound)."""
    positive_int("n", n)
    non_negative_real("nbytes", nbytes)
    return 2 * (n - 1) * nbytes / n


def ring_allreduce_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """T_ring = 2(n-1)·α + 2(n-1)/n · S·β: reduce-scatter then all-gather (Patarasuk & Yuan 2009)."""
    positive_int("n", n)
    for name, v in (("nbytes", nbytes), ("alpha", alpha), ("beta", beta)):
        non_negative_real(name, v)
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def tree_allreduce_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """T_tree = 2⌈log2 n⌉·(α + S·β): binomial-tree reduce, then binomial broadcast (Thakur et al. 2005).

    Latency grows as log n instead of n, but every step carries the whole message.
    """
    positive_int("n", n)
    for name, v in (("nbytes", nbytes), ("alpha", alpha), ("beta", beta)):
        non_negative_real(name, v)
    return 2 * math.ceil(math.log2(n)) * (alpha + nbytes * beta)


def crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """S* with T_ring(S*) = T_tree(S*): S* = α(n-1-L) / (β(L-(n-1)/n)), L = ⌈log2 n⌉; tree wins below S*.

    0.0 when the ring is never slower (n <= 2, or α = 0).
    """
    positive_int("n", n)
    non_negative_real("alpha", alpha)
    positive_real("beta", beta)
    L = math.ceil(math.log2(n)) if n > 1 else 0
    latency_gap = (n - 1) - L  # extra α steps the ring takes: >= 0 for every n
    bandwidth_gap = L - (n - 1) / n  # extra S·β the tree pays: > 0 for n >= 2
    if n <= 2 or latency_gap <= 0 or bandwidth_gap <= 0:
        return 0.0
    return alpha * latency_gap / (beta * bandwidth_gap)


def fit_alpha_beta(sizes, seconds, n: int, collective: str = "all_reduce") -> tuple[float, float]:
    """Fit t = steps·α + bus_factor·S·β by least squares on *relative* error; returns (α, β) >= 0.

    steps = 2(n-1) for a ring all-reduce, n-1 for reduce-scatter / all-gather (the ring's latency
    term). Relative error, because timings span several orders of magnitude and the small ones
    carry α.
    """
    import numpy as np

    positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2 to fit a collective (one rank sends nothing), got {n}")
    S, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    if S.shape != t.shape or S.ndim != 1 or len(S) < 2:
        raise ValueError(f"sizes and seconds must be 1-D of the same length >= 2, got {S.shape} and {t.shape}")
    if (t <= 0).any() or (S < 0).any():
        raise ValueError("seconds must be > 0 and sizes >= 0")
    steps = 2 * (n - 1) if collective == "all_reduce" else n - 1
    factor = bus_factor(collective, n)
    A = np.stack([np.full_like(S, steps), factor * S], axis=1) / t[:, None]  # rows scaled by 1/t
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if a < 0:  # no measurable latency: fit bandwidth alone
        a, b = 0.0, float(np.sum(factor * S / t) / np.sum((factor * S / t) ** 2))
    if b < 0:  # no measurable bandwidth term: latency alone
        a, b = float(np.sum(steps / t) / np.sum((steps / t) ** 2)), 0.0
    return float(a), float(b)


def explore(n: int, nbytes: float, alpha: float, beta: float) -> dict:
    """What the α–β lab shows: ring and tree time at S, the crossover S*, and which one wins."""
    ring = ring_allreduce_time(nbytes, n, alpha, beta)
    tree = tree_allreduce_time(nbytes, n, alpha, beta)
    return {"ring_s": ring, "tree_s": tree, "crossover_bytes": crossover_bytes(n, alpha, beta),
            "winner": "ring" if ring <= tree else "tree",
            "ring_latency_share": 2 * (n - 1) * alpha / ring if ring > 0 else 0.0}
