"""Lesson 04 — the bubble of a schedule, measured in ticks from the order torch actually ran, against its formula.

    orders = [r["order"] for r in launch(run_schedules, ["zbv"], num_processes=4)[...]]  # pipeline_zb
    t = replay(orders, layers=layers_per_stage)        # every op on a tick grid: F = B = W = 1 tick per layer
    idle_ticks(t)                                       # per device, ticks spent waiting
    bubble_ticks("zb1p", devices=4, layers=8)           # the paper's (p−1)(F+B−W), in the same ticks

An order is one device's list of (kind, stage, micro): kind "F" forward, "B" input-gradient backward,
"W" weight-gradient backward, "BW" the fused backward (B then W at once). `replay` starts each op when
its device is free and its input exists — F(s, i) after F(s−1, i); B or BW(s, i) after the backward
of (s+1, i), or after F(s, i) on the last stage; W(s, i) after B(s, i) — with messages free, so
the idle ticks are the schedule's own bubble, not this machine's noise.

Formulas, per device, with F, B, W one stage's times (B = input gradient only):
  1F1B         (p−1)(F+B+W)                      Narayanan et al. 2021 §2.2.1; Qi et al. 2024 §2, Fig. 3
  interleaved  (p−1)(F+B+W)/v                     Narayanan et al. 2021 §2.2.2
  ZB-H1        (p−1)(F+B−W)                      Qi et al. 2024 "Zero Bubble Pipeline Parallelism" §2.1
  ZB-V         0 when F = B = W                   Qi et al. 2024 §6 (2 chunks per device, V-shaped)
  DualPipeV    (PP/2−1)(F&B + B_full − 3W)         DeepSeek-V3 report (arXiv 2412.19437) Table 2; DualPipe README
For DualPipeV F, B_full = B+W and W are one *chunk's* times (PP = 2p chunks) and F&B is a forward and a
backward run together; on a CPU nothing overlaps, so F&B = F + B_full here.
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import one_of, positive_int

__all__ = ["TickOp", "replay", "idle_ticks", "busy_ticks", "bubble_ticks", "bubble_fraction", "FORMULAS", "WHEN",
           "schedule_table", "TABLE_HEADER",
           "tick_rows", "in_flight", "zb_h1_order", "plot_ticks"]

FORMULAS = {
    "1f1b": "(p−1)(F+B+W)",
    "interleaved": "(p−1)(F+B+W)/v",
    "zb1p": "(p−1)(F+B−W)",
    "zbv": "0 (F = B = W)",
    "dualpipev": "(PP/2−1)(F&B+B+W−3W)",
}
_COST = {"F": 1, "B": 1, "W": 1, "BW": 2}  # ticks per layer (Qi et al.'s T_F = T_B = T_W)


@dataclasses.dataclass(frozen=True)
class TickOp:
    """One op on the tick grid: device, kind, stage, micro-batch, start and end tick."""

    device: int
    kind: str
    stage: int
    micro: int
    start: int
    end: int


def replay(orders: list[list[tuple[str, int, int]]], layers: dict[int, int] | int = 1) -> list[TickOp]:
    """Each device runs its recorded order; an op starts when the device is free and its input exists.

    `layers`: layers per stage (a dict stage -> layers, or one int for all), so an op costs
    _COST[kind] × layers ticks and schedules with different stage sizes compare in the same ticks.
    """
    if not orders:
        raise ValueError("orders must hold one list per device, got none")
    stages = {s for order in orders for _, s, _ in order}
    last = max(stages)
    size = layers if isinstance(layers, dict) else {s: positive_int("layers", layers) for s in stages}
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, micro) -> end tick; "B" also stands for BW
    free, pos, ops = [0] * len(orders), [0] * len(orders), []
    while any(pos[d] < len(o) for d, o in enumerate(orders)):
        progressed = False
        for d, order in enumerate(orders):
            if pos[d] == len(order):
                continue
            kind, s, i = order[pos[d]]
            one_of("kind", kind, tuple(_COST))
            if kind == "F":
                dep = ("F", s - 1, i) if s > 0 else None
            elif kind == "W":
                dep = ("B", s, i)
            else:
                dep = ("B", s + 1, i) if s < last else ("F", s, i)
            if dep is not None and dep not in done:
                continue
            start = max(free[d], done[dep] if dep else 0)
            end = start + _COST[kind] * size[s]
            done[("B" if kind == "BW" else kind, s, i)] = free[d] = end
            ops.append(TickOp(d, kind, s, i, start, end))
            pos[d] += 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"the orders wait on each other (deadlock) at positions {pos}")
    return ops


def busy_ticks(ops: list[TickOp]) -> dict[int, int]:
    """Per device, ticks spent computing."""
    busy: dict[int, int] = {}
    for o in ops:
        busy[o.device] = busy.get(o.device, 0) + o.end - o.start
    return busy


def idle_ticks(ops: list[TickOp]) -> dict[int, int]:
    """Per device, ticks of the step spent waiting: makespan − busy (the bubble, device by device)."""
    span = max(o.end for o in ops)
    return {d: span - b for d, b in sorted(busy_ticks(ops).items())}


def bubble_fraction(ops: list[TickOp]) -> float:
    """Idle share of the step over all devices: Σ idle / (devices × makespan)."""
    idle = idle_ticks(ops)
    return sum(idle.values()) / (len(idle) * max(o.end for o in ops))


def bubble_ticks(schedule: str, devices: int, layers: int, chunks: int = 2) -> float:
    """The formula's idle ticks per device, with F = B = W = 1 tick per layer and `layers` layers in all.

    A stage of the single-chunk schedules holds layers/p layers; a chunk of the two-chunk ones layers/(v·p).
    """
    one_of("schedule", schedule, tuple(FORMULAS))
    p, n = positive_int("devices", devices), positive_int("layers", layers)
    if n % (p * chunks):
        raise ValueError(f"layers ({n}) must be a multiple of devices × chunks ({p} × {chunks})")
    f = b = w = n / p  # one stage of a single-chunk schedule
    if schedule == "1f1b":
        return (p - 1) * (f + b + w)
    if schedule == "interleaved":
        return (p - 1) * (f + b + w) / positive_int("chunks", chunks)
    if schedule == "zb1p":
        return (p - 1) * (f + b - w)
    if schedule == "zbv":
        return 0.0
    f = w = n / (2 * p)  # DualPipeV: PP = 2p chunks
    b_full = 2 * f
    pp = 2 * p
    return (pp / 2 - 1) * ((f + b_full) + b_full - 3 * w)


def in_flight(ops: list[TickOp]) -> dict[int, int]:
    """Per device, the most (stage, micro) whose forward ran and whose graph is not yet freed (by W or BW).

    torch's input-gradient backward keeps the whole graph (retain_graph) for the weight gradient, so a
    micro-batch's activations stay until its W.
    """
    peak: dict[int, int] = {}
    for d in sorted({o.device for o in ops}):
        live = best = 0
        for o in sorted((o for o in ops if o.device == d), key=lambda o: o.start):
            live += {"F": 1, "W": -1, "BW": -1}.get(o.kind, 0)
            best = max(best, live)
        peak[d] = best
    return peak


def tick_rows(ops: list[TickOp]) -> list[list[str]]:
    """One row per device, one column per tick: 'F3', 'B3', 'W3' (micro 3; stage as a suffix when two chunks)."""
    span = max(o.end for o in ops)
    chunks = {o.device: {x.stage for x in ops if x.device == o.device} for o in ops}
    rows = []
    for d in sorted(chunks):
        row = [""] * span
        for o in (o for o in ops if o.device == d):
            label = f"{o.kind}{o.micro}" + (f"@{o.stage}" if len(chunks[d]) > 1 else "")
            for t in range(o.start, o.end):
                row[t] = label
        rows.append([f"device {d}"] + row)
    return rows


_COLOURS = {"F": "#4c72b0", "B": "#55a868", "W": "#dd8452", "BW": "#2e6b3f"}  # forward, input grad, weight grad, both


def plot_ticks(ops: list[TickOp], ax=None, title: str = ""):
    """A Gantt chart of a replay: one row per device, F blue, B green, W orange, BW dark green; the micro-batch inside.

    The second chunk of a two-chunk device is drawn lighter, so a V or a loop reads at a glance.
    """
    import matplotlib.pyplot as plt

    devices = sorted({o.device for o in ops})
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(devices)))
    first = {d: min(o.stage for o in ops if o.device == d) for d in devices}
    for o in ops:
        ax.barh(o.device, o.end - o.start, left=o.start, height=0.8, color=_COLOURS[o.kind],
                alpha=1.0 if o.stage == first[o.device] else 0.55, edgecolor="white", linewidth=0.5)
        ax.text((o.start + o.end) / 2, o.device, str(o.micro), ha="center", va="center", fontsize=7)
    ax.set_yticks(devices)
    ax.set_yticklabels([f"device {d}" for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("ticks (F = B = W = 1 per layer)")
    ax.set_title(title or f"bubble {bubble_fraction(ops):.1%}")
    return ax


WHEN = {
    "1f1b": "the baseline: fewest activations, falling stage by stage",
    "interleaved": "bubble ÷ v, for more messages and more micro-batch chunks in flight",
    "zb1p": "bubble ÷ 3 with 1F1B's messages; needs a split backward (W waits, holding its activations)",
    "zbv": "only the fill is left; two chunks per device: 2× the messages",
    "dualpipev": "ZB-V's bubble here, one more micro-batch held; wins when a forward and a backward overlap "
                 "(hiding MoE all-to-all), which a CPU tick grid cannot show",
}


def schedule_table(merged: dict[str, dict], devices: int, layers: int) -> list[list]:
    """Rows for `show_table`: schedule, idle ticks measured / formula, bubble %, peak activations, bytes sent, when.

    `merged` is `m11_helpers.pipeline_zb.gather`'s result; bubble measured by `replay` of the recorded orders.
    """
    rows = []
    for name, r in merged.items():
        ops = replay(r["orders"], r["layers"])
        idle = idle_ticks(ops)
        rows.append([name, max(idle.values()), f"{bubble_ticks(name, devices, layers):g}", f"{bubble_fraction(ops):.1%}",
                     max(r["peak_activation_bytes"].values()), max(in_flight(ops).values()),
                     sum(r["sent_bytes"].values()), sum(r["messages"].values()), WHEN[name]])
    return rows


TABLE_HEADER = ["schedule", "idle ticks", "formula", "bubble", "peak activations (B)", "in flight",
                "bytes sent", "messages", "when it wins"]


def zb_h1_order(devices: int, microbatches: int) -> list[list[tuple[str, int, int]]]:
    """ZB-H1 per device (one stage each): 1F1B with B and W apart, W held back s rounds on device s.

    Device s: p − s warm-up forwards; s rounds of (B, F) with no W — the W's this delays are what fills the
    tail bubble; then (B, W, F) while forwards remain, (B, W) while backwards remain, and the last W's
    (Qi et al. 2024, §2.1, Fig. 3 top). It is the order torch 2.13's ScheduleInterleavedZeroBubble runs
    with one stage per device (tests/test_pipeline_zb.py checks it against the recorded order).
    """
    p, m = positive_int("devices", devices), positive_int("microbatches", microbatches)
    orders = []
    for s in range(p):
        f = b = w = 0
        order: list[tuple[str, int, int]] = []

        def put(kind: str) -> None:
            nonlocal f, b, w
            i = {"F": f, "B": b, "W": w}[kind]
            order.append((kind, s, i))
            f, b, w = f + (kind == "F"), b + (kind == "B"), w + (kind == "W")

        for _ in range(min(p - s, m)):
            put("F")
        for _ in range(s):
            if b < f:
                put("B")
            if f < m:
                put("F")
        while f < m:
            put("B"), put("W"), put("F")
        while b < m:
            put("B"), put("W")
        while w < m:
            put("W")
        orders.append(order)
    return orders
