"""The latency–bandwidth (α–β) cost model of collectives, bus bandwidth, and fitting α, β to timings (lesson 02).

A message of S bytes between two ranks costs α + S·β: α is the per-message latency (seconds), β the
inverse bandwidth (seconds per byte). Algorithms differ in how many such steps they take and how
many bytes each carries (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1), §2 "Cost model"; Patarasuk & Yuan
2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2)).

    ring_allreduce_time(S, n, alpha, beta)   = 2(n-1)·α + 2(n-1)/n · S·β
    tree_allreduce_time(S, n, alpha, beta)   = 2⌈log2 n⌉·(α + S·β)          (binomial reduce + broadcast)
    in_network_allreduce_time(S, n, α, β)    = 2α + S·β                      (the switch adds: NVLS, SHARP)
    crossover_bytes(n, alpha, beta)          message size where the two are equal
    half_bandwidth_bytes(n, alpha, beta)     the size where the ring reaches half its peak busbw (n·α/β)

The "tree" here is the textbook *binomial* tree. NCCL's tree is a different algorithm: a pipelined
*double binary* tree across nodes, a chain inside each node (Jeaugey, "Massively Scale Your Deep Learning
Training with NCCL 2.4", NVIDIA blog 2019; Sanders, Speck & Träff 2009): log-latency AND close to full
bandwidth, which a binomial tree (every step carries the whole message) cannot reach.

Across nodes (`Fabric`): a node of g GPUs has one or several NICs. NCCL runs one ring per NIC (a
*rail*: NIC k of every node on one switch plane), each carrying 1/rails of the data, so a flat ring over
nodes·g GPUs crosses the network at rails × the NIC bandwidth (DGX/HGX H100: 8 × 400 Gb/s).

In-network reduction: NVLink SHARP ("NVLS", an NVSwitch that adds, inside one NVLink domain) and InfiniBand
SHARP (the IB switches add, across nodes) are NCCL's all-reduce offloads (NCCL documentation, environment
variable NCCL_NVLS_ENABLE; NVIDIA HPC-X documentation, "NCCL-RDMA-SHARP Plugins": NCCL_COLLNET_ENABLE). Each rank then sends its S once and receives
the sum once, below the ring's 2(n−1)/n·S: Patarasuk & Yuan's bound is for algorithms whose ranks add.

Bus bandwidth follows nccl-tests (NVIDIA, `doc/PERFORMANCE.md`): algbw = S / t, and busbw =
algbw × a factor that makes the number comparable with the link's peak whatever n is.
"""

from __future__ import annotations

import dataclasses
import math

from m11_helpers.hardware_specs import IB_400G, NVLINK_H100, Link  # the one Link type; re-exported for lesson 02
from m11_helpers.validate import non_negative_real, one_of, positive_int, positive_real

__all__ = ["COLLECTIVES", "bus_factor", "algbw", "busbw", "ring_allreduce_time", "tree_allreduce_time",
           "in_network_allreduce_time",
           "ring_bytes_sent", "crossover_bytes", "half_bandwidth_bytes", "fit_alpha_beta", "explore",
           "NVLINK_H100", "IB_400G", "Link", "Fabric", "FABRICS", "HGX_H100", "ONE_NIC_H100",
           "cluster_allreduce_time", "inter_node_bytes", "RING_OPS", "ring_collective_time",
           "cluster_collective_time", "group_link"]

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


def in_network_allreduce_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """T_switch = 2α + S·β: each rank sends S up once and receives the reduced S once (NVLink SHARP, IB SHARP).

    A model of an ideal switch that adds at line rate: it beats the ring's 2(n-1)/n·S·β on bytes for n > 2
    and its 2(n-1)·α on latency for n ≥ 2. Patarasuk & Yuan's bound assumes the ranks do the additions.
    """
    positive_int("n", n)
    for name, v in (("nbytes", nbytes), ("alpha", alpha), ("beta", beta)):
        non_negative_real(name, v)
    return 2 * alpha + nbytes * beta


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


def half_bandwidth_bytes(n: int, alpha: float, beta: float) -> float:
    """S½ = n·α/β: the ring all-reduce's busbw = 1/(nα/S + β) is half its peak 1/β there (Hockney's n½, 1994)."""
    positive_int("n", n)
    non_negative_real("alpha", alpha)
    positive_real("beta", beta)
    return n * alpha / beta


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


# ----------------------------------------------------------------------------------------------
# Across nodes: NICs per node, rails, and the all-reduce of a multi-node data-parallel group
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fabric:
    """Nodes of `gpus` GPUs joined by `intra` (NVLink), each node with `nics` NICs of `nic` (one port each)."""

    name: str
    gpus: int  # GPUs per node
    intra: Link  # inside a node, per GPU
    nic: Link  # one NIC port, per direction
    nics: int  # NICs per node used for the collectives
    source: str

    def __post_init__(self) -> None:
        positive_int(f"{self.name}: gpus", self.gpus)
        positive_int(f"{self.name}: nics", self.nics)

    @property
    def rails(self) -> int:
        """Rings NCCL can drive through distinct NICs at once: one per NIC, at most one per GPU."""
        return min(self.nics, self.gpus)

    def network_bandwidth(self) -> float:
        """Bytes/s per direction one node puts on the network: rails × one NIC."""
        return self.rails * self.nic.bandwidth

    def rail_link(self) -> Link:
        """What one GPU gets of the network when every GPU talks across nodes at once: nics·B_nic / gpus."""
        share = self.nics * self.nic.gbs_per_direction / self.gpus
        return Link(f"{self.name}: network per GPU", share, f"{self.nics} × {self.nic.name} shared by "
                    f"{self.gpus} GPUs; {self.source}", alpha_us=self.nic.alpha_us)


HGX_H100 = Fabric("HGX/DGX H100, one 400 Gb/s NIC per GPU (8 rails)", 8, NVLINK_H100, IB_400G, 8,
                  "NVIDIA DGX H100 User Guide, §1.2.3 'Network Modules' (8 ConnectX-7, one per GPU); NVIDIA "
                  "DGX SuperPOD reference architecture (DGX H100): rail-optimised compute fabric")
ONE_NIC_H100 = Fabric("8 × H100 per node, one 400 Gb/s NIC per node", 8, NVLINK_H100, IB_400G, 1,
                      "a node with a single compute NIC (as in many cloud and on-premises builds)")
FABRICS = {f.name: f for f in (HGX_H100, ONE_NIC_H100)}

ALGORITHMS = ("ring", "hierarchical")


def cluster_allreduce_time(nbytes: float, nodes: int, fabric: Fabric, algorithm: str = "ring") -> float:
    """α–β all-reduce of S bytes over nodes·g GPUs of `fabric`.

    ring: one flat ring per rail, each with S/rails, N = nodes·g:
        2(N-1)·α + 2(N-1)/N · S · max(β_intra, 1/(rails·B_nic))   (the NVLink side bounded by one full ring)
    hierarchical: reduce-scatter in the node, all-reduce of each GPU's S/g across nodes on its rail, all-gather:
        2·[(g-1)α_intra + (g-1)/g·S·β_intra] + 2(nodes-1)α + 2(nodes-1)/nodes · (S/g) / (nics·B_nic/g)
    One node: a ring over NVLink. Sources: Patarasuk & Yuan 2009 (ring); NCCL's rings per NIC (module docstring).
    """
    non_negative_real("nbytes", nbytes)
    positive_int("nodes", nodes)
    one_of("algorithm", algorithm, ALGORITHMS)
    g = fabric.gpus
    if nodes == 1:
        return ring_allreduce_time(nbytes, g, fabric.intra.alpha, fabric.intra.beta)
    if algorithm == "ring":
        n = nodes * g
        beta = max(fabric.intra.beta, 1 / fabric.network_bandwidth())
        return ring_allreduce_time(nbytes, n, max(fabric.intra.alpha, fabric.nic.alpha), beta)
    inside = ring_allreduce_time(nbytes, g, fabric.intra.alpha, fabric.intra.beta)  # = reduce-scatter + all-gather
    rail = fabric.rail_link()
    return inside + ring_allreduce_time(nbytes / g, nodes, rail.alpha, rail.beta)


def inter_node_bytes(nbytes: float, nodes: int, gpus: int, algorithm: str = "ring") -> float:
    """Bytes one node sends to the network per all-reduce of S bytes over nodes·g GPUs.

    ring: every ring leaves the node once, carrying 2(N-1)/N of its share: 2(N-1)/N · S in all.
    hierarchical: each GPU sends 2(nodes-1)/nodes of its S/g: 2(nodes-1)/nodes · S in all.
    """
    non_negative_real("nbytes", nbytes)
    positive_int("nodes", nodes)
    positive_int("gpus", gpus)
    one_of("algorithm", algorithm, ALGORITHMS)
    if nodes == 1:
        return 0.0
    if algorithm == "ring":
        return ring_bytes_sent(nbytes, nodes * gpus)
    return ring_bytes_sent(nbytes, nodes)


# ----------------------------------------------------------------------------------------------
# Added for lessons 04 and 12 (FSDP/HSDP/TP across nodes): the ring's halves, and a group's share of the rails
# ----------------------------------------------------------------------------------------------

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def ring_collective_time(op: str, nbytes: float, n: int, alpha: float, beta: float) -> float:
    """Ring all-reduce 2(n-1)·α + 2(n-1)/n·S·β; all-gather and reduce-scatter are its halves, (n-1)·α + (n-1)/n·S·β
    (S = the full tensor; Patarasuk & Yuan 2009)."""
    one_of("op", op, RING_OPS)
    t = ring_allreduce_time(nbytes, n, alpha, beta)
    return t if op == "all_reduce" else t / 2


def cluster_collective_time(op: str, nbytes: float, nodes: int, fabric: Fabric, algorithm: str = "ring") -> float:
    """`cluster_allreduce_time` for an all-reduce; all-gather and reduce-scatter are half of it (each half of the
    ring, or of each stage of the hierarchical algorithm, moves half the bytes in half the steps)."""
    one_of("op", op, RING_OPS)
    t = cluster_allreduce_time(nbytes, nodes, fabric, algorithm)
    return t if op == "all_reduce" else t / 2


def group_link(fabric: Fabric, per_node: int) -> Link:
    """The link one GPU of a group gets when the group spans nodes with `per_node` of its GPUs on each, and every GPU
    of the node communicates at once (one such group per GPU of the node: DP beside TP, CP, EP):
    min(NVLink, per_node · rails·B_nic / g). per_node = g is a flat ring's `network_bandwidth`; per_node = 1
    (one GPU per node: the group's traffic rides its own rail) is `rail_link`'s share."""
    positive_int("per_node", per_node)
    if per_node > fabric.gpus:
        raise ValueError(f"per_node must be at most the GPUs per node ({fabric.gpus}), got {per_node}")
    share = per_node * fabric.network_bandwidth() / fabric.gpus / 1e9
    gbs = min(fabric.intra.gbs_per_direction, share)
    return Link(f"{fabric.name}: {per_node} of the group's GPUs per node", gbs,
                f"{per_node} × (rails × {fabric.nic.name}) / {fabric.gpus} GPUs, at most NVLink; {fabric.source}",
                alpha_us=max(fabric.intra.alpha_us, fabric.nic.alpha_us))
