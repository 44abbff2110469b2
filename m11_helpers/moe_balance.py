"""Lesson 12 — balancing experts three ways on the same router and data: none, the auxiliary loss, DeepSeek-V3's bias.

    runs = compare_balancing(steps=40)            # per method: max/mean expert load per step, dropped tokens, loss
    runs["aux_free"]["imbalance"][-1]              # ≈ 1 = balanced; runs["none"] drifts away from it

none      the task loss alone: the router learns whatever it likes; loads drift apart
aux       task + α·E·Σ f_i P_i (Switch Transformer §2.2; `expert_parallel.load_balancing_loss`): a gradient
          that pulls the router towards uniform, and away from the task
aux_free  DeepSeek-V3 (arXiv:2412.19437, §2.1.2): a per-expert bias b_i added to the scores *for choosing the
          top-k only* (the gate still uses the raw score), updated after each step by b_i += γ·sign(mean load −
          load_i): no gradient, so nothing fights the task loss. (DeepSeek-V3 scores with a sigmoid; this
          uses the course's softmax router, which does not change the mechanism.)
Imbalance = max_i load_i / mean load (1 = perfect), per step. Dropping: with capacity C = ⌈1.25·k·T/E⌉ the
assignments over C are dropped (counted); dropless routing (capacity None, variable-size expert groups
as in grouped GEMMs, Gale et al. 2023 "MegaBlocks") drops none.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from m11_helpers.expert_parallel import MoELayer, expert_capacity, load_balancing_loss, route
from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["METHODS", "biased_route", "moe_step", "compare_balancing", "imbalance", "BiasedMoELayer", "update_bias"]

METHODS = ("none", "aux", "aux_free")


def imbalance(experts: torch.Tensor, num_experts: int) -> float:
    """max_i load_i / mean_i load_i over the assignments (T, k): 1 when every expert gets the same number."""
    load = torch.bincount(experts.reshape(-1), minlength=num_experts).float()  # (E,)
    return (load.max() / load.mean()).item()


def biased_route(logits: torch.Tensor, bias: torch.Tensor, top_k: int, capacity: int | None):
    """Top-k chosen on probs + bias, gated by the unbiased probs (DeepSeek-V3 §2.1.2); capacity as `route`."""
    r = route(logits, top_k, capacity)  # capacity bookkeeping and the shapes; experts replaced below
    chosen = (r.probs + bias).topk(top_k, dim=-1).indices  # (T, k): the bias steers the choice only
    top = r.probs.gather(-1, chosen)  # (T, k): the gate is the raw affinity
    r.experts, r.gates = chosen, (top / top.sum(dim=-1, keepdim=True) if top_k > 1 else top)
    if capacity is not None:
        onehot = F.one_hot(chosen.T.reshape(-1), r.probs.shape[-1])  # (k·T, E)
        position = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1
        r.keep = (position < capacity).view(top_k, -1).T  # (T, k)
    return r


class BiasedMoELayer(MoELayer):
    """MoELayer whose top-k choice adds a per-expert bias (a buffer: no gradient, not an optimizer's parameter).

    `expert_parallel.ExpertParallelMoE` routes through `routing`, so this layer runs expert-parallel unchanged.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("bias", torch.zeros(self.num_experts))  # (E,)

    def routing(self, x: torch.Tensor):
        cap = None if self.capacity_factor is None else expert_capacity(
            x.shape[0], self.num_experts, self.top_k, self.capacity_factor)
        return biased_route(self.router(x), self.bias, self.top_k, cap)


def update_bias(bias: torch.Tensor, experts: torch.Tensor, gamma: float = 0.01, group=None) -> torch.Tensor:
    """b_i += γ·sign(mean load − load_i), load counted over the *global* batch: every rank's assignments
    all-reduced first when distributed, so all ranks keep the same bias (DeepSeek-V3 §2.1.2)."""
    positive_real("gamma", gamma)
    load = torch.bincount(experts.reshape(-1), minlength=bias.numel()).float()  # (E,) this rank's assignments
    if dist.is_initialized():
        dist.all_reduce(load, group=group)
    bias += gamma * torch.sign(load.mean() - load)
    return bias


def moe_step(moe: MoELayer, x: torch.Tensor, bias: torch.Tensor | None, capacity: int | None):
    """One MoE forward (T, h) -> (y, routing), with the bias-steered choice when `bias` is given."""
    logits = moe.router(x)  # (T, E)
    r = route(logits, moe.top_k, capacity) if bias is None else biased_route(logits, bias, moe.top_k, capacity)
    y = torch.zeros_like(x)  # (T, h)
    for e, expert in enumerate(moe.experts):
        tok, slot = torch.nonzero((r.experts == e) & r.keep, as_tuple=True)
        if len(tok):
            y = y.index_add(0, tok, r.gates[tok, slot, None] * expert(x[tok]))
    return y, r


def _data(steps: int, tokens: int, hidden: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    skew = 2.0 * torch.randn(hidden, generator=g)  # a direction every token shares: the router favours a few experts
    target = torch.randn(hidden, hidden, generator=g) / hidden**0.5
    xs = [torch.randn(tokens, hidden, generator=g) + skew for _ in range(steps)]  # (T, h) per step
    return xs, [torch.tanh(x @ target) for x in xs]


def compare_balancing(steps: int = 40, tokens: int = 64, hidden: int = 16, experts: int = 8, top_k: int = 2,
                      lr: float = 0.05, alpha: float = 0.01, gamma: float = 0.01, capacity_factor: float | None = None,
                      seed: int = 0) -> dict[str, dict]:
    """Train the same MoE on the same tokens with each method; per step: imbalance, dropped assignments, task loss."""
    for name, v in (("steps", steps), ("tokens", tokens), ("hidden", hidden), ("experts", experts)):
        positive_int(name, v)
    for name, v in (("lr", lr), ("alpha", alpha), ("gamma", gamma)):
        positive_real(name, v)
    xs, ys = _data(steps, tokens, hidden, seed)
    cap = None if capacity_factor is None else expert_capacity(tokens, experts, top_k, capacity_factor)
    out = {}
    for method in METHODS:
        moe = MoELayer(hidden, experts, top_k, capacity_factor=capacity_factor, seed=seed)
        opt = torch.optim.SGD(moe.parameters(), lr=lr)
        bias = torch.zeros(experts) if method == "aux_free" else None
        rec = {"imbalance": [], "dropped": [], "loss": []}
        for x, y in zip(xs, ys):
            out_y, r = moe_step(moe, x, bias, cap)
            task = F.mse_loss(out_y, y)
            loss = task + (load_balancing_loss(r, alpha) if method == "aux" else 0.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if bias is not None:  # after the step, no gradient: push overloaded experts down, idle ones up
                update_bias(bias, r.experts, gamma)
            rec["imbalance"].append(imbalance(r.experts, experts))
            rec["dropped"].append(r.dropped)
            rec["loss"].append(task.item())
        out[one_of("method", method, METHODS)] = rec
    return out
