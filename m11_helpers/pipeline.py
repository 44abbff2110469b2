"""Pipeline schedules as pure functions: the bubble, who runs what and when, and the timeline's chart (lesson 04).

    ops = simulate(stages=4, microbatches=8, schedule="1f1b")       # a timeline of Op(stage, kind, micro, …)
    plot_timeline(ops); timeline_bubble(ops)                          # == bubble_fraction(4, 8)
    tick_table(4, 8, "1f1b")                                          # {(tick, stage): "F3"}, one tick per op

Conventions: p stages (one per device), m micro-batches, v model chunks per device (interleaved).
"bubble" here is the *idle fraction of the whole step*, (p−1)/(m+p−1); the Megatron-LM paper
(Narayanan et al. 2021, §2.2.1) quotes bubble time over ideal time instead, (p−1)/m.
The real pipelined runs are in `m11_helpers.pipeline_run`, the messages between stages in
`m11_helpers.pipeline_comm` (as picotron keeps `pp_communications.py` apart from its schedules).
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import one_of, positive_int, positive_real

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclasses.dataclass(frozen=True)
class Op:
    """One busy interval on one device: forward ('F') or backward ('B') of micro-batch `micro`."""

    stage: int  # the device (pipeline rank)
    kind: str  # "F" or "B"
    micro: int
    start: float
    end: float
    chunk: int = 0  # model chunk on this device (interleaved schedule only)


def _check(stages: int, microbatches: int, schedule: str, chunks: int) -> None:
    for name, value in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)):
        positive_int(name, value)
    one_of("schedule", schedule, SCHEDULES)
    if schedule != "interleaved" and chunks != 1:
        raise ValueError(f"chunks must be 1 for schedule={schedule!r} (only 'interleaved' has chunks), got {chunks}")
    if schedule == "interleaved" and microbatches % stages:
        raise ValueError(f"microbatches ({microbatches}) must be a multiple of stages ({stages}) for 'interleaved' "
                         "(Narayanan et al. 2021, §2.2.2)")


def bubble_fraction(stages: int, microbatches: int, schedule: str = "gpipe", chunks: int = 1) -> float:
    """Idle fraction of a step: (p−1)/(v·m + p−1) (GPipe, Huang et al. 2019 §2.2; v=1 for GPipe and 1F1B;
    interleaved: Narayanan et al. 2021 §2.2.2, whose bubble/ideal ratio is (p−1)/(v·m))."""
    _check(stages, microbatches, schedule, chunks)
    return (stages - 1) / (chunks * microbatches + stages - 1)


def schedule_order(stages: int, microbatches: int, schedule: str = "gpipe", chunks: int = 1) -> list[list[tuple]]:
    """For each device, the order it runs its work in: a list of (kind, micro, chunk)."""
    _check(stages, microbatches, schedule, chunks)
    p, m, v = stages, microbatches, chunks
    orders = []
    for s in range(p):
        if schedule == "gpipe":  # fill, then drain: every forward before any backward
            order = [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
        else:
            # Forwards and backwards in the order this device must do them; interleaved takes
            # micro-batches in groups of p through each chunk (Megatron-LM's schedule).
            fwd = [("F", (k // (p * v)) * p + k % p, (k // p) % v) for k in range(m * v)]
            bwd = [("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v) for k in range(m * v)]
            # Warm-up forwards: enough to keep the later stages busy (PipeDream-Flush, Narayanan et al. 2021 §2.2.1).
            warm = p - s - 1 if v == 1 else min((p - s - 1) * 2 + (v - 1) * p, m * v)
            warm = min(warm, m * v)
            order = fwd[:warm]
            for i in range(m * v - warm):  # steady state: one forward, one backward
                order += [fwd[warm + i], bwd[i]]
            order += bwd[m * v - warm:]
        orders.append(order)
    return orders


def simulate(stages: int, microbatches: int, schedule: str = "gpipe", chunks: int = 1,
             t_f: float = 1.0, t_b: float = 2.0) -> list[Op]:
    """The timeline of a schedule: each op starts when its device is free and its input has arrived.

    Forward of (chunk c, micro i) on device s needs the forward on the previous virtual stage;
    backward needs the backward of the next virtual stage (or this stage's own forward at the end).
    Communication is free; a chunk's forward takes t_f / v, its backward t_b / v.
    """
    positive_real("t_f", t_f)
    positive_real("t_b", t_b)
    orders = schedule_order(stages, microbatches, schedule, chunks)
    p, v = stages, chunks
    done: dict[tuple, float] = {}  # (kind, virtual stage, micro) -> end time
    free = [0.0] * p
    pos = [0] * p
    ops: list[Op] = []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i, c = orders[s][pos[s]]
            vs = c * p + s  # virtual stage: chunk c of device s
            if kind == "F":
                dep = ("F", vs - 1, i) if vs > 0 else None
            else:
                dep = ("B", vs + 1, i) if vs < p * v - 1 else ("F", vs, i)
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done[dep] if dep else 0.0)
            end = start + (t_f if kind == "F" else t_b) / v
            done[(kind, vs, i)] = free[s] = end
            ops.append(Op(s, kind, i, start, end, c))
            pos[s] += 1
            progressed = True
        if not progressed:  # an order that waits on itself: a bug in schedule_order, never silent
            raise RuntimeError("schedule deadlocked")
    return sorted(ops, key=lambda o: (o.start, o.stage))


def timeline_bubble(ops: list[Op]) -> float:
    """Idle fraction: 1 − Σ busy / (devices × makespan), makespan from the first start to the last end."""
    if not ops:
        raise ValueError("ops must not be empty")
    devices = {o.stage for o in ops}
    span = max(o.end for o in ops) - min(o.start for o in ops)
    return 1.0 - sum(o.end - o.start for o in ops) / (len(devices) * span)


def peak_in_flight(ops: list[Op]) -> dict[int, int]:
    """Per device, the most micro-batch chunks whose forward is done and backward is not (activations held)."""
    peak: dict[int, int] = {}
    for s in sorted({o.stage for o in ops}):
        live = best = 0
        for o in sorted((o for o in ops if o.stage == s), key=lambda o: o.start):
            live += 1 if o.kind == "F" else -1
            best = max(best, live)
        peak[s] = best
    return peak


def schedule_table(ops: list[Op], tick: float = 1.0) -> dict[tuple[int, int], str]:
    """{(tick, stage): 'F3'} — which micro-batch each device works on at each tick (ops on a tick grid)."""
    return {(round(o.start / tick), o.stage): f"{o.kind}{o.micro}" for o in ops}


def tick_table(stages: int, microbatches: int, schedule: str = "1f1b") -> dict[tuple[int, int], str]:
    """The schedule on a tick grid: a forward or a backward of one micro-batch takes one tick, messages none."""
    return schedule_table(simulate(stages, microbatches, schedule, t_f=1.0, t_b=1.0))


def stage_orders(table: dict[tuple[int, int], str], stages: int) -> list[list[tuple[str, int]]]:
    """Per stage, the (kind, micro) it runs, in tick order: [('F', 0), ('F', 1), ('B', 0), …]."""
    positive_int("stages", stages)
    return [[(table[k][0], int(table[k][1:])) for k in sorted(k for k in table if k[1] == s)] for s in range(stages)]


def table_rows(table: dict[tuple[int, int], str], stages: int) -> list[list[str]]:
    """The table as rows for `show_table`: one row per stage, one column per tick ('' when idle)."""
    ticks = 1 + max(t for t, _ in table)
    return [[f"stage {s}"] + [table.get((t, s), "") for t in range(ticks)] for s in range(positive_int("stages", stages))]


def plot_timeline(ops: list[Op], ax=None, title: str = "", unit: str = "time"):
    """A Gantt chart: one row per device, forward blue, backward green, chunk shade, micro-batch number."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len({o.stage for o in ops})))
    colours = {"F": ("#4c72b0", "#9bb4dc"), "B": ("#55a868", "#a6d5b1")}
    t0 = min(o.start for o in ops)
    for o in ops:
        ax.barh(o.stage, o.end - o.start, left=o.start - t0, height=0.8,
                color=colours[o.kind][o.chunk % 2], edgecolor="white", linewidth=0.5)
        ax.text((o.start + o.end) / 2 - t0, o.stage, str(o.micro), ha="center", va="center", fontsize=7)
    ax.set_yticks(sorted({o.stage for o in ops}))
    ax.set_yticklabels([f"stage {s}" for s in sorted({o.stage for o in ops})])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title or f"bubble {timeline_bubble(ops):.1%}")
    ax.grid(False)
    return ax
