"""Cloud training arithmetic: how often to checkpoint, what preemptions waste, what spot capacity costs.

    young_interval(120, 3 * 3600) / 60         # 26.8 min  (Young 1974)
    daly_interval(120, 3 * 3600) / 60          # 25.5 min  (Daly 2006, higher order)
    simulate_wall_time(10 * 3600, 26.8 * 60, 120, 3 * 3600, trials=2000)   # Monte Carlo check
    best_checkpoint_count(8 * 3600, 120, 3 * 3600)                         # 18 (W/τ_Young = 17.9 segments)
    spot_cost(100, PRICES["p4d.24xlarge"].usd_per_hour, discount=ASSUMED_SPOT_DISCOUNT, preemptions_per_hour=0.1)

All times in seconds. Failures (preemptions) are modelled as a Poisson process with mean time
between them M (exponential inter-arrival times), as in both papers. Lesson 10. The launch
commands (multi-node, SLURM, SageMaker) are in `m11_helpers.cloud_launch`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from m11_helpers.validate import fraction, non_negative_int, non_negative_real, positive_int, positive_real

__all__ = ["young_interval", "daly_interval", "expected_wall_time", "simulate_wall_time", "wasted_fraction_curve",
           "segment_time", "wall_time_with_checkpoints", "best_checkpoint_count", "Price", "PRICES",
           "PRICE_CUT_2025", "ASSUMED_SPOT_DISCOUNT", "SPOT_DISCOUNT_RANGES", "Notice", "NOTICES", "CAPACITY_OPTIONS",
           "failures_per_hour", "spot_cost"]


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """τ = √(2 δ M): the checkpoint interval that minimises expected lost time (Young 1974, eq. 1)."""
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2 * d * m)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """τ = √(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, else M (Daly 2006, higher-order optimum).

    τ here is compute time between checkpoints (the checkpoint's own δ excluded).
    """
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def expected_wall_time(work_seconds: float, interval_seconds: float, checkpoint_seconds: float,
                       mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """T = M e^{R/M} (e^{(τ+δ)/M} − 1) · W/τ: expected wall time under exponential failures (Daly 2006, full model)."""
    w = positive_real("work_seconds", work_seconds)
    tau = positive_real("interval_seconds", interval_seconds)
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    non_negative_real("restart_seconds", restart_seconds)
    return m * math.exp(restart_seconds / m) * math.expm1((tau + d) / m) * w / tau


def simulate_wall_time(work_seconds: float, interval_seconds: float, checkpoint_seconds: float,
                       mtbf_seconds: float, restart_seconds: float = 0.0, trials: int = 1000,
                       seed: int = 0) -> np.ndarray:
    """Monte Carlo: wall time of `trials` runs of `work_seconds` of compute, checkpointing every
    `interval_seconds` (cost δ), preempted at exponential times (mean M), each restart costing R
    and losing the work since the last checkpoint. Returns (trials,) wall times in seconds.
    """
    w = positive_real("work_seconds", work_seconds)
    tau = positive_real("interval_seconds", interval_seconds)
    d, m = positive_real("checkpoint_seconds", checkpoint_seconds), positive_real("mtbf_seconds", mtbf_seconds)
    non_negative_real("restart_seconds", restart_seconds)
    positive_int("trials", trials)
    rng = np.random.default_rng(seed)
    n_seg = math.ceil(w / tau)
    seg = np.full(n_seg, tau)
    seg[-1] = w - tau * (n_seg - 1)
    need = seg + d
    need[-1] = seg[-1]  # no checkpoint after the last segment: the run is done
    out = np.empty(trials)
    for t in range(trials):
        clock = 0.0
        for length in need:  # each segment (+ its checkpoint) must run uninterrupted once
            while True:
                fail = rng.exponential(m)
                if fail >= length:
                    clock += length
                    break
                clock += fail + restart_seconds  # lost: the partial segment, then the restart
        out[t] = clock
    return out


def wasted_fraction_curve(intervals_seconds, work_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                          restart_seconds: float = 0.0, trials: int = 200, seed: int = 0):
    """For each interval: (simulated mean wasted fraction, model's wasted fraction); waste = 1 − W/T."""
    sim, model = [], []
    for i, tau in enumerate(intervals_seconds):
        t = simulate_wall_time(work_seconds, tau, checkpoint_seconds, mtbf_seconds, restart_seconds, trials, seed + i)
        sim.append(1 - work_seconds / t.mean())
        model.append(1 - work_seconds / expected_wall_time(work_seconds, tau, checkpoint_seconds, mtbf_seconds,
                                                           restart_seconds))
    return np.array(sim), np.array(model)


def segment_time(length_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """E(L) = M e^{R/M} (e^{L/M} − 1): expected time to get L seconds through uninterrupted (Daly 2006, §3).

    Each failure costs the work since the segment began plus a restart R; inf when it overflows.
    """
    m = positive_real("mtbf_seconds", mtbf_seconds)
    length = non_negative_real("length_seconds", length_seconds)
    r = non_negative_real("restart_seconds", restart_seconds)
    try:
        return m * math.exp(r / m) * math.expm1(length / m)
    except OverflowError:
        return math.inf


def wall_time_with_checkpoints(work_seconds: float, count: int, checkpoint_seconds: float, mtbf_seconds: float,
                               restart_seconds: float = 0.0) -> float:
    """T(n) = n·E(W/(n+1) + δ) + E(W/(n+1)): n checkpoints between n+1 equal segments, none after the last.

    The exact expectation of what `simulate_wall_time` simulates with τ = W/(n+1) (E from `segment_time`).
    """
    w = positive_real("work_seconds", work_seconds)
    n = non_negative_int("count", count)
    d = positive_real("checkpoint_seconds", checkpoint_seconds)
    tau = w / (n + 1)
    return n * segment_time(tau + d, mtbf_seconds, restart_seconds) + segment_time(tau, mtbf_seconds, restart_seconds)


def best_checkpoint_count(work_seconds: float, checkpoint_seconds: float, mtbf_seconds: float,
                          restart_seconds: float = 0.0) -> int:
    """argmin over n ≥ 0 of `wall_time_with_checkpoints`: the whole number of checkpoints for a job of known length.

    Young's τ is a continuous first-order optimum; W/τ rounded can miss the best count when δ/M is not small.
    """
    w, d = positive_real("work_seconds", work_seconds), positive_real("checkpoint_seconds", checkpoint_seconds)
    m = positive_real("mtbf_seconds", mtbf_seconds)
    guess = w / min(young_interval(d, m), daly_interval(d, m) + d)  # segments near the optimum
    candidates = range(0, int(4 * guess) + 4)  # T(n) is unimodal; the optimum is well inside this range
    return min(candidates, key=lambda n: (wall_time_with_checkpoints(w, n, d, m, restart_seconds), n))


# ---------------------------------------------------------------------------------------------
# What capacity costs: prices with their date and source, failure rates, spot vs on-demand
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Price:
    """One list price, with where and when it held: prices move, the date is part of the figure."""

    instance: str
    accelerators: str
    usd_per_hour: float
    terms: str
    valid: str
    source: str


PRICES = {
    "p4d.24xlarge": Price("p4d.24xlarge", "8 × A100 40 GB", 32.77, "On-Demand, Linux, us-east-1",
                          "from launch (Nov 2020) until the June 2025 cut", "aws.amazon.com/ec2/instance-types/p4/"),
    "p5.48xlarge": Price("p5.48xlarge", "8 × H100 80 GB", 98.32, "On-Demand, Linux, us-east-1",
                         "from launch (Jul 2023) until the June 2025 cut", "aws.amazon.com/ec2/instance-types/p5/"),
    # EC2 Capacity Blocks for ML: a reservation fee paid up front, "updated regularly based on trends in supply
    # and demand"; the page read said its prices were "scheduled to be updated on January 1, 2025".
    "p5.48xlarge capacity block": Price("p5.48xlarge", "8 × H100 80 GB", 39.33,
                                        "Capacity Block for ML, us-east-1 (effective instance hourly rate)",
                                        "late 2024, until the 2025-01-01 update",
                                        "aws.amazon.com/ec2/capacityblocks/pricing/"),
    "p4d.24xlarge capacity block": Price("p4d.24xlarge", "8 × A100 40 GB", 14.75,
                                         "Capacity Block for ML, us-east-2 (effective instance hourly rate)",
                                         "late 2024, until the 2025-01-01 update",
                                         "aws.amazon.com/ec2/capacityblocks/pricing/"),
}
# AWS What's New, June 2025, "Announcing up to 45% price reduction for Amazon EC2 NVIDIA GPU-accelerated
# instances": On-Demand and Savings Plans prices of P4 (P4d, P4de) and P5 (P5, P5en) down by up to 45 %.
# The per-instance prices after the cut are not in the sources we read: the course prints the range only.
PRICE_CUT_2025 = {"when": "June 2025", "up_to": 0.45, "instances": "P4d, P4de, P5, P5en",
                  "terms": "On-Demand and Savings Plans",
                  "source": "AWS What's New, June 2025: 'Announcing up to 45% price reduction for Amazon EC2 "
                            "NVIDIA GPU-accelerated instances'"}

# The spot discount the lesson's examples assume: a round figure inside both providers' published ranges,
# not a quoted price (AWS: Spot "up to 90%" off On-Demand, aws.amazon.com/ec2/spot/pricing; GCP: Spot VMs
# "60-91%" cheaper, cloud.google.com/spot-vms; both read 2026-12). Real discounts on recent GPUs vary by
# region and week, and are often far smaller: check the provider's spot price history.
ASSUMED_SPOT_DISCOUNT = 0.7
SPOT_DISCOUNT_RANGES = {"AWS Spot": "up to 90 % (aws.amazon.com/ec2/spot/pricing)",
                        "GCP Spot VMs": "60–91 % (cloud.google.com/spot-vms)"}


@dataclasses.dataclass(frozen=True)
class Notice:
    """How long a provider warns before it reclaims spare capacity, and how the warning arrives."""

    provider: str
    offering: str
    seconds: int
    delivered_as: str
    source: str
    as_of: str


NOTICES = [
    Notice("AWS", "EC2 Spot Instances", 120, "instance metadata (spot/instance-action) and an EventBridge event; "
           "your agent turns it into SIGTERM", "AWS EC2 User Guide, 'Spot Instance interruption notices'",
           "carried from the course's 2025 text, not re-read"),
    Notice("Google Cloud", "Spot VMs", 30, "ACPI G2 soft off: the OS sends SIGTERM to the processes",
           "Google Cloud Compute Engine docs, 'Spot VMs' (preemption process)",
           "carried from the course's 2025 text, not re-read"),
    Notice("Azure", "Spot Virtual Machines", 30, "a Scheduled Events 'Preempt' event (metadata endpoint); "
           "your agent turns it into SIGTERM",
           "Azure docs, 'Scheduled Events for Linux VMs': minimum notice per event type, 'Preempt | 30 seconds'",
           "read 2026-12"),
]

# Where GPUs for a training run usually come from when on-demand is sold out (each with its source, read 2026-12).
CAPACITY_OPTIONS = [
    ("AWS", "EC2 Capacity Blocks for ML", "reserve GPU instances for a future date and a fixed duration, placed "
     "together in an EC2 UltraCluster; paid up front", "AWS EC2 API Reference, 'CapacityBlock'; "
     "aws.amazon.com/ec2/capacityblocks/pricing/"),
    ("Google Cloud", "Dynamic Workload Scheduler, flex-start", "GPUs or TPUs when capacity frees up, for up to "
     "seven days, with no fixed start time", "GKE docs, 'About flex-start provisioning' (Dynamic Workload "
     "Scheduler)"),
]

# Llama 3 (Dubey et al. 2024, §3.3.4, Table 5): 419 unexpected interruptions in a 54-day snapshot on up to
# 16,384 H100 GPUs (466 in all; 47 were planned maintenance).
LLAMA3_UNEXPECTED, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384


def failures_per_hour(gpus: int) -> float:
    """λ = gpus · 419 / (54 · 24 h · 16,384): unexpected interruptions per hour at Llama 3's rate (§3.3.4)."""
    return positive_int("gpus", gpus) * LLAMA3_UNEXPECTED / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)


def _run(work: float, rate_per_hour: float, d: float, restart: float, interval: float | None):
    """(interval τ or None, expected wall seconds) for `work` seconds at `rate_per_hour` failures, at Young's τ."""
    if rate_per_hour == 0:
        if interval is None:  # nothing ever fails: no checkpoint is worth writing
            return None, work
        return interval, work + d * (math.ceil(work / interval) - 1)
    m = 3600 / rate_per_hour
    tau = interval or young_interval(d, m)
    return tau, expected_wall_time(work, tau, d, m, restart)


def spot_cost(work_hours: float, on_demand_per_hour: float, discount: float = ASSUMED_SPOT_DISCOUNT,
              preemptions_per_hour: float = 0.1, checkpoint_seconds: float = 120.0,
              restart_seconds: float = 300.0, interval_seconds: float | None = None,
              failures_per_hour: float = 0.0) -> dict:
    """Expected time and cost of `work_hours` of compute on spot vs on-demand, each checkpointing at ITS OWN interval.

    Spot: price on_demand·(1 − discount), interrupted at preemptions + failures per hour, checkpoints at
    Young's τ for that rate (or `interval_seconds`). On-demand: never preempted, interrupted only by the
    hardware `failures_per_hour` (e.g. `failures_per_hour(gpus)`), so it checkpoints at Young's τ for
    that rate — not at spot's — and not at all when the rate is 0. Wall times from Daly's model
    (`expected_wall_time`). Returns hours, dollars, both intervals (minutes; None: no checkpoints).
    """
    w = positive_real("work_hours", work_hours) * 3600
    price = positive_real("on_demand_per_hour", on_demand_per_hour)
    if fraction("discount", discount, allow_zero=True) == 1:  # free capacity: no cost to compare
        raise ValueError(f"discount must be a number in [0, 1), got {discount!r}")
    lam = non_negative_real("preemptions_per_hour", preemptions_per_hour)
    hw = non_negative_real("failures_per_hour", failures_per_hour)
    d = positive_real("checkpoint_seconds", checkpoint_seconds)
    r = non_negative_real("restart_seconds", restart_seconds)
    if interval_seconds is not None:
        positive_real("interval_seconds", interval_seconds)
    spot_tau, spot_wall = _run(w, lam + hw, d, r, interval_seconds)
    od_tau, od_wall = _run(w, hw, d, r, None)
    spot_price = price * (1 - discount)
    return {"interval_minutes": None if spot_tau is None else spot_tau / 60,
            "on_demand_interval_minutes": None if od_tau is None else od_tau / 60,
            "on_demand_hours": od_wall / 3600, "spot_hours": spot_wall / 3600,
            "on_demand_cost": od_wall / 3600 * price, "spot_cost": spot_wall / 3600 * spot_price,
            "saving": 1 - (spot_wall * spot_price) / (od_wall * price), "slowdown": spot_wall / od_wall}
