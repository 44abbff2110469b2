"""Data parallelism: replicate the model, split the batch, average the gradients.

    ∇L(batch) = (1/N) Σᵢ ∇Lᵢ(shard i)        — one all-reduce (sum) and a division by N

Lesson 03. From scratch: `shard_indices` (what `DistributedSampler` hands each rank),
`broadcast_parameters` / `average_gradients` (naive data parallelism), `pack_buckets` (how DDP
groups gradients, its 1 MiB first bucket included), `train_regression` (the same training on 1
process, naive DP or DDP), and the batch-size formulas: the linear scaling rule with warmup (Goyal
et al. 2017) and the gradient noise scale (McCandlish et al. 2018). The DDP timeline and the
step-time model live in `ddp_overlap.py`.
"""

from __future__ import annotations

import math

import torch
import torch._dynamo  # noqa: F401  why: DDP imports it lazily (~5 s per rank on 2 cores); imported once here, forked ranks inherit it
import torch.distributed as dist
from torch import nn

from m11_helpers.validate import non_negative_int, one_of, positive_int, positive_real

__all__ = ["shard_indices", "broadcast_parameters", "average_gradients", "MiB", "DEFAULT_BUCKET_CAP_MB",
           "FIRST_BUCKET_BYTES", "BUCKET_MLP", "bucket_limits", "pack_buckets", "train_regression", "scaled_lr",
           "warmup_lr", "noise_scale", "steps_and_examples"]


# ---------------------------------------------------------------------------------------------
# Splitting the data: DistributedSampler, from scratch
# ---------------------------------------------------------------------------------------------


def shard_indices(n: int, rank: int, world_size: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0,
                  drop_last: bool = False) -> list[int]:
    """Rank r's indices: order[r::N] of the (shuffled by seed+epoch, padded to a multiple of N) order.

    Source: torch.utils.data.DistributedSampler.__iter__ (torch 2.13) — padding repeats the first
    indices so every rank gets ceil(n/N) samples; drop_last=True cuts to floor(n/N) instead.
    """
    positive_int("n", n)
    positive_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)  # same generator on every rank: one shared order
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    if drop_last:
        order = order[: (n // world_size) * world_size]
    else:
        total = math.ceil(n / world_size) * world_size
        while len(order) < total:  # equal shares keep the ranks in lock-step (a short rank would hang the all-reduce)
            order += order[: total - len(order)]
    return order[rank::world_size]


# ---------------------------------------------------------------------------------------------
# Naive data parallelism: two collectives
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers to every rank (DDP does this in its constructor)."""
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=src)


@torch.no_grad()
def average_gradients(model: nn.Module) -> None:
    """p.grad ← (1/N) Σᵢ p.grad on rank i, for every parameter: one all-reduce each (DDP buckets them)."""
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world  # the loss is a mean over the batch, so the gradient must be one too


# ---------------------------------------------------------------------------------------------
# Buckets: DDP's rule, as torch 2.13 applies it when it rebuilds them after iteration 0
# ---------------------------------------------------------------------------------------------

MiB = 2**20  # DDP's bucket_cap_mb counts MiB (torch.nn.parallel.distributed: _MB_TO_BYTES = 1024 * 1024)
DEFAULT_BUCKET_CAP_MB = 25  # DistributedDataParallel(bucket_cap_mb=None) means 25 MiB
# DDP's smaller first bucket; a private torch constant, hence the fallback to its value (torch 1.8 to 2.13)
FIRST_BUCKET_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MiB)
BUCKET_MLP = (256, 512, 512, 512, 512, 16)  # the course MLP at 3.7 MB of fp32 gradients: more than the first bucket


def bucket_limits(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """(first bucket's limit, every later bucket's) in bytes: (1 MiB, 25 MiB) by default, (cap, cap) when given.

    Source: torch.nn.parallel.distributed._BucketCapacityConfig.create (torch 2.13): the 1 MiB first
    bucket applies only when bucket_cap_mb is left at None; passing bucket_cap_mb=25 turns it off.
    """
    if bucket_cap_mb is None:
        return FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * MiB
    positive_real("bucket_cap_mb", bucket_cap_mb)
    cap = int(bucket_cap_mb * MiB)
    return cap, cap


def pack_buckets(nbytes: list[int], bucket_cap_mb: float | None = None, *,
                 order: list[int] | None = None) -> list[list[int]]:
    """DDP's buckets after iteration 0: parameter indices per bucket, in the order they are all-reduced.

    Walk the gradients in the order they became ready (`order`; default: reverse parameter order,
    what backward gives a chain of layers); add each to the open bucket and close it once it holds
    >= its limit (`bucket_limits`: the first bucket's, then the rest's), so buckets overshoot a little.
    Source: torch/csrc/distributed/c10d/reducer.cpp, compute_bucket_assignment_by_size and
    Reducer::rebuild_buckets (torch 2.13). DDP buckets each dtype and device separately: one here.
    """
    nbytes = [non_negative_int(f"nbytes[{i}]", b) for i, b in enumerate(nbytes)]
    order = list(reversed(range(len(nbytes)))) if order is None else list(order)
    if sorted(order) != list(range(len(nbytes))):
        raise ValueError(f"order must be a permutation of 0..{len(nbytes) - 1}")
    first, rest = bucket_limits(bucket_cap_mb)
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in order:
        current.append(i)
        size += nbytes[i]
        if size >= (first if not buckets else rest):  # add first, then close: DDP's buckets reach their limit
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


# ---------------------------------------------------------------------------------------------
# One training run, three ways (used by the lesson, the tests and the benchmark)
# ---------------------------------------------------------------------------------------------


def train_regression(mode: str = "single", steps: int = 20, global_batch: int = 64, lr: float = 0.05,
                     warmup_steps: int = 0, warmup_from: float | None = None, momentum: float = 0.0, seed: int = 0,
                     sizes: tuple[int, ...] = (16, 64, 64, 4)) -> dict:
    """Train the course MLP with SGD on `regression()`: mode 'single', 'naive' (broadcast + all-reduce) or 'ddp'.

    Rank r takes rows [r·B/N, (r+1)·B/N) of each global batch, so every mode sees the same samples.
    With warmup_steps, the lr ramps linearly from `warmup_from` to `lr` over that many steps (`warmup_lr`).
    Returns {'losses': global mean loss per step, 'grad0': first step's averaged gradient (flat),
    'params': final parameters (flat)}.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.data import regression
    from m11_helpers.models import mlp

    one_of("mode", mode, ("single", "naive", "ddp"))
    rank, world = (dist.get_rank(), dist.get_world_size()) if mode != "single" else (0, 1)
    if global_batch % world:
        raise ValueError(f"global_batch must be divisible by the world size {world}, got {global_batch}")
    local = global_batch // world
    x, y = regression(n=4096, seed=seed).tensors  # (4096, 16), (4096, 4)
    # rank 0 builds from `seed`, the others from a different seed: the broadcast (or DDP) must fix that
    model = mlp(sizes, seed=seed if rank == 0 else seed + 1000 + rank)
    if mode == "naive":
        broadcast_parameters(model)
    net = DDP(model) if mode == "ddp" else model
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses, grad0 = [], None
    for step in range(steps):
        if warmup_steps:
            start = warmup_from if warmup_from is not None else lr
            for group in opt.param_groups:
                group["lr"] = warmup_lr(step, base_lr=start, scale=lr / start, warmup_steps=warmup_steps)
        rows = (step * global_batch + rank * local + torch.arange(local, device=x.device)) % len(x)  # (local,)
        loss = nn.functional.mse_loss(net(x[rows]), y[rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces here, bucket by bucket, while backward runs
        if mode == "naive":
            average_gradients(model)
        if step == 0:
            grad0 = torch.cat([p.grad.flatten() for p in model.parameters()])
        opt.step()
        report = loss.detach().clone()
        if mode != "single":  # the global loss is the mean of the equal-sized local means
            dist.all_reduce(report)
            report /= world
        losses.append(report.item())
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    if mode == "ddp":
        del net  # a live DDP model at interpreter exit can abort the process (docs/cpu-distributed-facts.md)
    return {"losses": losses, "grad0": grad0, "params": params}


# ---------------------------------------------------------------------------------------------
# Batch size and learning rate
# ---------------------------------------------------------------------------------------------


def scaled_lr(batch: int, base_lr: float = 0.1, base_batch: int = 256) -> float:
    """η = base_lr · batch / base_batch — the linear scaling rule (Goyal et al. 2017, §2.1: η = 0.1·kn/256)."""
    positive_int("batch", batch)
    positive_int("base_batch", base_batch)
    positive_real("base_lr", base_lr)
    return base_lr * batch / base_batch


def warmup_lr(step: int, *, base_lr: float, scale: float, warmup_steps: int) -> float:
    """η(t) = η·(1 + (k−1)·min(t/T, 1)): gradual warmup from η to kη over T steps (Goyal et al. 2017, §2.2)."""
    non_negative_int("step", step)
    non_negative_int("warmup_steps", warmup_steps)
    positive_real("base_lr", base_lr)
    positive_real("scale", scale)
    frac = 1.0 if warmup_steps == 0 else min(step / warmup_steps, 1.0)
    return base_lr * (1 + (scale - 1) * frac)


def noise_scale(g_small_sq: float, g_big_sq: float, b_small: int, b_big: int) -> dict:
    """B_simple = tr(Σ)/|G|² from |G_est|² at two batch sizes (McCandlish et al. 2018, App. A.1, eq. A.2).

    |G|² = (B_big|G_big|² − B_small|G_small|²)/(B_big − B_small);  tr Σ = (|G_small|² − |G_big|²)/(1/B_small − 1/B_big).
    Data parallelism hands you both for free: a rank's local gradient (B_small) and the all-reduced one (B_big).
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1 / b_small - 1 / b_big)
    return {"G2": g2, "trace_sigma": trace, "B_simple": trace / g2}


def steps_and_examples(batch: float, b_noise: float) -> tuple[float, float]:
    """(S/S_min, E/E_min) = (1 + B_noise/B, 1 + B/B_noise) (McCandlish et al. 2018, eq. 2.11 with B_crit ≈ B_noise)."""
    positive_real("batch", batch)
    positive_real("b_noise", b_noise)
    return 1 + b_noise / batch, 1 + batch / b_noise
