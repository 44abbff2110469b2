"""The buckets a real DDP all-reduces, for models whose backward is not a chain of layers (lesson 03).

    model = BUCKET_MODELS["head first"]()                       # registered head first, used last
    ready_order(model, torch.randn(4, BUCKET_INPUT))            # [1, 0, 7, 6, 5, 4, 3, 2]: not the reverse of 0..7
    ddp_bucket_assignment(model, x, bucket_cap_mb=None)          # inside a launched rank: a real DDP's buckets

DDP packs its first buckets in reverse registration order; during iteration 0 its autograd hooks record
the order in which gradients actually become ready, and from iteration 1 it all-reduces buckets rebuilt
in that order (torch/csrc/distributed/c10d/reducer.cpp: Reducer::rebuild_buckets, then
compute_bucket_assignment_by_size with the gradients' ready order, torch 2.13), by the rule of
`data_parallel.pack_buckets`. Parameters that get no gradient (requires_grad=False) are in no bucket.
The order is autograd's: the reverse of registration only for a chain, which these models are not.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from m11_helpers.data_parallel import BUCKET_MLP
from m11_helpers.models import mlp

__all__ = ["BUCKET_INPUT", "BUCKET_MODELS", "HeadFirst", "TwoPaths", "frozen_stem", "ready_order",
           "ddp_bucket_assignment"]

BUCKET_INPUT = BUCKET_MLP[0]  # features in: every model below takes (batch, 256)


class HeadFirst(nn.Module):
    """An MLP whose head is registered first and runs last: its gradients are the first ready."""

    def __init__(self, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():  # the same weights on every rank, and the caller's RNG untouched
            torch.manual_seed(seed)
            self.head = nn.Linear(512, 16)  # parameters 0, 1
            self.body = nn.Sequential(nn.Linear(BUCKET_INPUT, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                      nn.Linear(512, 512))  # parameters 2..7; 512 × 512 fp32 = 1 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))  # (batch, 16)


class TwoPaths(nn.Module):
    """Two branches from one input, the one registered second computed first: backward runs them the other way."""

    def __init__(self, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.wide = nn.Sequential(nn.Linear(BUCKET_INPUT, 512), nn.ReLU(), nn.Linear(512, 512))  # 0..3
            self.narrow = nn.Sequential(nn.Linear(BUCKET_INPUT, 256), nn.ReLU(), nn.Linear(256, 512))  # 4..7
            self.head = nn.Linear(512, 16)  # 8, 9

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.narrow(x) + self.wide(x))  # (batch, 16): autograd runs later nodes first


def frozen_stem(seed: int = 0) -> nn.Module:
    """The course MLP with its first layer frozen (as in fine-tuning): DDP buckets only what gets a gradient."""
    model = mlp(BUCKET_MLP, seed=seed)
    model[0].requires_grad_(False)
    return model


BUCKET_MODELS = {"course MLP": lambda: mlp(BUCKET_MLP), "head first": HeadFirst, "two paths": TwoPaths,
                 "frozen stem": frozen_stem,
                 # its last four gradients hold 1,048,384 bytes: past 10⁶, short of 1 MiB (the unit of bucket_cap_mb)
                 "odd widths": lambda: mlp((BUCKET_INPUT, 256, 960, 16))}


def ready_order(model: nn.Module, x: torch.Tensor) -> list[int]:
    """Indices (into model.parameters()) of the gradients in the order one backward of model(x)² makes them."""
    ready: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, i=i: ready.append(i))
               for i, p in enumerate(model.parameters()) if p.requires_grad]
    try:
        model(x).square().mean().backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    return ready


def ddp_bucket_assignment(model: nn.Module, x: torch.Tensor, bucket_cap_mb: float | None = None,
                          iterations: int = 2) -> list[list[int]]:
    """Inside a launched rank: each bucket's parameter indices (into model.parameters()), in bucket order, as a
    real DDP's communication hook receives them in its last iteration (the buckets are rebuilt after the first)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    index = {id(p): i for i, p in enumerate(model.parameters())}
    ddp = DDP(model) if bucket_cap_mb is None else DDP(model, bucket_cap_mb=bucket_cap_mb)
    seen: list[tuple[int, list[int]]] = []

    def hook(state, bucket):
        seen.append((bucket.index(), [index[id(p)] for p in bucket.parameters()]))
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, hook)
    for _ in range(iterations):
        seen.clear()
        ddp(x).square().mean().backward()
    del ddp  # docs/cpu-distributed-facts.md: a live DDP model at exit can abort the process
    return [params for _, params in sorted(seen)]
