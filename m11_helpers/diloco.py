"""Lesson 10 — DiLoCo: H local AdamW steps, then one outer Nesterov step on the averaged pseudo-gradient.

    new_outer, new_buf = outer_step(outer, inner_avg, buf, lr=0.7, momentum=0.9)   # the reference outer step
    runs = launch(compare_rank, steps=32, hs=(1, 4, 16), num_processes=4)          # DiLoCo vs data parallel, 4 ranks
    simulate_diloco(world=4, steps=32, h=4)                                        # the same, in one process

Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", arXiv:2311.08105
(2023), Algorithm 1: every worker starts a round from the outer parameters θ, takes H inner AdamW
steps on its own data to θ_i, and the workers all-reduce the pseudo-gradient Δ = θ − mean_i θ_i
(one all-reduce of the parameters per H steps instead of one of the gradients per step); the outer
optimiser is SGD with Nesterov momentum (lr 0.7, momentum 0.9 in the paper): b ← μb + Δ,
θ ← θ − η(Δ + μb) — torch.optim.SGD(nesterov=True)'s update. Each worker then *resets* its inner
parameters to the new θ (its AdamW moments carry on). Reference code: OpenDiLoCo (Jaghouar et al.
2024, arXiv:2407.07852). Communication is counted by the kit's `comm_count.CommCounter` where each
all-reduce is called: payload = the tensor all-reduced (parameters or gradients, fp32), wire = the
2(N−1)/N of it a ring sends per rank (`comm_model.bus_factor`, lesson 02).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from m11_helpers.comm_count import CommCounter
from m11_helpers.comm_model import bus_factor
from m11_helpers.data import tokens
from m11_helpers.data_parallel import average_gradients
from m11_helpers.fault_tolerance import batch_indices
from m11_helpers.models import tiny_gpt
from m11_helpers.validate import fraction, positive_int, positive_real

__all__ = ["pseudo_gradient", "outer_step", "diloco_round_end", "compare_rank", "simulate_diloco"]

N_TRAIN, N_EVAL = 2048, 64  # token rows: the training pool and a held-out set every method is scored on


def pseudo_gradient(outer: list[torch.Tensor], inner_avg: list[torch.Tensor]) -> list[torch.Tensor]:
    """Δ = θ_outer − mean_i θ_inner,i: a step *down* the loss, like a gradient (Douillard et al. 2023, Alg. 1 l. 12)."""
    return [o - i for o, i in zip(outer, inner_avg)]


@torch.no_grad()
def outer_step(outer: list[torch.Tensor], inner_avg: list[torch.Tensor], buf: list[torch.Tensor],
               lr: float = 0.7, momentum: float = 0.9) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Nesterov SGD on the pseudo-gradient: b' = μb + Δ, θ' = θ − η(Δ + μb'); returns (θ', b') as new tensors."""
    positive_real("lr", lr)
    fraction("momentum", momentum, allow_zero=True)
    if not len(outer) == len(inner_avg) == len(buf):
        raise ValueError(f"outer, inner_avg and buf must list the same tensors, got {len(outer)}, "
                         f"{len(inner_avg)}, {len(buf)}")
    delta = pseudo_gradient(outer, inner_avg)
    new_buf = [momentum * b + d for b, d in zip(buf, delta)]
    return [o - lr * (d + momentum * b) for o, d, b in zip(outer, delta, new_buf)], new_buf


@torch.no_grad()
def diloco_round_end(model, outer: list[torch.Tensor], buf: list[torch.Tensor], inner_avg: list[torch.Tensor],
                     lr: float, momentum: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The outer step, then every worker's inner parameters reset to the new θ (Alg. 1 l. 14: θ_i ← θ)."""
    outer, buf = outer_step(outer, inner_avg, buf, lr, momentum)
    for p, o in zip(model.parameters(), outer):
        p.copy_(o)
    return outer, buf


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_TRAIN + N_EVAL, T) inputs and targets of one Markov chain; the last N_EVAL rows are never trained on."""
    return tokens(N_TRAIN + N_EVAL, seed=seed).tensors


def _eval_loss(model, x_all, y_all) -> float:
    with torch.no_grad():
        return model(x_all[N_TRAIN:], y_all[N_TRAIN:]).item()  # the held-out rows


def _run(method: str, h: int, steps: int, rank: int, world: int, batch: int, lr: float, outer_lr: float,
         momentum: float, seed: int) -> dict:
    model = tiny_gpt(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    x_all, y_all = _data(seed)  # (N_TRAIN + N_EVAL, T) each
    outer = [p.detach().clone() for p in model.parameters()]
    buf = [torch.zeros_like(p) for p in outer]
    comm, losses = CommCounter(), []
    for step in range(steps):
        idx = batch_indices(step, batch * world, N_TRAIN, seed).chunk(world)[rank]  # (batch,): the same rows per method
        opt.zero_grad(set_to_none=True)
        loss = model(x_all[idx], y_all[idx])
        loss.backward()
        if method == "data parallel":
            average_gradients(model)  # lesson 03's helper: one all-reduce per parameter, every step
            _count(comm, [p.grad for p in model.parameters()], world)
        opt.step()
        losses.append(loss.item())
        if method == "diloco" and (step + 1) % h == 0:
            inner_avg = [p.detach().clone() for p in model.parameters()]
            _dist_mean(inner_avg)  # one parameter all-reduce per H steps
            _count(comm, inner_avg, world)
            outer, buf = diloco_round_end(model, outer, buf, inner_avg, outer_lr, momentum)
    return {"method": method, "h": h, "bytes": comm.payload("all_reduce"), "wire": comm.wire("all_reduce"),
            "calls": comm.calls("all_reduce"), "eval_loss": _eval_loss(model, x_all, y_all), "train_losses": losses,
            "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()])}


def _count(comm: CommCounter, tensors: list[torch.Tensor], world: int) -> None:
    """One all-reduce per tensor: payload its bytes, wire a ring's 2(N−1)/N of them (comm_model.bus_factor)."""
    for t in tensors:
        size = t.numel() * t.element_size()
        comm.add("all_reduce", payload=size, wire=bus_factor("all_reduce", world) * size, elements=t.numel())


def _dist_mean(tensors: list[torch.Tensor]) -> None:
    world = dist.get_world_size()
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= world


def compare_rank(steps: int = 32, hs: tuple[int, ...] = (1, 4, 16), batch: int = 4, lr: float = 1e-3,
                 outer_lr: float = 0.7, momentum: float = 0.9, seed: int = 0) -> list[dict]:
    """Inside launch(): data parallel (gradients averaged every step) and DiLoCo for each H, on the same rows.

    Data parallel uses lesson 03's `average_gradients`, its bytes counted alike (every gradient, every
    step). Returns one dict per run: method, h, this rank's all-reduce payload bytes ("bytes"), wire bytes
    and calls, held-out loss, train losses, params.
    """
    positive_int("steps", steps)
    for h in hs:
        if steps % positive_int("h", h):
            raise ValueError(f"steps={steps} must be a multiple of every h, got h={h}")
    rank, world = dist.get_rank(), dist.get_world_size()
    args = (steps, rank, world, batch, lr, outer_lr, momentum, seed)
    return [_run("data parallel", 1, *args)] + [_run("diloco", h, *args) for h in hs]


def simulate_diloco(world: int = 4, steps: int = 32, h: int = 4, batch: int = 4, lr: float = 1e-3,
                    outer_lr: float = 0.7, momentum: float = 0.9, seed: int = 0, round_end=diloco_round_end
                    ) -> torch.Tensor:
    """DiLoCo's final parameters (worker 0's) computed in one process, the workers one after another.

    The ranks' reference; `round_end(model, outer, buf, inner_avg, lr, momentum) -> (outer, buf)` runs on
    every worker at the end of a round (a learner's version can be passed in and compared).
    """
    positive_int("world", world)
    models = [tiny_gpt(seed) for _ in range(world)]
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in models]
    x_all, y_all = _data(seed)
    outer = [p.detach().clone() for p in models[0].parameters()]
    buf = [torch.zeros_like(p) for p in outer]
    for step in range(steps):
        shards = batch_indices(step, batch * world, N_TRAIN, seed).chunk(world)
        for m, o, idx in zip(models, opts, shards):
            o.zero_grad(set_to_none=True)
            m(x_all[idx], y_all[idx]).backward()
            o.step()
        if (step + 1) % h == 0:
            inner_avg = [torch.stack(ps).mean(0) for ps in zip(*(m.parameters() for m in models))]
            outer, buf = [round_end(m, outer, buf, inner_avg, outer_lr, momentum) for m in models][-1]
    return torch.cat([p.detach().reshape(-1) for p in models[0].parameters()])
