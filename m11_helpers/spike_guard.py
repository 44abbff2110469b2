"""Loss spikes and NaNs: catch the step before it is applied, roll back, skip the batches, carry on.

    guard = SpikeGuard(factor=3.0, window=20)
    reason = guard.check(loss, grad_norm)             # None, or why this step must not be applied
    if reason is None:
        opt.step(); guard.accept(loss)
    else:                                             # the weights are still good: nothing was applied
        opt.zero_grad(); info = ckpt.load(...)        # roll back to the last complete checkpoint
        skipped.append(skip_window(progress["cursor"], bad_batch))   # and never read those batches again
    batch = next_batch(cursor, skipped)               # the data position, skipping what was skipped

The check runs after backward and before `optimizer.step()`, on the *global* loss (all-reduced) and
the *global* gradient norm (what `clip_grad_norm_` returns; a DTensor's full value under FSDP2), so
every rank reaches the same verdict without another collective. A step is bad when the loss or the
gradient norm is not finite, or the loss exceeds `factor` × the median of the last `window` accepted
losses (the median, not the mean: one earlier outlier does not move it).

What large runs report, and what this module does about it:
- PaLM 540B (Chowdhery et al. 2022, §5.1): about 20 loss spikes despite gradient clipping, not
  explained by bad data alone; they restarted from a checkpoint about 100 steps before the spike and
  skipped 200–500 data batches, "which cover the batches that were seen before and during the spike".
  `skip_window` is that policy: every batch from the checkpoint's data position through the bad one.
- OPT-175B (Zhang et al. 2022, §2.5, and its released logbook): loss divergences were handled by
  restarting from an earlier checkpoint with a lower learning rate; hardware failures caused at least
  35 manual restarts in two months. A spike that returns after `max_rollbacks` rollbacks is not one
  bad batch: `RepeatedSpikes` stops the run for a human to lower the LR, as OPT's team did.
- Llama 3 (Dubey et al. 2024, §3.3.4): 466 job interruptions in a 54-day snapshot (47 planned, 419
  unexpected, ~78 % of those hardware) and > 90 % effective training time, through automated
  recovery. Elastic restarts from sharded checkpoints are that automation for crashes; this guard is
  its numerical half.

`inject` simulates a bad batch (the loss ×1000, or NaN as an fp16 overflow would make it) for drills:
it is a simulation, labelled as one; the recovery that follows it is real. Lesson 10.
"""

from __future__ import annotations

import math
import statistics

import torch

from m11_helpers.validate import non_negative_int, one_of, positive_int, positive_real

__all__ = ["SpikeGuard", "RepeatedSpikes", "next_batch", "skip_window", "parse_batches", "bad_batches", "inject", "SPIKE_SCALE"]

SPIKE_SCALE = 1000.0  # how much `inject(..., "spike")` multiplies a loss (and so its gradient) by


class RepeatedSpikes(RuntimeError):
    """The guard rolled back `max_rollbacks` times and the run still spikes: a human should step in."""


class SpikeGuard:
    """Verdicts on each step's loss and gradient norm; remembers the last `window` accepted losses."""

    def __init__(self, factor: float = 3.0, window: int = 20, min_history: int = 5, max_rollbacks: int = 3):
        if positive_real("factor", factor) <= 1:
            raise ValueError(f"factor must be a number > 1 (a spike is a loss above factor × median), got {factor!r}")
        self.factor, self.window = factor, positive_int("window", window)
        self.min_history = min(positive_int("min_history", min_history), self.window)
        self.max_rollbacks = non_negative_int("max_rollbacks", max_rollbacks)
        self.history: list[float] = []  # accepted losses, newest last (checkpointed with the run)
        self.rollbacks = 0  # of this process (not checkpointed: a rollback must not reset it)

    def check(self, loss: float, grad_norm: float | None = None) -> str | None:
        """Why this step must not be applied ("non-finite loss", "non-finite gradient norm", "loss spike ..."), or None."""
        if not math.isfinite(loss):
            return "non-finite loss"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return "non-finite gradient norm"
        if len(self.history) >= self.min_history:
            median = statistics.median(self.history)
            if loss > self.factor * median:
                return f"loss spike: {loss:.4g} > {self.factor:g} × running median {median:.4g}"
        return None

    def accept(self, loss: float) -> None:
        """Record a loss that was applied (only good steps enter the median)."""
        self.history = (self.history + [float(loss)])[-self.window:]

    def rolled_back(self, reason: str) -> None:
        """Count a rollback; raise RepeatedSpikes once there have been more than max_rollbacks."""
        self.rollbacks += 1
        if self.rollbacks > self.max_rollbacks:
            raise RepeatedSpikes(f"{reason}: still spiking after {self.max_rollbacks} rollbacks; not one bad batch. "
                                 "Restart from an earlier checkpoint with a lower learning rate (OPT-175B's remedy).")

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = [float(x) for x in state["history"]][-self.window:]


def next_batch(cursor: int, skipped: list[list[int]]) -> int:
    """The first batch index >= cursor outside every skipped range [a, b] (inclusive)."""
    non_negative_int("cursor", cursor)
    moved = True
    while moved:  # ranges may touch or overlap: repeat until no range contains the cursor
        moved = False
        for a, b in skipped:
            if a <= cursor <= b:
                cursor, moved = b + 1, True
    return cursor


def skip_window(checkpoint_cursor: int, bad_batch: int) -> list[int]:
    """[a, b]: the batches from the checkpoint's data position through the bad one (PaLM's policy, §5.1)."""
    non_negative_int("checkpoint_cursor", checkpoint_cursor)
    if non_negative_int("bad_batch", bad_batch) < checkpoint_cursor:
        raise ValueError(f"bad_batch must be >= checkpoint_cursor={checkpoint_cursor}, got {bad_batch}")
    return [checkpoint_cursor, bad_batch]


def parse_batches(text: str) -> list[list[int]]:
    """"12-15,40" → [[12, 15], [40, 40]]: batch ranges to skip, as an operator writes them on a restart."""
    ranges = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        a, dash, b = part.partition("-")
        b = b if dash else a  # "40" is the range 40-40
        if not a.isdigit() or not b.isdigit() or int(b) < int(a):
            raise ValueError(f"batches must be ranges like '12-15,40' (first <= last), got {text!r}")
        ranges.append([int(a), int(b)])
    return ranges


def bad_batches(indices: str, kinds: str) -> dict[int, str]:
    """"7,11" with "nan" (one kind for all) or "nan,spike" (one per batch) → {7: "nan", 11: "spike"}: a drill's batches."""
    batches = [int(b) for b in indices.split(",")] if indices else []
    kind = kinds.split(",") * (len(batches) if "," not in kinds else 1)
    if batches and len(kind) != len(batches):
        raise ValueError(f"--bad-batch-kind must give one kind, or one per --inject-bad-batch batch, got {kind}")
    return {b: one_of("--bad-batch-kind", k, ("spike", "nan")) for b, k in zip(batches, kind)}


def inject(loss: torch.Tensor, kind: str) -> torch.Tensor:
    """SIMULATED bad batch for drills: "spike" multiplies the loss by SPIKE_SCALE, "nan" makes it NaN."""
    one_of("kind", kind, ("spike", "nan"))
    return loss * (SPIKE_SCALE if kind == "spike" else float("nan"))  # (): scales the gradient the same way
