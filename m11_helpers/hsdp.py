"""Hybrid sharded data parallelism (HSDP): FSDP inside a group, plain data parallelism across groups.

    mesh = hsdp_mesh(replicate=2, shard=2)     # 4 ranks: {0,1} and {2,3} shard; {0,2} and {1,3} replicate
    report = hsdp_step_report(replicate=2, shard=2)   # on each rank (via launch): bytes, collectives, equality
    hsdp_vs_fsdp(param_bytes, nodes=8, gpus_per_node=8, intra=NVLINK_H100, inter=IB_400G)   # the α–β sums

FSDP2's `fully_shard` on a 2-D `DeviceMesh` (replicate × shard) shards every parameter over the
"shard" dimension and replicates the shards over the "replicate" dimension. A step all-gathers
parameters inside the shard group (forward, and again in backward), reduce-scatters gradients inside
it, then all-reduces each gradient *shard* across the replicas. Zhao et al. 2023 ("PyTorch FSDP",
VLDB, §3.2.2 "Hybrid Sharding"): shard within a node over the fast links, replicate across nodes, so
only the gradient shards — 1/g of the gradients — cross the slow inter-node network.
"""

from __future__ import annotations

import collections

import torch
import torch.distributed as dist

from m11_helpers.comm_model import ring_allreduce_time
from m11_helpers.fsdp import apply_fsdp, init_device_mesh, local_param_numel
from m11_helpers.hardware_specs import Link
from m11_helpers.validate import non_negative_real, positive_int

__all__ = ["hsdp_mesh", "hsdp_step_report", "ring_collective_time", "hsdp_vs_fsdp"]


def hsdp_mesh(replicate: int, shard: int):
    """A (replicate, shard) CPU DeviceMesh over replicate·shard ranks; shard groups are consecutive ranks."""
    positive_int("replicate", replicate)
    positive_int("shard", shard)
    if dist.get_world_size() != replicate * shard:
        raise ValueError(f"replicate·shard ({replicate}·{shard}) must equal the world size ({dist.get_world_size()})")
    return init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))


def _summarise(events) -> dict:
    """op -> {calls, payload bytes} from record_comm events (payload = the tensor this rank passed in)."""
    out: dict = collections.defaultdict(lambda: {"calls": 0, "bytes": 0})
    for e in events:
        out[e.op]["calls"] += 1
        out[e.op]["bytes"] += e.nbytes
    return dict(out)


def hsdp_step_report(replicate: int = 2, shard: int = 2, batch: int = 8, seed: int = 0) -> dict:
    """Run on each rank (via `launch`): the tiny GPT under HSDP and under FSDP on the same ranks, one step each.

    Returns this rank's parameter bytes under each, the collectives each ran (from
    `grading.observe.record_comm`: an all-gather's payload is this rank's shard, so payload / full size
    gives the group it gathers over), and the largest difference of the gradients (full_tensor) from one
    process on the whole batch.
    """
    from m11_helpers.grading.observe import record_comm
    from m11_helpers.models import tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.randint(0, 64, (batch, 32), generator=torch.Generator().manual_seed(seed + 1))  # (batch, T)
    ref = tiny_gpt(seed)
    ref(x, x).backward()  # one process, the whole batch: the reference gradients
    out = {"rank": rank, "param_bytes_full": sum(p.numel() * p.element_size() for p in ref.parameters())}
    meshes = {"hsdp": hsdp_mesh(replicate, shard), "fsdp": init_device_mesh("cpu", (n,))}
    for name, mesh in meshes.items():
        model = apply_fsdp(tiny_gpt(seed), mesh)
        mine = x.chunk(n)[rank]  # (batch/N, T): each rank its own slice of the batch
        with record_comm() as log:
            model(mine, mine).backward()
        out[name] = {
            "param_bytes": local_param_numel(model) * 4,
            "placements": str(next(model.parameters()).placements),
            "comm": _summarise(log.events),
            "max_grad_diff": max((p.grad.full_tensor() - q.grad).abs().max().item()
                                 for p, q in zip(model.parameters(), ref.parameters())),
        }
    return out


def ring_collective_time(op: str, nbytes: float, n: int, link: Link) -> float:
    """α–β time of a ring collective over n ranks (lesson 02): all-reduce 2(n−1)α + 2(n−1)/n·Sβ; all-gather and
    reduce-scatter are its halves, (n−1)α + (n−1)/n·Sβ (S = the full tensor; Patarasuk & Yuan 2009)."""
    non_negative_real("nbytes", nbytes)
    t = ring_allreduce_time(nbytes, n, link.alpha, link.beta)
    if op == "all_reduce":
        return t
    if op in ("all_gather", "reduce_scatter"):
        return t / 2
    raise ValueError(f"op must be one of 'all_reduce', 'all_gather', 'reduce_scatter', got {op!r}")


def hsdp_vs_fsdp(param_bytes: float, nodes: int, gpus_per_node: int, intra: Link, inter: Link,
                 grad_bytes: float | None = None) -> dict:
    """Seconds of sharding traffic per step, FSDP over every GPU vs HSDP (shard in a node, replicate across).

    FSDP: 2 all-gathers of the parameters and 1 reduce-scatter of the gradients over N = nodes·g ranks; a
    ring that crosses nodes runs at the inter-node bandwidth per GPU (one NIC per GPU, one ring per rail).
    HSDP: the same three inside a node (g ranks, `intra`), then an all-reduce of each GPU's gradient shard
    (grad_bytes/g) across the nodes on its own rail (`inter`). Zhao et al. 2023, §3.2.2.
    Returns seconds for each part and in total, and the inter-node bytes each GPU sends.
    """
    non_negative_real("param_bytes", param_bytes)
    positive_int("nodes", nodes)
    g = positive_int("gpus_per_node", gpus_per_node)
    grads = param_bytes if grad_bytes is None else non_negative_real("grad_bytes", grad_bytes)
    N = nodes * g
    link = inter if nodes > 1 else intra
    fsdp = {"all_gather": 2 * ring_collective_time("all_gather", param_bytes, N, link),
            "reduce_scatter": ring_collective_time("reduce_scatter", grads, N, link)}
    hsdp = {"all_gather": 2 * ring_collective_time("all_gather", param_bytes, g, intra),
            "reduce_scatter": ring_collective_time("reduce_scatter", grads, g, intra),
            "all_reduce": ring_collective_time("all_reduce", grads / g, nodes, inter)}
    return {"fsdp": {**fsdp, "total": sum(fsdp.values())}, "hsdp": {**hsdp, "total": sum(hsdp.values())},
            "fsdp_inter_bytes": (N - 1) / N * (2 * param_bytes + grads) if nodes > 1 else 0.0,
            "hsdp_inter_bytes": 2 * (nodes - 1) / nodes * grads / g,
            "fsdp_shard": 1 / N, "hsdp_shard": 1 / g}
