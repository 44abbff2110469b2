"""Real pipelined steps on real processes: the tiny GPT cut into stages, run by `torch.distributed.pipelining`
(lesson 04).

    results = launch(run_schedules, [("gpipe", 8), ("1f1b", 8)], num_processes=4)   # timed ops, loss, grads
    merged = gather([r[0] for r in results])                                         # one timeline, all grads
    loss, grads = reference_step()                                                   # the one-process answer
    launch(naive_step, num_processes=2)                                              # no micro-batches
    launch(record_order, [("1f1b", 6)], num_processes=4)                             # the order torch runs

The schedules' arithmetic is in `m11_helpers.pipeline`; the messages between stages in
`m11_helpers.pipeline_comm`.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

# Imported here, in the caller, on purpose: forked ranks inherit it. Importing it in 4 ranks at once
# on 2 cores took over 20 s (it pulls in DTensor); once, before the fork, it takes ~3 s.
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from m11_helpers.pipeline import Op, peak_in_flight
from m11_helpers.pipeline_comm import recv_backward, recv_forward, send_backward, send_forward, sum_tied_grad
from m11_helpers.validate import one_of, positive_int

__all__ = ["StageModule", "split_tiny_gpt", "reference_step", "run_pipeline", "run_schedules", "gather",
           "naive_step", "record_order"]

_SCHEDULE_CLASSES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class _DeviceTime(torch.autograd.Function):
    """Identity whose forward takes t_f seconds and backward t_b: a stage stands in for a GPU busy with
    kernels. `time.sleep` frees the CPU core, so 4 ranks on 2 cores behave like 4 devices."""

    @staticmethod
    def forward(ctx, x, t_f, t_b):
        ctx.t_b = t_b
        time.sleep(t_f)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.t_b)
        return grad, None, None


class StageModule(nn.Module):
    """Blocks [first, last) of a TinyGPT; stage 0 also embeds, the last stage also norms and projects."""

    def __init__(self, model, first: int, last: int, is_first: bool, is_last: bool, t_f: float = 0.0, t_b: float = 0.0):
        super().__init__()
        self.embed = nn.ModuleDict({"wte": model.wte, "wpe": model.wpe}) if is_first else None
        self.blocks = nn.ModuleList(model.blocks[first:last])
        self.ln_f, self.head = (model.ln_f, model.head) if is_last else (None, None)
        self.t_f, self.t_b = t_f, t_b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:  # x: token ids (B, T)
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.embed["wte"](x) + self.embed["wpe"](pos)  # (B, T, C)
        if self.t_f or self.t_b:
            x = _DeviceTime.apply(x, self.t_f, self.t_b)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        if self.head is not None:
            x = self.head(self.ln_f(x))  # (B, T, vocab)
        return x


def split_tiny_gpt(model, stages: int, t_f: float = 0.0, t_b: float = 0.0) -> list[StageModule]:
    """Cut `model` into `stages` consecutive StageModules (blocks spread evenly); they share its parameters."""
    n = len(model.blocks)
    if positive_int("stages", stages) > n:
        raise ValueError(f"stages must be an integer in 1..{n} (one block at least per stage), got {stages!r}")
    cuts = [round(k * n / stages) for k in range(stages + 1)]
    return [StageModule(model, cuts[k], cuts[k + 1], k == 0, k == stages - 1, t_f, t_b) for k in range(stages)]


def reference_step(batch: int = 8, seed: int = 0):
    """Loss and gradients of the unpipelined tiny GPT on the batch `run_pipeline` uses (one process)."""
    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    model = tiny_gpt(seed)
    idx, targets = tokens(batch, seed=seed).tensors  # (B, T), (B, T)
    loss = model(idx, targets)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def run_pipeline(schedule: str = "gpipe", microbatches: int = 4, batch: int | None = None, seed: int = 0,
                 t_f: float = 0.02, t_b: float = 0.04) -> dict:
    """One training step of the tiny GPT, pipelined over all ranks with torch.distributed.pipelining.

    Run it on p ranks with `launch`. Returns this rank's busy intervals (Ops, seconds), the loss (last
    stage), its parameters' gradients by name, and how many micro-batches it held at once.
    """
    return run_schedules([(schedule, microbatches)], batch, seed, t_f, t_b)[0]


def run_schedules(configs: list[tuple[str, int]], batch: int | None = None, seed: int = 0,
                  t_f: float = 0.02, t_b: float = 0.04) -> list[dict]:
    """`run_pipeline` for several (schedule, microbatches) in one launch (a launch costs seconds on a busy machine)."""
    import torch.distributed as dist

    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    for schedule, m in configs:
        one_of("schedule", schedule, ("gpipe", "1f1b"))  # the single-chunk schedules
        positive_int("microbatches", m)
    rank, p = dist.get_rank(), dist.get_world_size()
    embedding_group = dist.new_group([0, p - 1])  # every rank must take part in creating a group
    out = []
    for schedule, m in configs:
        if schedule == "1f1b" and m < p:
            raise ValueError(f"microbatches must be >= the number of stages ({p}) for '1f1b' "
                             f"(torch.distributed.pipelining refuses fewer), got {m}")
        b = batch or 2 * m
        if b % m:
            raise ValueError(f"batch ({b}) must be divisible by microbatches ({m})")
        model = tiny_gpt(seed)
        stage_mod = split_tiny_gpt(model, p)[rank]
        ops: list[Op] = []

        class TimedStage(PipelineStage):
            # The schedule waits for its receives *outside* these two calls, so they time compute only.
            def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
                t0 = time.perf_counter()
                res = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
                ops.append(Op(rank, "F", fwd_chunk_id, t0, time.perf_counter()))
                return res

            def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
                t0 = time.perf_counter()
                res = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
                ops.append(Op(rank, "B", bwd_chunk_id, t0, time.perf_counter()))
                return res

        stage = TimedStage(stage_mod, rank, p, torch.device("cpu"))

        def loss_fn(logits, targets):  # mean over the micro-batch; the schedule divides grads by m
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

        sched = _SCHEDULE_CLASSES[schedule](stage, n_microbatches=m, loss_fn=loss_fn)
        idx, targets = tokens(b, seed=seed).tensors  # (B, T), (B, T)
        losses: list[torch.Tensor] = []
        for step in range(2):  # step 0 warms up (shape inference, first calls) at full speed; step 1 is measured
            stage_mod.t_f, stage_mod.t_b = (t_f, t_b) if step else (0.0, 0.0)
            model.zero_grad(set_to_none=True)
            ops.clear(), losses.clear()
            dist.barrier()
            if rank == 0:
                sched.step(idx)
            elif rank == p - 1:
                sched.step(target=targets, losses=losses)
            else:
                sched.step()
        # The head shares the embedding's weight (tied) but lives on the last stage: add the two partial
        # gradients between the first and last stage, as Megatron-LM does in its embedding group.
        if rank in (0, p - 1):
            sum_tied_grad(model.wte.weight, embedding_group)
        grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        loss = torch.stack(losses).mean().item() if losses else None
        out.append({"schedule": schedule, "microbatches": m, "ops": list(ops), "loss": loss, "grads": grads,
                    "peak_in_flight": peak_in_flight(ops)[rank]})
    return out


def gather(results: list) -> dict:
    """Merge the per-rank results of `run_pipeline` into one: all ops, the loss, every gradient."""
    merged = {"ops": [], "grads": {}, "loss": None, "peak_in_flight": {}}
    for r in results:
        merged["ops"] += r["ops"]
        merged["grads"].update(r["grads"])
        merged["loss"] = r["loss"] if r["loss"] is not None else merged["loss"]
        if r["ops"]:
            merged["peak_in_flight"][r["ops"][0].stage] = r["peak_in_flight"]
    return merged


def naive_step(batch: int = 8, seed: int = 0, t_f: float = 0.01, t_b: float = 0.02) -> dict:
    """The tiny GPT split over 2 ranks, no micro-batches: rank 0 sends activations, waits for their gradient."""
    import torch.distributed as dist

    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise ValueError(f"naive_step runs on exactly 2 ranks, got {dist.get_world_size()}")
    model = tiny_gpt(seed)
    stage = split_tiny_gpt(model, 2, t_f, t_b)[rank]
    idx, targets = tokens(batch, seed=seed).tensors  # (B, T), (B, T)
    shape = (batch, idx.shape[1], model.cfg.hidden)
    ops, loss = [], None
    dist.barrier()
    if rank == 0:
        t0 = time.perf_counter()
        h = stage(idx)  # (B, T, C)
        ops.append(Op(0, "F", 0, t0, time.perf_counter()))
        send_forward(h, dst=1)  # the activations cross to the next device…
        grad = recv_backward(shape, src=1)  # …and rank 0 idles until their gradient comes back
        t0 = time.perf_counter()
        h.backward(grad)
        ops.append(Op(0, "B", 0, t0, time.perf_counter()))
    else:
        h = recv_forward(shape, src=0)  # idle until rank 0 has finished its half of the forward
        t0 = time.perf_counter()
        logits = stage(h)  # (B, T, vocab)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        ops.append(Op(1, "F", 0, t0, time.perf_counter()))
        t0 = time.perf_counter()
        loss.backward()
        ops.append(Op(1, "B", 0, t0, time.perf_counter()))
        send_backward(h.grad, dst=0)
        loss = loss.item()
    return {"ops": ops, "loss": loss}


def record_order(configs: list[tuple[str, int]], width: int = 4) -> list[list[tuple[str, int]]]:
    """Per (schedule, microbatches), the (kind, micro) this rank's stage computed, in the order torch ran them.

    One linear layer per stage, so only the order matters: recorded from `forward_one_chunk` and
    `backward_one_chunk`, the calls the schedule makes (not from its `pipeline_order` table, which is
    for display). Run it on p ranks with `launch`.
    """
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    out = []
    for schedule, m in configs:
        one_of("schedule", schedule, tuple(_SCHEDULE_CLASSES))
        positive_int("microbatches", m)
        order: list[tuple[str, int]] = []

        class RecordingStage(PipelineStage):
            def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
                order.append(("F", fwd_chunk_id))
                return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

            def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
                order.append(("B", bwd_chunk_id))
                return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)

        torch.manual_seed(rank)
        stage = RecordingStage(nn.Linear(width, width), rank, p, torch.device("cpu"))
        sched = _SCHEDULE_CLASSES[schedule](stage, n_microbatches=m, loss_fn=lambda y, t: F.mse_loss(y, t))
        x = torch.randn(m, width, generator=torch.Generator().manual_seed(0))  # (m, width): one row per micro-batch
        if rank == 0:
            sched.step(x)
        elif rank == p - 1:
            sched.step(target=torch.zeros(m, width))
        else:
            sched.step()
        out.append(order)
    return out
