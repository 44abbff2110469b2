"""Schedules past 1F1B side by side on 4 real ranks: bubble, activation memory and bytes, as ratios to 1F1B.

    python benchmarks/pipeline_zero_bubble.py [--microbatches 8 16] [--layers 8] [--tick-ms 10]

Runs 1F1B, interleaved 1F1B, ZB-H1 (torch's ZB1P), ZB-V and DualPipeV of `torch.distributed.pipelining`
once per micro-batch count, records the order each device executed, replays it on a tick grid
(F = B = W = 1 tick per layer, messages free: `m11_helpers.pipeline_ticks`) and prints the idle ticks next
to each paper's formula, the peak saved activations per device (saved-tensor hooks) and the bytes of
activations and gradients sent, each also as a ratio to 1F1B, and what a step leaves held. The same step
also runs with every op sleeping --tick-ms per tick (sleep frees the core: 4 ranks act as 4 devices), and
the wall-clock idle share of those spans is printed next to the tick replay's: what the ticks leave out
(messages, Python between ops) shows as the difference.
"""

from __future__ import annotations

import argparse

from m11_helpers.display import show_table
from m11_helpers.launch import launch
from m11_helpers.pipeline_ticks import bubble_fraction, bubble_ticks, idle_ticks, replay
from m11_helpers.pipeline_zb import SCHEDULES, gather, run_schedules

DEVICES = 4


def wall_bubble(spans: dict[int, list]) -> float:
    """1 − Σ busy / (devices × makespan) over the recorded (kind, stage, micro, start, end) spans."""
    all_spans = [sp for rank in spans.values() for sp in rank]
    start, end = min(sp[3] for sp in all_spans), max(sp[4] for sp in all_spans)
    return 1 - sum(sp[4] - sp[3] for sp in all_spans) / (len(spans) * (end - start))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tick-ms", type=float, default=10.0)
    args = ap.parse_args()
    for m in args.microbatches:
        runs = gather(launch(run_schedules, list(SCHEDULES), m, 0, args.layers, args.tick_ms / 1e3,
                             num_processes=DEVICES, timeout=600, show_output=False))
        base = runs["1f1b"]
        base_idle = max(idle_ticks(replay(base["orders"], base["layers"])).values())
        rows = []
        for name, r in runs.items():
            ops = replay(r["orders"], r["layers"])
            idle, peak, sent = max(idle_ticks(ops).values()), max(r["peak_activation_bytes"].values()), sum(r["sent_bytes"].values())
            rows.append([name, idle, f"{bubble_ticks(name, DEVICES, args.layers):g}", f"{bubble_fraction(ops):.1%}",
                         f"{wall_bubble(r['spans']):.1%}",
                         f"{idle / base_idle:.2f}", peak, f"{peak / max(base['peak_activation_bytes'].values()):.2f}",
                         sent, f"{sent / sum(base['sent_bytes'].values()):.2f}", max(r["left_after_step_bytes"].values())])
        show_table(rows, ["schedule", "idle ticks", "formula", "bubble", "wall-clock", "× 1F1B", "peak act. B", "× 1F1B",
                          "bytes sent", "× 1F1B", "left after step B"],
                   title=f"{DEVICES} devices, {args.layers} layers, {m} micro-batches")


if __name__ == "__main__":
    main()
