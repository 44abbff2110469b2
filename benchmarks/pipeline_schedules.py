"""Pipeline schedules measured side by side: GPipe against 1F1B on 4 real ranks, and both against the bubble formula.

    python benchmarks/pipeline_schedules.py [--repeats 3] [--microbatches 4 8]

Lesson 04 states that 1F1B keeps GPipe's bubble, (p−1)/(m+p−1), and only lowers the activations held;
this runs both schedules of `torch.distributed.pipelining` on the tiny GPT cut into 4 stages, with each
stage's "kernel time" emulated by a fixed delay (`time.sleep` frees the core, so 4 ranks on 2 cores
behave like 4 devices), interleaved in one launch. Step time is the makespan of the stages' recorded
compute intervals (first start to last end); the script prints each schedule's median, the ratio
1F1B / GPipe (≈ 1: same bubble) and the measured idle fraction next to the formula (a few points above:
every hand-off costs a message and a wake-up the formula counts as free).
"""

from __future__ import annotations

import argparse
import statistics

from m11_helpers.launch import launch
from m11_helpers.pipeline import bubble_fraction, timeline_bubble
from m11_helpers.pipeline_run import gather, run_schedules

STAGES = 4
T_F, T_B = 0.02, 0.04  # seconds of emulated device time per micro-batch, forward and backward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    args = ap.parse_args()
    configs = [(s, m) for _ in range(args.repeats) for m in args.microbatches for s in ("gpipe", "1f1b")]
    per_rank = launch(run_schedules, configs, 8, 0, T_F, T_B, num_processes=STAGES, timeout=600, show_output=False)
    spans: dict[tuple[str, int], list[float]] = {}
    bubbles: dict[tuple[str, int], list[float]] = {}
    for k, key in enumerate(configs):
        ops = gather([r[k] for r in per_rank])["ops"]
        spans.setdefault(key, []).append(max(o.end for o in ops) - min(o.start for o in ops))
        bubbles.setdefault(key, []).append(timeline_bubble(ops))
    print(f"{STAGES} stages, forward {T_F * 1e3:.0f} ms / backward {T_B * 1e3:.0f} ms per micro-batch, "
          f"median of {args.repeats}")
    for m in args.microbatches:
        g, f = (statistics.median(spans[(s, m)]) for s in ("gpipe", "1f1b"))
        print(f"m={m}: GPipe {g * 1e3:6.0f} ms, 1F1B {f * 1e3:6.0f} ms, ratio 1F1B/GPipe {f / g:.2f}; idle "
              f"GPipe {statistics.median(bubbles[('gpipe', m)]):.1%}, 1F1B {statistics.median(bubbles[('1f1b', m)]):.1%}, "
              f"formula {bubble_fraction(STAGES, m):.1%}")


if __name__ == "__main__":
    main()
