"""Overlap arithmetic: per-layer compute time against the communication that must hide behind it (lesson 04).

    fsdp_overlap(RUNNING_EXAMPLE, tokens=4096, world=64, link=HGX_H100, flops=0.4 * 989.4e12)
    tp_overlap(RUNNING_EXAMPLE, tokens=4096, tp=8, link=NVLINK_H100, flops=...)
    cp_overlap(RUNNING_EXAMPLE, chunk=8192, cp=16, link=IB_400G, flops=...)
    min_tokens("fsdp", RUNNING_EXAMPLE, n=64, link=HGX_H100, flops=...)   # the rule of thumb

Each returns seconds of compute and of communication *per layer* and whether the communication hides
(comm ≤ compute, the two running concurrently). Compute is 2 FLOPs per parameter per token forward
and twice that backward (Kaplan et al. 2020, §2.1), plus attention's 4·s·h per token forward (QKᵀ
and PV: Narayanan et al. 2021, §5.1, 24·B·s·h² + 4·B·s²·h per layer forward; half of the s² term under
a causal mask), at `flops` = peak × the MFU you expect. Communication is lesson 02's α–β ring
(`comm_model.ring_collective_time`: all-gather/reduce-scatter (n−1)α + (n−1)/n·S/B, all-reduce twice that).

`link` is either a `Link` (every hop of the ring at that per-GPU rate: one node, or one NIC per rank) or a
`comm_model.Fabric`: n GPUs filling whole nodes, NCCL's one ring per rail (`comm_model.group_link`). A
64-GPU FSDP ring on 8 HGX H100 nodes runs at min(NVLink, 8 × 50 GB/s) = 400 GB/s per GPU, not one NIC's 50.

- FSDP (Zhao et al. 2023, §3.3 prefetch): layer i+1's all-gather runs during layer i's forward; in
  backward, an all-gather and a reduce-scatter per layer. Compute grows with tokens, communication
  does not: there is a minimum number of tokens per GPU.
- TP (Shoeybi et al. 2019, §3): 2 all-reduces of tokens·h per layer forward, 2 backward — both grow
  with tokens, so the ratio is fixed by h, t and the link: no token count hides it (it sits on the
  critical path unless a framework overlaps it with other work).
- CP ring (Liu et al. 2023, §3): each step sends one K/V chunk (2·c·h_kv) while computing one
  (c × c) attention tile: compute ∝ c², communication ∝ c — a minimum chunk length per GPU.
Used by lessons 04, 05 and 12. Estimates from formulas, not measurements.
"""

from __future__ import annotations

import dataclasses
import math

from m11_helpers.comm_model import Fabric, group_link, ring_collective_time
from m11_helpers.config import TransformerConfig, layer_flops, layer_params  # the kit's per-layer counts
from m11_helpers.hardware_specs import Link
from m11_helpers.validate import fraction, one_of, positive_int, positive_real

__all__ = ["Overlap", "layer_params", "layer_flops", "ring_link", "fsdp_overlap", "tp_overlap", "cp_overlap",
           "min_tokens", "overlap_curves"]


@dataclasses.dataclass(frozen=True)
class Overlap:
    """Per-layer seconds of compute and communication for one step direction pair (forward + backward)."""

    kind: str
    compute_s: float
    comm_s: float

    @property
    def hidden(self) -> bool:
        return self.comm_s <= self.compute_s

    @property
    def exposed_s(self) -> float:
        """Communication left over once the compute it overlaps has finished."""
        return max(0.0, self.comm_s - self.compute_s)

    @property
    def ratio(self) -> float:
        """comm / compute: ≤ 1 means it hides."""
        return self.comm_s / self.compute_s if self.compute_s > 0 else math.inf


def ring_link(link: Link | Fabric, n: int) -> Link:
    """The per-GPU link of a ring over n GPUs: a Link as given; a Fabric's NVLink inside one node, else its rails
    (n GPUs filling n/g nodes: `comm_model.group_link(fabric, g)`)."""
    positive_int("n", n)
    if not isinstance(link, Fabric):
        return link
    if n <= link.gpus:
        return link.intra
    if n % link.gpus:
        raise ValueError(f"n ({n}) must fill whole nodes of {link.gpus} GPUs on {link.name}")
    return group_link(link, link.gpus)


def _ring(op: str, nbytes: float, n: int, link: Link | Fabric) -> float:
    if n == 1:
        return 0.0
    ln = ring_link(link, n)
    return ring_collective_time(op, nbytes, n, ln.alpha, ln.beta)


def fsdp_overlap(cfg: TransformerConfig, tokens: float, world: int, link: Link | Fabric, flops: float,
                 dtype_bytes: int = 2) -> Overlap:
    """Per layer: compute 3·layer_flops vs all-gather (forward) + all-gather + reduce-scatter (backward) of P_layer."""
    positive_int("world", world)
    positive_real("flops", flops)
    positive_int("dtype_bytes", dtype_bytes)
    p = layer_params(cfg) * dtype_bytes
    comm = 2 * _ring("all_gather", p, world, link) + _ring("reduce_scatter", p, world, link)
    return Overlap("FSDP", 3 * layer_flops(cfg, tokens) / flops, comm)


def tp_overlap(cfg: TransformerConfig, tokens: float, tp: int, link: Link | Fabric, flops: float,
               dtype_bytes: int = 2) -> Overlap:
    """Per layer: compute 3·layer_flops/t vs 4 ring all-reduces of tokens·h·bytes (2 forward, 2 backward)."""
    positive_int("tp", tp)
    positive_real("flops", flops)
    positive_int("dtype_bytes", dtype_bytes)
    comm = 4 * _ring("all_reduce", tokens * cfg.hidden * dtype_bytes, tp, link)
    return Overlap("TP", 3 * layer_flops(cfg, tokens) / tp / flops, comm)


def cp_overlap(cfg: TransformerConfig, chunk: float, cp: int, link: Link, flops: float, dtype_bytes: int = 2,
               causal: bool = True) -> Overlap:
    """One ring step of one layer: attention of a (c × c) tile, forward + backward (3 × 4·c²·h, ½ when causal:
    zigzag's average) vs sending one K/V chunk, 2·c·h_kv·bytes, forward and twice in backward (K/V and dK/dV).
    `link`: the link one hop crosses (across nodes, the GPU's own NIC share: `comm_model.rail_link`)."""
    positive_real("chunk", chunk)
    positive_int("cp", cp)
    positive_real("flops", flops)
    positive_int("dtype_bytes", dtype_bytes)
    h_kv = (cfg.kv_heads or cfg.heads) * cfg.head_dim
    compute = 3 * 4 * chunk * chunk * cfg.hidden * (0.5 if causal else 1.0) / flops
    kv = 2 * chunk * h_kv * dtype_bytes
    comm = 0.0 if cp == 1 else 3 * (link.alpha + kv * link.beta)
    return Overlap("CP ring step", compute, comm)


def min_tokens(kind: str, cfg: TransformerConfig, n: int, link: Link | Fabric, flops: float, dtype_bytes: int = 2,
               causal: bool = True) -> float:
    """The rule of thumb: fewest tokens (FSDP: per GPU per micro-batch; CP: per chunk) whose compute hides the
    communication; math.inf for TP, whose ratio does not depend on tokens. Solved by bisection on the
    functions above (their α terms included)."""
    one_of("kind", kind, ("fsdp", "tp", "cp"))
    positive_int("n", n)
    if kind == "tp":
        return math.inf
    fn = {"fsdp": lambda t: fsdp_overlap(cfg, t, n, link, flops, dtype_bytes),
          "cp": lambda t: cp_overlap(cfg, t, n, link, flops, dtype_bytes, causal)}[kind]
    lo, hi = 1e-3, 1.0
    while not fn(hi).hidden:
        hi *= 2
        if hi > 1e12:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fn(mid).hidden else (mid, hi)
    return hi


def overlap_curves(cfg: TransformerConfig, tokens: list[float], flops: float, world: int, fsdp_link: Link | Fabric,
                   tp: int, tp_link: Link | Fabric, cp: int, cp_link: Link, mfu: float = 1.0) -> dict[str, list[float]]:
    """comm/compute ratios over `tokens` for the lab: FSDP (tokens per GPU), TP (the same), CP (chunk = tokens)."""
    fraction("mfu", mfu)
    f = flops * mfu
    return {"FSDP": [fsdp_overlap(cfg, t, world, fsdp_link, f).ratio for t in tokens],
            "TP": [tp_overlap(cfg, t, tp, tp_link, f).ratio for t in tokens],
            "CP ring": [cp_overlap(cfg, t, cp, cp_link, f).ratio for t in tokens]}
