"""Hybrid sharded data parallelism (HSDP): FSDP inside a group, plain data parallelism across groups (lesson 12).

    mesh = hsdp_mesh(replicate=2, shard=2)     # 4 ranks: {0,1} and {2,3} shard; {0,2} and {1,3} replicate
    report = hsdp_step_report(replicate=2, shard=2)   # on each rank (via launch): bytes, collectives, equality
    hsdp_vs_fsdp(param_bytes, nodes=8, fabric=HGX_H100, units=32)   # lesson 02's α–β rail model, both methods

FSDP2's `fully_shard` on a 2-D `DeviceMesh` (replicate × shard) shards every parameter over the
"shard" dimension and replicates the shards over the "replicate" dimension. A step all-gathers
parameters inside the shard group (forward, and again in backward), reduce-scatters gradients inside
it, then all-reduces each gradient *shard* across the replicas. Zhao et al. 2023 ("PyTorch FSDP",
VLDB, §3.2.2 "Hybrid Sharding"): shard within a node over the fast links, replicate across nodes, so
only the gradient shards — 1/g of the gradients — cross the slow inter-node network.

Across nodes both methods go through lesson 02's rail model (`comm_model.Fabric`): FSDP's flat ring over
nodes·g GPUs runs one ring per NIC (min(NVLink, rails·B_nic) per GPU: 400 GB/s on an 8-rail HGX H100 node),
HSDP's all-reduce of gradient shards runs on each GPU's own rail. On 8-rail nodes the two are close in time and
HSDP sends ~1.7× fewer inter-node bytes; HSDP wins clearly with one NIC per node, or at scale, where FSDP's
flat ring pays 2(N−1) latency steps for every per-layer collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from m11_helpers.comm_count import CommCounter
from m11_helpers.comm_model import (
    COLLECTIVES,
    Fabric,
    bus_factor,
    cluster_collective_time,
    inter_node_bytes,
    ring_collective_time,
)
from m11_helpers.compare import max_diff
from m11_helpers.fsdp import apply_fsdp, init_device_mesh, local_param_numel
from m11_helpers.validate import non_negative_real, positive_int

__all__ = ["hsdp_mesh", "hsdp_step_report", "hsdp_vs_fsdp"]


def hsdp_mesh(replicate: int, shard: int):
    """A (replicate, shard) CPU DeviceMesh over replicate·shard ranks; shard groups are consecutive ranks."""
    positive_int("replicate", replicate)
    positive_int("shard", shard)
    if dist.get_world_size() != replicate * shard:
        raise ValueError(f"replicate·shard ({replicate}·{shard}) must equal the world size ({dist.get_world_size()})")
    return init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))


def _summarise(events) -> dict:
    """op -> {calls, payload, wire, elements} (comm_count) from record_comm events: payload = the tensor this
    rank passed in, wire = a ring's bytes over the group of the call (bus factor × S; S = g × an all-gather's
    shard); elements are not counted (0)."""
    count = CommCounter()
    for e in events:
        g = len(e.group) if e.group else dist.get_world_size()
        kind = e.op.removesuffix("_single").removesuffix("_into_tensor").removesuffix("_tensor")
        size = e.nbytes * g if kind == "all_gather" else e.nbytes  # S
        count.add(e.op, e.nbytes, (bus_factor(kind, g) if kind in COLLECTIVES else 1.0) * size)  # else: p2p
    return count.table()


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
            "max_grad_diff": max_diff([p.grad for p in model.parameters()], [q.grad for q in ref.parameters()]),
        }
    return out


def hsdp_vs_fsdp(param_bytes: float, nodes: int, fabric: Fabric, grad_bytes: float | None = None,
                 units: int = 1) -> dict:
    """Seconds of sharding traffic per step, FSDP over every GPU vs HSDP (shard in a node, replicate across).

    FSDP: 2 all-gathers of the parameters and 1 reduce-scatter of the gradients over N = nodes·g ranks, a flat
    ring per rail (`comm_model.cluster_collective_time`). HSDP: the same three inside a node (NVLink), then an
    all-reduce of each GPU's gradient shard (grad_bytes/g) across the nodes on its own rail
    (`Fabric.rail_link`). Zhao et al. 2023, §3.2.2. `units`: FSDP units (one per layer, as FSDP2 wraps blocks):
    each collective runs `units` times on 1/units of the bytes, so the α terms count `units` times.
    Returns seconds for each part and in total, and the inter-node bytes per GPU (`comm_model.inter_node_bytes`
    per node ÷ g).
    """
    non_negative_real("param_bytes", param_bytes)
    positive_int("nodes", nodes)
    positive_int("units", units)
    g = fabric.gpus
    grads = param_bytes if grad_bytes is None else non_negative_real("grad_bytes", grad_bytes)
    p, q = param_bytes / units, grads / units  # one unit's parameters and gradients
    fsdp = {"all_gather": 2 * units * cluster_collective_time("all_gather", p, nodes, fabric),
            "reduce_scatter": units * cluster_collective_time("reduce_scatter", q, nodes, fabric)}
    rail = fabric.rail_link()
    hsdp = {"all_gather": 2 * units * cluster_collective_time("all_gather", p, 1, fabric),
            "reduce_scatter": units * cluster_collective_time("reduce_scatter", q, 1, fabric),
            "all_reduce": units * ring_collective_time("all_reduce", q / g, nodes, rail.alpha, rail.beta)}
    # an all-gather or a reduce-scatter is half a ring all-reduce: half its inter-node bytes
    fsdp_inter = (inter_node_bytes(2 * param_bytes, nodes, g) + inter_node_bytes(grads, nodes, g)) / 2
    return {"fsdp": {**fsdp, "total": sum(fsdp.values())}, "hsdp": {**hsdp, "total": sum(hsdp.values())},
            "fsdp_inter_bytes": fsdp_inter / g,
            "hsdp_inter_bytes": inter_node_bytes(grads, nodes, g, "hierarchical") / g,
            "fsdp_shard": 1 / (nodes * g), "hsdp_shard": 1 / g}
