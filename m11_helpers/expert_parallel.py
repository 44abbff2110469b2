"""Mixture of experts and expert parallelism: a top-k router, SwiGLU experts, capacity, token dropping, all-to-all
(lesson 12).

    moe = MoELayer(hidden=32, experts=8, top_k=2, ffn_hidden=64, capacity_factor=1.25, seed=0)
    y, aux = moe(x, groups=4)                 # one process: every expert here, capacity per group of tokens
    ep = ExpertParallelMoE(moe)               # on each of N ranks: the router, and experts rank·E/N … (rank+1)·E/N − 1
    y_local, aux_local = ep(x_local)          # tokens travel to their experts' ranks and back (all_to_all_single)

Router (Shazeer et al. 2017; GShard, Lepikhin et al. 2020, §2.2): p = softmax(x W_g); each token goes to
its top-k experts with gates p (renormalised over the k when k > 1, as Mixtral does). Capacity
(Switch Transformer, Fedus et al. 2021, §2.2): each expert takes at most C = ⌈cf · k · tokens / E⌉
tokens of a group; first choices are served before second choices, earlier tokens first, and the
rest are **dropped** (their output is 0: the residual carries them past the layer). Auxiliary
load-balancing loss (Switch §2.2, eq. 4): α·E·Σ_i f_i·P_i, f_i the fraction of routed assignments
that chose expert i, P_i the mean router probability of expert i; it is α at perfect balance.
Experts: SwiGLU, w2(silu(w1 x) ⊙ w3 x) (Shazeer 2020, "GLU Variants Improve Transformer").

Expert parallelism (GShard §2.3; DeepSpeed-MoE): rank r owns E/N experts. Dispatch = one
all_to_all_single of per-expert token counts, then one of the tokens with variable splits; combine =
the reverse all-to-all, then a gate-weighted sum. Both are differentiable (backward is the reverse
all-to-all). Equal to the single-process layer (with groups = N) token for token, drops included.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from m11_helpers.comm_count import CommCounter
from m11_helpers.comm_model import ring_bytes_sent
from m11_helpers.model_states import gradient_bytes
from m11_helpers.validate import non_negative_real, positive_int, positive_real

__all__ = ["COMM", "SwiGLUExpert", "Routing", "expert_capacity", "route", "load_balancing_loss", "MoELayer",
           "all_to_all", "ExpertParallelMoE", "all_to_all_bytes", "dp_all_reduce_bytes"]

# "all_to_all": the token exchanges, payload = this rank's send buffer, wire = the rows sent to other ranks;
# "all_to_all (counts)": the small exchanges of per-expert token counts before them
COMM = CommCounter()


class SwiGLUExpert(nn.Module):
    """One expert: w2(silu(w1 x) ⊙ w3 x), no biases (Shazeer 2020; the Llama/Mixtral MLP)."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (tokens, h)


def expert_capacity(tokens: int, experts: int, top_k: int = 1, capacity_factor: float = 1.25) -> int:
    """C = ⌈cf · k · tokens / E⌉: the most tokens one expert takes from a group (Switch Transformer §2.2)."""
    positive_int("tokens", tokens)
    positive_int("experts", experts)
    positive_int("top_k", top_k)
    positive_real("capacity_factor", capacity_factor)
    return math.ceil(capacity_factor * top_k * tokens / experts)


@dataclasses.dataclass
class Routing:
    """Where each token goes: top-k experts, gates, and which assignments fit under the capacity."""

    probs: torch.Tensor  # (T, E) router softmax
    experts: torch.Tensor  # (T, k) chosen experts, best first
    gates: torch.Tensor  # (T, k) weights of the chosen experts' outputs
    keep: torch.Tensor  # (T, k) bool: False = dropped (over capacity)

    @property
    def dropped(self) -> int:
        """Assignments dropped (a token dropped by both of its top-2 experts counts twice)."""
        return int((~self.keep).sum())


def route(logits: torch.Tensor, top_k: int, capacity: int | None) -> Routing:
    """Top-k routing of one group of tokens (T, E) with first-choice-first, first-token-first capacity."""
    positive_int("top_k", top_k)
    probs = logits.softmax(dim=-1)  # (T, E)
    top, experts = probs.topk(top_k, dim=-1)  # (T, k), (T, k)
    gates = top / top.sum(dim=-1, keepdim=True) if top_k > 1 else top  # renormalise over the chosen k
    if capacity is None:
        return Routing(probs, experts, gates, torch.ones_like(experts, dtype=torch.bool))
    order = experts.T.reshape(-1)  # (k·T,): all first choices (in token order), then all second choices
    onehot = F.one_hot(order, probs.shape[-1])  # (k·T, E)
    position = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1  # place of each assignment in its expert's queue
    keep = (position < capacity).view(top_k, -1).T  # (T, k)
    return Routing(probs, experts, gates, keep)


def load_balancing_loss(r: Routing, alpha: float = 0.01) -> torch.Tensor:
    """α · E · Σ_i f_i · P_i (Switch Transformer §2.2, eq. 4–6; f over all k choices, before dropping)."""
    non_negative_real("alpha", alpha)
    E = r.probs.shape[-1]
    f = F.one_hot(r.experts, E).float().sum(dim=(0, 1)) / r.experts.numel()  # (E,) share of assignments
    P = r.probs.mean(dim=0)  # (E,) mean router probability
    return alpha * E * (f.to(P.dtype) * P).sum()


class MoELayer(nn.Module):
    """The single-process reference: router + E SwiGLU experts, capacity applied per group of tokens."""

    def __init__(self, hidden: int, experts: int, top_k: int = 2, ffn_hidden: int | None = None,
                 capacity_factor: float | None = 1.25, seed: int = 0, dtype=torch.float32):
        super().__init__()
        for name, v in (("hidden", hidden), ("experts", experts), ("top_k", top_k)):
            positive_int(name, v)
        if top_k > experts:
            raise ValueError(f"top_k ({top_k}) must be at most experts ({experts})")
        if capacity_factor is not None:
            positive_real("capacity_factor (or None for no dropping)", capacity_factor)
        self.top_k, self.capacity_factor, self.num_experts = top_k, capacity_factor, experts
        # m11: cpu-only - the weights are drawn on the CPU generator (the same on every machine), moved after
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.router = nn.Linear(hidden, experts, bias=False, dtype=dtype)
            self.experts = nn.ModuleList(SwiGLUExpert(hidden, ffn_hidden or 2 * hidden).to(dtype)
                                         for _ in range(experts))

    def routing(self, x: torch.Tensor) -> Routing:
        """Route one group (T, h)."""
        cap = None if self.capacity_factor is None else expert_capacity(
            x.shape[0], self.num_experts, self.top_k, self.capacity_factor)
        return route(self.router(x), self.top_k, cap)

    def _group(self, x: torch.Tensor):
        r = self.routing(x)
        y = torch.zeros_like(x)  # (T, h): dropped tokens contribute nothing
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero((r.experts == e) & r.keep, as_tuple=True)
            if len(tok):
                y = y.index_add(0, tok, r.gates[tok, slot, None] * expert(x[tok]))
        return y, load_balancing_loss(r), r.dropped

    def forward(self, x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, h) -> (y (T, h), mean auxiliary loss); capacity counted separately in each of `groups` groups."""
        positive_int("groups", groups)
        outs = [self._group(g) for g in x.chunk(groups, dim=0)]
        self.last_dropped = sum(d for _, _, d in outs)
        return torch.cat([y for y, _, _ in outs]), torch.stack([a for _, a, _ in outs]).mean()


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with variable splits; backward is the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.cfg = (send, recv, group)
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        send, recv, group = ctx.cfg
        return _exchange(grad.contiguous(), recv, send, group), None, None, None


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))  # (Σ recv, h)
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    me = dist.get_rank(group)
    row = x[0].numel() * x.element_size() if x.shape[0] else 0
    COMM.add("all_to_all", sum(send) * row, (sum(send) - send[me]) * row, sum(send) * x[0].numel() if x.shape[0] else 0)
    return out


def all_to_all(x: torch.Tensor, send_splits: list[int], recv_splits: list[int], group=None) -> torch.Tensor:
    """Rows send_splits[j] of x go to rank j; returns the rows received, recv_splits[j] from rank j (differentiable)."""
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group)


class ExpertParallelMoE(nn.Module):
    """MoELayer with its experts spread over the ranks of `group`; call on every rank with its own tokens."""

    def __init__(self, moe: MoELayer, group=None):
        super().__init__()
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if moe.num_experts % self.world:
            raise ValueError(f"experts ({moe.num_experts}) must be divisible by the ranks ({self.world})")
        self.per_rank = moe.num_experts // self.world
        first = self.rank * self.per_rank
        self.moe, self.group = moe, group  # the router is replicated: its gradient needs an all-reduce (DP)
        self.local = nn.ModuleList(moe.experts[first:first + self.per_rank])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.moe.routing(x)  # this rank's tokens are one capacity group
        tok, slot = torch.nonzero(r.keep, as_tuple=True)  # kept assignments
        e = r.experts[tok, slot]
        order = torch.argsort(e, stable=True)  # sorted by expert = by destination rank
        tok, slot, e = tok[order], slot[order], e[order]
        counts = torch.bincount(e, minlength=self.moe.num_experts)  # (E,) tokens for each expert
        recv_counts = torch.empty_like(counts)  # (N·E/N,): from each rank, its counts for my experts
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        size = counts.element_size()
        COMM.add("all_to_all (counts)", counts.numel() * size, (self.world - 1) * self.per_rank * size, counts.numel())
        send = counts.view(self.world, self.per_rank).sum(1).tolist()
        recv = recv_counts.view(self.world, self.per_rank).sum(1).tolist()
        arrived = all_to_all(x[tok], send, recv, self.group)  # (Σ recv, h): by source rank, then expert
        # the expert of each arrived row
        local_e = torch.arange(self.per_rank, device=x.device).repeat(self.world).repeat_interleave(recv_counts)
        # zeros that stay in the graph: a rank whose experts got no token must still run both all-to-alls'
        # backward, or every other rank waits for it there (a deadlock, seen with a routing bias)
        out = arrived * 0  # (Σ recv, h)
        for i, expert in enumerate(self.local):
            rows = torch.nonzero(local_e == i, as_tuple=True)[0]
            if len(rows):
                out = out.index_copy(0, rows, expert(arrived[rows]))
        back = all_to_all(out, recv, send, self.group)  # (kept assignments, h), in the order sent
        y = torch.zeros_like(x).index_add(0, tok, r.gates[tok, slot, None] * back)  # (T, h)
        self.last_dropped = r.dropped
        return y, load_balancing_loss(r)


def all_to_all_bytes(tokens: int, hidden: int, top_k: int, world: int, dtype_bytes: int = 2) -> float:
    """Bytes one rank sends per MoE layer and step, balanced routing: 4 all-to-alls (dispatch, combine; ×2 for
    backward) of k·tokens·h·bytes, of which (N−1)/N leaves the rank (GShard §2.3 / DeepSpeed-MoE)."""
    for name, v in (("tokens", tokens), ("hidden", hidden), ("top_k", top_k), ("world", world),
                    ("dtype_bytes", dtype_bytes)):
        positive_int(name, v)
    return 4 * top_k * tokens * hidden * dtype_bytes * (world - 1) / world


def dp_all_reduce_bytes(expert_params: int, world: int, layout: str = "deepspeed") -> float:
    """Bytes one rank sends to all-reduce the experts' gradients if they were replicated (plain DP): a ring all-reduce
    (`comm_model.ring_bytes_sent`, 2(N−1)/N·G) of G = `model_states.gradient_bytes` in `layout`'s reduce dtype."""
    positive_int("world", world)
    return ring_bytes_sent(gradient_bytes(expert_params, layout), world)
