"""Lesson 04 — schedules past 1F1B, run for real: interleaved 1F1B, zero bubble (ZB-H1, ZB-V) and DualPipeV.

    runs = launch(run_schedules, ["1f1b", "interleaved", "zb1p", "zbv", "dualpipev"], num_processes=4)
    merged = gather(runs)                        # per schedule: every device's order, loss, all grads, memory, bytes
    loss, grads = reference_step()               # the same 8-layer model in one process
    replay(merged["zbv"]["orders"], merged["zbv"]["layers"])   # its bubble in ticks (m11_helpers.pipeline_ticks)

All five are `torch.distributed.pipelining` schedules (torch ≥ 2.6; DualPipeV ≥ 2.9), run on gloo:
each device holds the same 8 layers' worth of work, as one stage of 8/p layers (1F1B, ZB-H1) or two
chunks of 8/(2p) (interleaved on stages r and r+p; ZB-V and DualPipeV on r and 2p−1−r, the V).
What each device records is what torch *executed*: F (forward_one_chunk), B (backward_one_chunk
with full_backward=False: the input gradient only, graph kept), W (backward_weight_one_chunk: the
weight gradient later) and BW (the fused backward) — per stage and micro-batch. The zero-bubble
schedules split the backward so that W fills the bubble (Qi et al. 2024, §2); on stage 0 torch's B
computes nothing (no input needs a gradient) and W runs the whole backward (torch's stage.py).

Also measured per device: the peak bytes of activations autograd holds during the step (saved-tensor
hooks, each storage once, parameters excluded, released when the graph frees them), what is still held
when the step ends (torch 2.13's ZB1P on stages of 2 layers leaves 128 B per micro-batch on every
stage but the first, step after step — the saved output of the tanh between a stage's two layers,
one per micro-batch, alive even after gc.collect(): measured, not root-caused), and the bytes of activations and
gradients sent to other devices (the P2P ops the stage hands the schedule). torch's runtime
sends single isend/irecv, not batch_isend_irecv (gloo lacks it), so every schedule here runs on a CPU.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

# Imported in the caller, before the fork, as pipeline_run does: 4 ranks importing it at once crawl.
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from m11_helpers.launch import rank_device
from m11_helpers.validate import non_negative_real, one_of, positive_int

__all__ = ["SCHEDULES", "deep_mlp", "reference_step", "stage_indices", "LiveSaved", "run_schedules", "gather"]

# name -> (torch class, chunks per device, placement of chunks)
SCHEDULES = {
    "1f1b": (Schedule1F1B, 1, "loop"),
    "interleaved": (ScheduleInterleaved1F1B, 2, "loop"),
    "zb1p": (ScheduleInterleavedZeroBubble, 1, "loop"),  # one stage per device: ZB-H1 (torch's "ZB1P")
    "zbv": (ScheduleZBVZeroBubble, 2, "v"),
    "dualpipev": (ScheduleDualPipeV, 2, "v"),
}
LAYERS, WIDTH = 8, 16


def deep_mlp(seed: int = 0, layers: int = LAYERS, width: int = WIDTH) -> nn.Sequential:
    """`layers` blocks of Linear(width, width) + tanh: equal layers, so F = B = W per layer (Qi et al.'s assumption)."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(positive_int("layers", layers)):
        lin = nn.Linear(width, width)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(width, width, generator=g) / width**0.5)  # (width, width)
            lin.bias.copy_(torch.randn(width, generator=g) * 0.1)  # (width,)
        blocks.append(nn.Sequential(lin, nn.Tanh()))
    return nn.Sequential(*blocks)


def _batch(microbatches: int, width: int = WIDTH, rows: int = 2):
    """Inputs and targets of one step: `rows` rows per micro-batch, fixed seeds."""
    x = torch.randn(rows * microbatches, width, generator=torch.Generator().manual_seed(1))  # (B, width)
    y = torch.randn(rows * microbatches, width, generator=torch.Generator().manual_seed(2))  # (B, width)
    return x, y


def reference_step(microbatches: int = 8, seed: int = 0, layers: int = LAYERS) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the unpipelined model on the whole batch, one process (mean MSE = mean of micro-batch MSEs)."""
    model = deep_mlp(seed, layers)
    x, y = _batch(microbatches)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def stage_indices(schedule: str, rank: int, devices: int) -> list[int]:
    """The pipeline stages device `rank` holds: [r] / [r, r+p] (looped) / [r, 2p−1−r] (V-shaped)."""
    _, chunks, style = SCHEDULES[one_of("schedule", schedule, tuple(SCHEDULES))]
    if style == "v":
        return [rank, 2 * devices - 1 - rank]
    return [rank + k * devices for k in range(chunks)]


class LiveSaved:
    """Activations autograd holds right now, and the peak: saved-tensor hooks, each storage counted once.

    pack wraps a saved tensor in a handle; when autograd frees the graph the handle dies and its bytes
    leave the count — so the peak is what the schedule's in-flight micro-batches really held.
    """

    def __init__(self, tensors):
        # Parameters and the step's input batch exist anyway: they are not activations.
        self.skip = {t.untyped_storage().data_ptr() for t in tensors}
        self.refs: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.now = self.peak = 0

    class _Handle:
        __slots__ = ("t", "key", "owner")

        def __init__(self, t, key, owner):
            self.t, self.key, self.owner = t, key, owner

        def __del__(self):
            self.owner._drop(self.key)

    def _drop(self, key):
        self.refs[key] -= 1
        if not self.refs[key]:
            del self.refs[key]
            self.now -= self.size.pop(key)

    def pack(self, t):
        key = t.untyped_storage().data_ptr()
        if key in self.skip:
            return t
        if key not in self.refs:
            self.refs[key] = 0
            self.size[key] = t.untyped_storage().nbytes()
            self.now += self.size[key]
            self.peak = max(self.peak, self.now)
        self.refs[key] += 1
        return self._Handle(t, key, self)

    @staticmethod
    def unpack(h):
        return h.t if isinstance(h, LiveSaved._Handle) else h

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _run_one(schedule: str, microbatches: int, seed: int, layers: int, tick_s: float) -> dict:
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    cls, chunks, _ = SCHEDULES[schedule]
    n_stages = p * chunks
    if layers % n_stages:
        raise ValueError(f"layers ({layers}) must be a multiple of the {n_stages} stages {schedule} has on "
                         f"{p} ranks ({chunks} per rank)")
    per = layers // n_stages
    device = rank_device()
    model = deep_mlp(seed, layers).to(device)
    order: list[tuple[str, int, int]] = []
    spans: list[tuple[str, int, int, float, float]] = []  # (kind, stage, micro, start, end) in seconds
    sent = {"bytes": 0, "messages": 0}
    timed = [False]

    def busy(kind: str, s: int, i: int, t0: float) -> None:
        # A "device" busy for the op's ticks: sleep frees the core, so 4 ranks on 2 cores act as 4 devices.
        if timed[0] and tick_s:
            time.sleep(tick_s * {"F": 1, "B": 1, "W": 1, "BW": 2}[kind] * per)
        spans.append((kind, s, i, t0, time.perf_counter()))

    class RecordingStage(PipelineStage):
        def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
            order.append(("F", self.stage_index, fwd_chunk_id))
            t0 = time.perf_counter()
            res = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
            busy("F", self.stage_index, fwd_chunk_id, t0)
            return res

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
            kind = "BW" if full_backward else "B"
            order.append((kind, self.stage_index, bwd_chunk_id))
            t0 = time.perf_counter()
            res = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                             last_backward=last_backward)
            busy(kind, self.stage_index, bwd_chunk_id, t0)
            return res

        def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
            order.append(("W", self.stage_index, bwd_chunk_id))
            t0 = time.perf_counter()
            res = super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
            busy("W", self.stage_index, bwd_chunk_id, t0)
            return res

        def _count(self, ops):
            for op in ops:  # the messages the schedule will post: activations forward, their gradients back
                sent["bytes"] += op.tensor.numel() * op.tensor.element_size()
                sent["messages"] += 1
            return ops

        def get_fwd_send_ops(self, fwd_chunk_id):
            return self._count(super().get_fwd_send_ops(fwd_chunk_id))

        def get_bwd_send_ops(self, bwd_chunk_id):
            return self._count(super().get_bwd_send_ops(bwd_chunk_id))

    mine = stage_indices(schedule, rank, p)
    stages = [RecordingStage(model[s * per:(s + 1) * per], s, n_stages, device) for s in mine]
    sched = cls(stages[0] if schedule == "1f1b" else stages, n_microbatches=microbatches,
                loss_fn=lambda out, target: F.mse_loss(out, target))  # mean per micro-batch; grads scaled by 1/m
    x, y = (t.to(device) for t in _batch(microbatches))  # the data lives where the stage computes
    has_first = any(s == 0 for s in mine)
    has_last = any(s == n_stages - 1 for s in mine)
    losses: list[torch.Tensor] = []
    mem = LiveSaved([*model.parameters(), x, y])
    for step in range(2):  # step 0 warms up (shape inference, first messages); step 1 is recorded
        model.zero_grad(set_to_none=True)
        order.clear(), losses.clear(), spans.clear()
        timed[0] = step == 1
        sent.update(bytes=0, messages=0)
        start = mem.peak = mem.now  # what an earlier step left behind is not this step's
        kwargs = {"target": y, "losses": losses} if has_last else {}
        dist.barrier()
        with mem.hooks():
            sched.step(x, **kwargs) if has_first else sched.step(**kwargs)
    mine_params = {n: q.grad.cpu() for n, q in model.named_parameters()
                   if int(n.split(".")[0]) // per in mine and q.grad is not None}
    return {"schedule": schedule, "rank": rank, "stages": mine, "layers_per_stage": per, "order": list(order),
            "loss": torch.stack(losses).mean().item() if losses else None, "grads": mine_params,
            "peak_activation_bytes": mem.peak - start, "left_after_step_bytes": mem.now - start,
            "spans": list(spans),
            "sent_bytes": sent["bytes"], "messages": sent["messages"]}


def run_schedules(schedules: list[str], microbatches: int = 8, seed: int = 0, layers: int = LAYERS,
                  tick_s: float = 0.0) -> list[dict]:
    """One recorded training step per schedule, on this rank (run it on p ranks with `launch`).

    tick_s > 0 makes each op also take that many seconds per tick (F = B = W = 1 per layer), so the
    recorded `spans` show the bubble in wall-clock time too (benchmarks/pipeline_zero_bubble.py).
    """
    positive_int("microbatches", microbatches)
    positive_int("layers", layers)
    for s in schedules:
        one_of("schedule", s, tuple(SCHEDULES))
    non_negative_real("tick_s", tick_s)
    return [_run_one(s, microbatches, seed, layers, tick_s) for s in schedules]


def gather(results: list[list[dict]]) -> dict[str, dict]:
    """Merge every rank's runs: per schedule, the orders (one per device), the loss, all grads, memory and bytes."""
    merged: dict[str, dict] = {}
    for rank_runs in results:
        for r in rank_runs:
            m = merged.setdefault(r["schedule"], {"orders": [None] * len(results), "grads": {}, "loss": None,
                                                  "peak_activation_bytes": {}, "left_after_step_bytes": {},
                                                  "sent_bytes": {}, "messages": {},
                                                  "layers": {}})
            m["orders"][r["rank"]] = r["order"]
            m["grads"].update(r["grads"])
            m["loss"] = r["loss"] if r["loss"] is not None else m["loss"]
            m["peak_activation_bytes"][r["rank"]] = r["peak_activation_bytes"]
            m["left_after_step_bytes"][r["rank"]] = r["left_after_step_bytes"]
            m["sent_bytes"][r["rank"]] = r["sent_bytes"]
            m["messages"][r["rank"]] = r["messages"]
            m["layers"].update({s: r["layers_per_stage"] for s in r["stages"]})
            m.setdefault("spans", {})[r["rank"]] = r["spans"]
    return merged
