"""Overlap, seen and modelled: a DDP timeline recorded with a communication hook, and a step-time model (lesson 03).

    run = record_timeline(bucket_cap_mb=None)            # inside a rank started by launch(): DDP's defaults
    plot_timeline(run["iterations"][2:])

The model is lesson 02's α–β model (`comm_model.py`): a ring all-reduce of S bytes on n ranks takes
    T = 2(n−1)·α + 2(n−1)/n · S·β        (β in seconds per byte; Patarasuk & Yuan 2009)
and with overlap a step ends when the last bucket's all-reduce ends (`overlap_end`).
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Sequence

import torch
import torch._dynamo  # noqa: F401  why: DDP imports it lazily (~5 s per rank on 2 cores); imported once, forks inherit it
import torch.distributed as dist

from m11_helpers.comm_model import ring_allreduce_time
from m11_helpers.config import TransformerConfig
from m11_helpers.data_parallel import BUCKET_MLP
from m11_helpers.timing import synchronize, time_it
from m11_helpers.validate import non_negative_real, positive_int, positive_real

__all__ = ["record_timeline", "bucket_params", "plot_timeline", "measure_step", "hidden_fraction", "overlap_end",
           "ddp_step_time", "tensor_numels"]


def overlap_end(ready: list[float], comm: list[float]) -> float:
    """End of the last all-reduce when bucket i is ready at ready[i] and its all-reduce takes comm[i].

    One communication stream: end_i = max(end_{i−1}, ready_i) + comm_i (buckets go in order).
    """
    if len(ready) != len(comm):
        raise ValueError(f"ready and comm must have the same length, got {len(ready)} and {len(comm)}")
    end = 0.0
    for r, c in zip(ready, comm):
        end = max(end, r) + c
    return end


def ddp_step_time(forward_s: float, backward_s: float, grad_bytes: float, world_size: int,
                  buckets: int | Sequence[float], alpha: float, beta: float, overlap: bool = True) -> dict:
    """One DDP step: forward, then backward producing gradient bytes at a constant rate (β: s/byte).

    `buckets` is a count (equal buckets) or each bucket's bytes in all-reduce order (`pack_buckets` on
    the model's tensors); bucket i is ready when backward has produced every byte up to its end.
    Without overlap the all-reduces start after backward; with it, bucket i starts when ready. Only
    the last bucket can never hide: it is ready when backward ends.
    """
    non_negative_real("forward_s", forward_s)
    non_negative_real("backward_s", backward_s)
    positive_real("grad_bytes", grad_bytes)
    if isinstance(buckets, int):
        sizes = [grad_bytes / positive_int("buckets", buckets)] * buckets
    else:
        sizes = [float(b) for b in buckets]
        if not sizes or abs(sum(sizes) - grad_bytes) > 1e-9 * grad_bytes:
            raise ValueError(f"buckets must be bucket sizes adding up to grad_bytes={grad_bytes:g}, got {sum(sizes):g}")
    comm = [ring_allreduce_time(s, world_size, alpha, beta) for s in sizes]  # more buckets: more α terms
    if overlap:
        ready = [backward_s * done / grad_bytes for done in itertools.accumulate(sizes)]
        end = overlap_end(ready, comm)
    else:
        end = backward_s + sum(comm)
    step = forward_s + max(end, backward_s)
    compute = forward_s + backward_s
    return {"step_s": step, "compute_s": compute, "comm_s": sum(comm), "exposed_comm_s": step - compute,
            "efficiency": compute / step}


@functools.lru_cache(maxsize=8)
def tensor_numels(cfg: TransformerConfig) -> tuple[int, ...]:
    """Elements of each parameter tensor of `cfg`'s model, in parameter order (built on the meta device: no memory).

    Llama-style configs (gated MLP) build `models.tiny_llama`, the others `models.tiny_gpt`; the sum
    equals `config.param_count(cfg)` (tests/test_data_parallel.py).
    """
    from m11_helpers.models import tiny_gpt, tiny_llama

    with torch.device("meta"):
        model = (tiny_llama if cfg.gated_mlp else tiny_gpt)(0, cfg)
    return tuple(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# The real thing: a comm hook that timestamps every bucket's all-reduce
# ---------------------------------------------------------------------------------------------


def record_timeline(bucket_cap_mb: float | None = None, iterations: int = 3, batch: int = 64,
                    sizes: tuple[int, ...] = BUCKET_MLP, seed: int = 0) -> dict:
    """Run DDP on the course MLP inside a launched rank; per iteration, when each bucket's all-reduce ran.

    Returns {"iterations": one dict per iteration, "numels": elements per parameter}. An iteration
    holds backward_s (its duration), grads (the times gradients were ready, in order) and buckets
    [(index, numel, start, end, parameter indices)], times in seconds from the start of backward. A
    comm hook wraps the default all-reduce hook, times it with fut.then() and reads which parameters
    DDP put in the bucket (GradBucket.parameters()).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.models import mlp

    model = mlp(sizes, seed=seed)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    ddp = DDP(model) if bucket_cap_mb is None else DDP(model, bucket_cap_mb=bucket_cap_mb)
    t0 = [0.0]
    events: list[tuple] = []
    ready: list[float] = []

    def hook(state, bucket):
        start = time.perf_counter() - t0[0]
        params = [index[id(p)] for p in bucket.parameters()]
        fut = default_hooks.allreduce_hook(state, bucket)  # sums then divides by N, as DDP does

        def done(f):
            events.append((bucket.index(), bucket.buffer().numel(), start, time.perf_counter() - t0[0], params))
            return f.value()[0]

        return fut.then(done)

    ddp.register_comm_hook(None, hook)
    for p in model.parameters():  # when each gradient lands: the compute side of the timeline
        p.register_post_accumulate_grad_hook(lambda p: ready.append(time.perf_counter() - t0[0]))
    g = torch.Generator().manual_seed(seed + dist.get_rank())  # each rank its own shard
    x = torch.randn(batch, sizes[0], generator=g)  # (batch, d_in)
    out = []
    for _ in range(iterations):
        events.clear()
        ready.clear()
        loss = ddp(x).square().mean()
        t0[0] = time.perf_counter()
        loss.backward()  # hooks fire in here; the last futures complete before backward returns
        synchronize()  # on a GPU backward returns before its kernels end
        out.append({"backward_s": time.perf_counter() - t0[0], "grads": list(ready), "buckets": sorted(events)})
    numels = [p.numel() for p in model.parameters()]
    del ddp  # see docs/cpu-distributed-facts.md: a live DDP model at exit can abort the process
    return {"iterations": out, "numels": numels}


def bucket_params(iteration: dict) -> list[list[int]]:
    """The parameter indices of each bucket DDP all-reduced in one recorded iteration, in bucket order."""
    return [params for *_, params in iteration["buckets"]]


def hidden_fraction(iteration: dict) -> float:
    """Share of all-reduce time that ran while gradients were still being computed (before the last one landed)."""
    compute_end = max(iteration["grads"])
    total = sum(e - s for _, _, s, e, *_ in iteration["buckets"])
    hidden = sum(max(0.0, min(e, compute_end) - s) for _, _, s, e, *_ in iteration["buckets"])
    return hidden / total if total > 0 else 0.0


def plot_timeline(iterations: list[dict], titles: list[str] | None = None, ax=None):
    """Gantt chart: backward (grey) with ticks where gradients land, one bar per bucket's all-reduce."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, axes = plt.subplots(len(iterations), 1, figsize=(8, 1.2 + 0.9 * len(iterations)), squeeze=False)
        axes = axes[:, 0]
    else:
        axes = [ax]
    for k, (it, a) in enumerate(zip(iterations, axes)):
        ms = 1e3
        a.barh(0, it["backward_s"] * ms, color="0.8", height=0.6, label="backward (compute)")
        a.plot([g * ms for g in it["grads"]], [0] * len(it["grads"]), "|", color="k", ms=10, label="a gradient lands")
        for idx, numel, s, e, *_ in it["buckets"]:
            a.barh(1, (e - s) * ms, left=s * ms, color=plt.cm.tab10(idx % 10), height=0.6, edgecolor="k")
            a.text((s + e) / 2 * ms, 1, str(idx), ha="center", va="center", fontsize=8)
        a.set_yticks([0, 1], ["backward", "all-reduce\n(bucket #)"])
        a.set_ylim(-0.6, 1.6)
        if titles:
            a.set_title(titles[k], fontsize=10)
    axes[-1].set_xlabel("ms since backward started (rank 0)")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # outside: never over a bar
    plt.tight_layout()
    return axes


def measure_step(steps: int = 6, batch: int = 8, seed: int = 0) -> dict:
    """Inside a launched rank: DDP on the tiny GPT, `batch` sequences per rank (weak scaling), timed.

    Returns step_s (forward + backward with all-reduce + optimizer), local_s (the same step under
    `no_sync()`, i.e. no communication), each the median of `steps` timed steps after two untimed
    ones on this rank's clock, and samples_per_s for the whole group. Uses this rank's GPU when the
    launch put one there (NCCL), else the CPU (gloo).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = torch.cuda.is_available() and dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    model = tiny_gpt(seed).to(device)
    ddp = DDP(model, device_ids=[device.index] if on_gpu else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = (t.to(device) for t in tokens(n=batch, seed=seed + rank).tensors)  # (batch, T) each

    def step(sync: bool) -> None:
        if sync:
            ddp(x, y).backward()
        else:
            with ddp.no_sync():  # gradients stay local: the step without communication
                ddp(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # Two untimed steps: DDP rebuilds its buckets after the first; the median ignores a stolen core.
    # The ranks start each series together; within it, the all-reduce keeps them in step, and a
    # local step depends on no other rank: each rank times its own steps.
    gpu_sync = torch.cuda.synchronize if on_gpu else None  # stop the clock when the kernels have finished
    dist.barrier()
    step_s = time_it(lambda: step(True), repeats=steps, warmup=2, sync=gpu_sync).median
    dist.barrier()
    local_s = time_it(lambda: step(False), repeats=steps, warmup=2, sync=gpu_sync).median
    return {"step_s": step_s, "local_s": local_s, "samples_per_s": batch * world / step_s, "device": device.type}
