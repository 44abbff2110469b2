"""Pipeline parallelism: schedules as pure functions, and the real thing measured on real processes.

    ops = simulate(stages=4, microbatches=8, schedule="1f1b")       # a timeline of Op(stage, kind, micro, …)
    plot_timeline(ops); timeline_bubble(ops)                          # == bubble_fraction(4, 8)
    results = launch(run_pipeline, "gpipe", 8, num_processes=4)       # torch.distributed.pipelining, measured

Conventions: p stages (one per device), m micro-batches, v model chunks per device (interleaved).
"bubble" here is the *idle fraction of the whole step*, (p−1)/(m+p−1); the Megatron-LM paper
(Narayanan et al. 2021, §2.2.1) quotes bubble time over ideal time instead, (p−1)/m.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F
from torch import nn

# Imported here, in the caller, on purpose: forked ranks inherit it. Importing it in 4 ranks at once
# on 2 cores took over 20 s (it pulls in DTensor); once, before the fork, it takes ~3 s.
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

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


# ----------------------------------------------------------------------------------------------
# The tiny GPT cut into stages, and one real pipelined step
# ----------------------------------------------------------------------------------------------


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

        sched = (ScheduleGPipe if schedule == "gpipe" else Schedule1F1B)(stage, n_microbatches=m, loss_fn=loss_fn)
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
            tied = model.wte.weight
            g = tied.grad if tied.grad is not None else torch.zeros_like(tied)
            dist.all_reduce(g, group=embedding_group)
            tied.grad = g
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
        dist.send(h.detach(), dst=1)  # the activations cross to the next device…
        grad = torch.empty(shape)
        dist.recv(grad, src=1)  # …and rank 0 idles until their gradient comes back
        t0 = time.perf_counter()
        h.backward(grad)
        ops.append(Op(0, "B", 0, t0, time.perf_counter()))
    else:
        h = torch.empty(shape)
        dist.recv(h, src=0)  # idle until rank 0 has finished its half of the forward
        h.requires_grad_(True)
        t0 = time.perf_counter()
        logits = stage(h)  # (B, T, vocab)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        ops.append(Op(1, "F", 0, t0, time.perf_counter()))
        t0 = time.perf_counter()
        loss.backward()
        ops.append(Op(1, "B", 0, t0, time.perf_counter()))
        dist.send(h.grad, dst=0)
        loss = loss.item()
    return {"ops": ops, "loss": loss}
