"""Where a data-parallel training step's time goes, read from `torch.profiler` on every rank (lesson 09).

    per_rank = profile_data_parallel(num_processes=2, steps=2, trace_dir="traces")
    per_rank[0]["compute_ms"], ["comm_ms"], ["other_ms"], ["wall_ms"], ["top_ops"], ["trace"]
    split_events(events)            # the same split from a profile's events (`events_of(prof)`)

Each rank trains the course's tiny GPT under DDP (gloo on CPU, NCCL on GPUs), warms up, then profiles
`steps` steps, each inside `record_function("train_step")`. The step's wall time is split into three
disjoint parts from the events' time intervals: **communication** (any collective, on any thread:
gloo/NCCL all-reduce, DDP's allreduce), **compute** (ATen ops on the training thread, outside
communication), **other** (the rest: Python, DDP bookkeeping, waiting); `overlap_ms` is the compute
that ran while a collective was in flight (counted under communication). Intervals, not durations:
profiler events nest (aten::linear contains aten::addmm), so adding their durations counts time twice.
Each rank writes its Chrome trace (`chrome://tracing` or https://ui.perfetto.dev) to `trace_dir/rank{r}.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from m11_helpers.validate import non_negative_int, positive_int

__all__ = ["COMM_MARKERS", "is_comm", "Event", "events_of", "union_length", "split_step_time", "split_events",
           "profile_dp_step", "profile_data_parallel"]

STEP = "train_step"  # the record_function label of one training step

# Substrings of profiler event names that are communication (gloo, NCCL, c10d ops, DDP's reducer).
COMM_MARKERS = ("gloo:", "nccl:", "c10d::", "allreduce", "all_reduce", "all_gather", "reduce_scatter",
                "broadcast", "ncclDevKernel", "ncclKernel")


def is_comm(name: str) -> bool:
    """True when a profiler event name is a collective (see COMM_MARKERS)."""
    return any(m in name for m in COMM_MARKERS)


class Event(NamedTuple):
    """One profiler event, as plain data: its name, the thread it ran on, start and end in µs."""

    name: str
    thread: int
    start: float
    end: float


def events_of(prof) -> list[Event]:
    """The events of a finished `torch.profiler.profile`, as `Event`s (picklable: ranks can return them)."""
    return [Event(e.name, int(e.thread), float(e.time_range.start), float(e.time_range.end)) for e in prof.events()]


def _merge(intervals):
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def union_length(intervals) -> float:
    """Length of the union of [start, end) intervals (overlaps counted once)."""
    return sum(e - s for s, e in _merge(intervals))


def _clip(intervals, windows):
    return [(max(s, ws), min(e, we)) for s, e in intervals for ws, we in windows if min(e, we) > max(s, ws)]


def split_step_time(windows, compute, comm) -> dict[str, float]:
    """Split the steps' wall time Σ|windows| into disjoint comm, compute (outside comm) and other.

    comm = |∪comm ∩ windows|; compute = |∪(compute ∪ comm) ∩ windows| − comm; other = wall − both.
    Compute that runs while a collective is in flight counts as comm; its length is `overlap`.
    """
    for name, iv in (("windows", windows), ("compute", compute), ("comm", comm)):
        if any(e < s for s, e in iv):
            raise ValueError(f"{name} holds an interval with end < start")
    wall = union_length(windows)
    comm_t = union_length(_clip(comm, windows))
    comp_t = union_length(_clip(compute, windows))
    busy = union_length(_clip(list(compute) + list(comm), windows))
    return {"wall": wall, "comm": comm_t, "compute": busy - comm_t, "other": wall - busy,
            "overlap": max(0.0, comp_t + comm_t - busy)}  # max: float rounding gives -0.0


def split_events(events: list[Event]) -> dict[str, float]:
    """`split_step_time` over a profile's events: windows = the `train_step` events, communication = any
    `is_comm` event (any thread), compute = `aten::` events on the steps' thread that are not communication."""
    steps = [e for e in events if e.name == STEP]
    if not steps:
        raise ValueError(f"events must include at least one {STEP!r} event (record_function around each step)")
    main = steps[0].thread
    windows = [(e.start, e.end) for e in steps]
    comm = [(e.start, e.end) for e in events if is_comm(e.name)]
    compute = [(e.start, e.end) for e in events
               if e.thread == main and e.name.startswith("aten::") and not is_comm(e.name)]
    return split_step_time(windows, compute, comm)


def profile_dp_step(steps: int = 2, batch: int = 8, warmup: int = 2, trace_dir: str | None = None,
                    top: int = 6, return_events: bool = False) -> dict:
    """Run on each rank (inside `launch`): DDP tiny GPT, warm up, profile `steps` steps; return the split
    (and, with return_events=True, the profile's `Event`s under "events")."""
    positive_int("steps", steps)
    positive_int("batch", batch)
    non_negative_int("warmup", warmup)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    rank = dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model = DDP(tiny_gpt(0).to(dev))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, tgt = (t.to(dev) for t in tokens(batch, seed=rank).tensors)  # each rank its own shard

    def train_step() -> None:
        model(idx, tgt).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):  # DDP's first iteration uses one bucket; the real buckets start after
        train_step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            with record_function(STEP):
                train_step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
    events = events_of(prof)
    split = split_events(events)
    self_ms: dict[str, float] = {}
    for e in prof.events():
        if e.name.startswith("aten::"):
            self_ms[e.name] = self_ms.get(e.name, 0.0) + e.self_cpu_time_total / 1e3 / steps
    trace = None
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        trace = str(Path(trace_dir) / f"rank{rank}.json")
        prof.export_chrome_trace(trace)
    return {"rank": rank, "wall_ms": split["wall"] / 1e3 / steps, "compute_ms": split["compute"] / 1e3 / steps,
            "comm_ms": split["comm"] / 1e3 / steps, "other_ms": split["other"] / 1e3 / steps,
            "overlap_ms": split["overlap"] / 1e3 / steps,
            "top_ops": sorted(self_ms.items(), key=lambda kv: -kv[1])[:top], "trace": trace,
            **({"events": events} if return_events else {})}


def profile_data_parallel(num_processes: int = 2, steps: int = 2, batch: int = 8, trace_dir: str | None = None,
                          timeout: float = 120, show_output: bool = False, warmup: int = 2,
                          return_events: bool = False) -> list[dict]:
    """`profile_dp_step` on `num_processes` real ranks via `launch`; one dict per rank, rank order."""
    positive_int("num_processes", num_processes)
    from torch.profiler import profile  # noqa: F401 - import once here; forked ranks inherit it

    from m11_helpers.launch import launch

    return launch(profile_dp_step, steps=steps, batch=batch, warmup=warmup, trace_dir=trace_dir,
                  return_events=return_events, num_processes=num_processes, timeout=timeout, show_output=show_output)
