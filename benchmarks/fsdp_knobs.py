"""FSDP's knobs side by side on 4 real ranks: peak memory and bytes on the wire, as ratios to plain ZeRO-3.

    python benchmarks/fsdp_knobs.py

Part 1, FSDP2 itself (`m11_helpers.fsdp2_knobs`): reshard_after_forward True / False / 2 (hpZ), explicit
2-block prefetch, bf16 parameters, CPUOffloadPolicy — forward and backward peaks (tensor bytes alive,
`m11_helpers.live_memory`) and all-gather / reduce-scatter wire bytes per rank, each over reshard=True.
Part 2, the hand-built FSDP (`m11_helpers.fsdp_prefetch`): prefetch depth 0 / 1 / 2 in fp32 and bf16 —
the memory prefetching costs, the bytes casting before the gather saves, and how many gathers had
already arrived when their layer waited (their time hidden behind compute; timing-dependent). Byte counts, not seconds:
on 2 shared cores the clock measures the machine, not the overlap.
"""

from __future__ import annotations

from m11_helpers.display import show_table
from m11_helpers.fsdp2_knobs import KNOBS, measure_knobs
from m11_helpers.fsdp_prefetch import run_prefetch
from m11_helpers.launch import launch


def main() -> None:
    knobs = launch(measure_knobs, list(KNOBS), num_processes=4, timeout=600, show_output=False)[0]
    base = knobs["reshard=True"]
    rows = [[k, r["forward_peak"], f"{r['forward_peak'] / base['forward_peak']:.2f}", r["backward_peak"],
             f"{r['backward_peak'] / base['backward_peak']:.2f}", r["gathers"], round(r["gather_wire_bytes"]),
             f"{r['gather_wire_bytes'] / base['gather_wire_bytes']:.2f}", round(r["scatter_wire_bytes"]),
             f"{r['grad_error']:.1e}"] for k, r in knobs.items()]
    show_table(rows, ["FSDP2 setting", "fwd peak B", "×", "bwd peak B", "×", "gathers", "gather B", "×",
                      "scatter B", "grad err"], title="FSDP2 on the tiny GPT, 4 ranks (per rank; × = over reshard=True)")
    configs = [(k, d) for d in ("float32", "bfloat16") for k in (0, 1, 2)]
    hand = launch(run_prefetch, configs, num_processes=4, timeout=600, show_output=False)[0]
    base = hand[0]
    rows = [[r["prefetch"], r["dtype"], r["max_ahead"], r["peak_full_layers"], r["forward_peak"],
             f"{r['forward_peak'] / base['forward_peak']:.2f}", r["backward_peak"],
             f"{r['backward_peak'] / base['backward_peak']:.2f}", sum(r["layer_bytes"]),
             f"{sum(r['ready_at_wait'])}/{len(r['ready_at_wait'])}"] for r in hand]
    show_table(rows, ["prefetch", "dtype", "ahead", "layers whole", "fwd peak B", "×", "bwd peak B", "×",
                      "gathered B (1 pass)", "arrived before wait"], title="hand-built FSDP, 4 ranks (× = over prefetch 0, fp32)")


if __name__ == "__main__":
    main()
