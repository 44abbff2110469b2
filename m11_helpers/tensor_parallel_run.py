"""Tensor parallelism run on real ranks for lesson 04: the sharded block against the unsharded one, the
column-parallel output claim, and the all-reduce bandwidth the layers would pay.

    res = launch(tp_demo, num_processes=2)          # from scratch and DTensor: equal, and what they send
    res = launch(column_output_demo, num_processes=2)  # all-reduce vs all-gather after a column-parallel layer
    launch(allreduce_busbw, num_processes=2)         # ("cpu", GB/s) bus bandwidth, nccl-tests' definition
    res = launch(lesson_runs, num_processes=2, device="cpu")   # all three in one launch (seconds each when busy)

The layers themselves are in `m11_helpers.tensor_parallel`.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from m11_helpers import tensor_parallel as tp
from m11_helpers.comm_model import busbw
from m11_helpers.compare import max_diff
from m11_helpers.launch.base import rank_device
from m11_helpers.timing import time_it
from m11_helpers.validate import positive_int

__all__ = ["tp_demo", "column_output_demo", "allreduce_busbw", "lesson_runs"]


def tp_demo(seed: int = 0) -> dict:
    """One tiny-GPT block sharded over this launch's ranks (from scratch), and its MLP with DTensor.

    Returns the largest differences to the unsharded block (output, input gradient, a weight's gradient
    slice), the all-reduces counted forward and backward, and DTensor's collectives (CommDebugMode).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from m11_helpers.models import tiny_gpt

    rank, world = dist.get_rank(), dist.get_world_size()
    block = tiny_gpt(seed).blocks[0]
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(seed), requires_grad=True)  # (B, T, C)
    ref = block(x)  # (B, T, C): the unsharded block, on every rank
    ref.sum().backward()
    ref_dx, x.grad = x.grad.clone(), None

    sharded = tp.TPBlock(copy.deepcopy(block), rank, world)  # column/row-parallel attention (heads split) + MLP
    tp.COMM.clear()
    y = sharded(x)  # (B, T, C)
    fwd = tp.COMM.calls("all_reduce")
    y.sum().backward()
    n = block.mlp.fc.out_features // world
    out = {"max_diff": max_diff(y, ref), "dx_diff": max_diff(x.grad, ref_dx),
           "fc_grad_diff": max_diff(sharded.mlp.fc.weight.grad, block.mlp.fc.weight.grad[rank * n:(rank + 1) * n]),
           "forward": fwd, "backward": tp.COMM.calls("all_reduce") - fwd,
           "weight_shape": tuple(sharded.mlp.fc.weight.shape), "full_shape": tuple(block.mlp.fc.weight.shape)}

    # The same MLP with DTensor: ColwiseParallel / RowwiseParallel, collectives counted by CommDebugMode.
    mesh = init_device_mesh("cpu", (world,))
    dmlp = tp.parallelize_mlp(copy.deepcopy(block.mlp), mesh)
    counts = tp.count_collectives(lambda: dmlp(x).sum().backward())
    yd = dmlp(x)
    yd = yd.full_tensor() if isinstance(yd, DTensor) else yd
    yd = yd.wait() if hasattr(yd, "wait") else yd  # RowwiseParallel may return an AsyncCollectiveTensor
    out.update(dtensor_diff=max_diff(yd, block.mlp(x)), dtensor_counts=counts,
               dtensor_weight=f"{type(dmlp.fc.weight).__name__} {dmlp.fc.weight.placements}")
    return out


def column_output_demo(seed: int = 0) -> dict:
    """What may follow a column-parallel layer: an all-reduce (wrong), an all-gather, or nothing.

    Rank i holds Y_i = X A_i, a *slice of the features* (Shoeybi et al. 2019, §3). Summing the slices
    (all-reduce) adds unrelated features; concatenating them (all-gather) rebuilds Y; a row-parallel
    layer consumes Y_i as it is, and its one all-reduce sums partial *products* of the full output.
    """
    from m11_helpers.models import tiny_gpt

    rank, world = dist.get_rank(), dist.get_world_size()
    mlp = tiny_gpt(seed).blocks[0].mlp.to(rank_device())  # drawn on the CPU generator, run on this rank's device
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(seed)).to(rank_device())  # (B, C)
    full = mlp.fc(x).detach()  # (B, 4C)
    y_local = tp.ColumnParallelLinear.from_linear(mlp.fc, rank, world)(x).detach()  # (B, 4C/w)
    summed = y_local.clone()
    dist.all_reduce(summed)  # (B, 4C/w): a sum of different features
    parts = [torch.empty_like(y_local) for _ in range(world)]
    dist.all_gather(parts, y_local)
    gathered = torch.cat(parts, dim=-1)  # (B, 4C)
    proj = tp.RowParallelLinear.from_linear(mlp.proj, rank, world)
    tp.COMM.clear()
    out = proj(F.gelu(y_local))  # (B, C): no communication before the row-parallel layer, one all-reduce in it
    return {"local_shape": tuple(y_local.shape), "full_shape": tuple(full.shape),
            "allreduce_equals_slice": bool(torch.allclose(summed, full[:, rank * y_local.shape[1]:(rank + 1) * y_local.shape[1]])),
            "allgather_equals_full": bool(torch.allclose(gathered, full, atol=1e-6)),
            "row_output_equals_mlp": bool(torch.allclose(out, mlp(x), atol=1e-5)),
            "all_reduces_col_to_row": tp.COMM.calls("all_reduce")}


def allreduce_busbw(megabytes: int = 8, repeats: int = 5) -> tuple[str, float]:
    """(device, GB/s): the median all-reduce bus bandwidth of a `megabytes` MiB float32 tensor on this launch.

    busbw = S/t · 2(n−1)/n, nccl-tests' definition (`m11_helpers.comm_model.busbw`); NCCL on GPUs, gloo on CPUs.
    """
    positive_int("megabytes", megabytes)
    dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    x = torch.ones(megabytes * 2**20 // 4, device=dev)  # (S/4,) float32
    sync = torch.cuda.synchronize if dev == "cuda" else None
    t = time_it(lambda: dist.all_reduce(x), repeats=repeats, warmup=1, sync=sync)
    return dev, busbw("all_reduce", x.numel() * 4, t.median, dist.get_world_size()) / 1e9


def lesson_runs(seed: int = 0) -> dict:
    """What lesson 04 runs on its tensor-parallel ranks, in one launch: {"demo", "column", "busbw"}."""
    return {"demo": tp_demo(seed), "column": column_output_demo(seed), "busbw": allreduce_busbw()}
