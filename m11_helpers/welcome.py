"""Lesson 00: the first real launch, and the one formula data parallelism rests on.

    ∇L = (1/N) Σᵢ ∇Lᵢ   — the gradient of the mean loss over the whole batch equals the average of
    the N ranks' gradients on equal shards (each Lᵢ a mean over its shard). Li et al. 2020,
    "PyTorch Distributed", §2: this is why DDP all-reduces and divides by the world size.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from m11_helpers.data import regression
from m11_helpers.launch.base import rank_device
from m11_helpers.models import mlp
from m11_helpers.validate import positive_int


def hello() -> dict:
    """Run on every rank: who am I, and one all-reduce (sum of the ranks' ids)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.tensor([float(rank)], device=rank_device())  # (1,) on this rank's GPU under NCCL
    dist.all_reduce(x)  # default op: SUM, every rank ends with the same value
    return {"rank": rank, "world_size": world, "pid": os.getpid(), "backend": dist.get_backend(),
            "all_reduce_sum": x.item()}


def shard(n: int, rank: int, world_size: int) -> slice:
    """The contiguous slice of a batch of n samples that `rank` owns (n must divide evenly)."""
    positive_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..world_size-1 = 0..{world_size - 1}, got rank={rank}")
    if n % world_size:
        raise ValueError(f"n ({n}) must be divisible by world_size ({world_size}) for equal shards")
    per = n // world_size
    return slice(rank * per, (rank + 1) * per)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # (num_params,)


def full_batch_gradient(batch_size: int = 64, seed: int = 0) -> torch.Tensor:
    """One process, whole batch: ∇ of the mean loss."""
    model = mlp(seed=seed)
    x, y = regression(n=batch_size, seed=seed).tensors
    F.mse_loss(model(x), y).backward()
    return flat_grad(model)


def shard_gradient(rank: int, world_size: int, batch_size: int = 64, seed: int = 0) -> torch.Tensor:
    """One process: ∇Lᵢ, the gradient of the mean loss over shard `rank` alone (what that rank computes)."""
    model = mlp(seed=seed)
    x, y = regression(n=batch_size, seed=seed).tensors
    part = shard(batch_size, rank, world_size)
    F.mse_loss(model(x[part]), y[part]).backward()
    return flat_grad(model)


def data_parallel_gradient(batch_size: int = 64, seed: int = 0) -> torch.Tensor:
    """Run on every rank: ∇ of the rank's shard loss, summed with all-reduce, divided by N."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = mlp(seed=seed)  # the same seed on every rank: identical replicas
    x, y = regression(n=batch_size, seed=seed).tensors
    part = shard(batch_size, rank, world)
    F.mse_loss(model(x[part]), y[part]).backward()  # Lᵢ: mean over this rank's shard
    g = flat_grad(model)
    dist.all_reduce(g)  # Σᵢ ∇Lᵢ
    return g / world  # (1/N) Σᵢ ∇Lᵢ


def failing_rank(bad_rank: int = 2) -> int:
    """Run on every rank: `bad_rank` divides by an empty batch and raises; the others wait in a barrier."""
    if dist.get_rank() == bad_rank:
        batch = torch.empty(0, 4)
        if batch.numel() == 0:
            raise ValueError(f"rank {bad_rank} got an empty batch: nothing to average")
    dist.barrier()
    return dist.get_rank()
