"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3), from scratch and with DTensor (lesson 04).

    fc = ColumnParallelLinear.from_linear(linear, rank, world)   # output features split: no communication
    proj = RowParallelLinear.from_linear(linear, rank, world)    # input features split: one all-reduce
    mlp = TPMLP.from_mlp(model.blocks[0].mlp)                    # column then row: 1 all-reduce forward, 1 backward
    attn = TPAttention.from_attention(model.blocks[0].attn)      # heads split across ranks

Each rank holds a slice of every weight. Two conjugate operators carry the communication:
`f` (identity forward, all-reduce backward) before a column-parallel layer and `g` (all-reduce
forward, identity backward) after a row-parallel one (the paper's Figure 3). `COMM` (the kit's
`comm_count.CommCounter`) counts the all-reduces, their payload and their ring wire bytes, so a lesson
can show "two all-reduces per layer forward".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from m11_helpers.comm_count import CommCounter
from m11_helpers.comm_model import bus_factor
from m11_helpers.validate import positive_int

COMM = CommCounter()  # "all_reduce": calls, payload (the tensor reduced), wire 2(N−1)/N·payload of a ring


def _all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    payload = x.numel() * x.element_size()
    COMM.add("all_reduce", payload, bus_factor("all_reduce", dist.get_world_size(group)) * payload, x.numel())
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


class _CopyToTP(torch.autograd.Function):
    """f: identity forward; all-reduce the gradient backward (each rank's branch saw the same input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (sum the partial products); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's f operator (Shoeybi et al. 2019, §3, Fig. 3)."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's g operator (Shoeybi et al. 2019, §3, Fig. 3)."""
    return _ReduceFromTP.apply(x, group)


def _rank_world(rank, world):
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
    return rank, world


def _split(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"{what} ({n}) must be divisible by the tensor-parallel world size ({world})")
    return n // world


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i: rank i holds rows [i·out/w, (i+1)·out/w) of the weight (= columns of A); output stays split."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group=None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out/w, in)
        self.bias = nn.Parameter(bias) if bias is not None else None  # (out/w,)
        self.group = group

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int | None = None, world: int | None = None, group=None):
        rank, world = _rank_world(rank, world)
        n = _split(linear.out_features, world, "out_features")
        rows = slice(rank * n, (rank + 1) * n)
        bias = linear.bias.detach()[rows].clone() if linear.bias is not None else None
        return cls(linear.weight.detach()[rows].clone(), bias, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.group), self.weight, self.bias)  # (..., out/w)


class RowParallelLinear(nn.Module):
    """Y = Σ_i X_i A_i: rank i holds columns [i·in/w, (i+1)·in/w) of the weight; one all-reduce sums them."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group=None):
        super().__init__()
        self.weight = nn.Parameter(weight)  # (out, in/w)
        self.bias = nn.Parameter(bias) if bias is not None else None  # (out,), replicated
        self.group = group

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int | None = None, world: int | None = None, group=None):
        rank, world = _rank_world(rank, world)
        n = _split(linear.in_features, world, "in_features")
        cols = slice(rank * n, (rank + 1) * n)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(linear.weight.detach()[:, cols].clone(), bias, group)

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x_local, self.weight), self.group)  # (..., out): partial sums added
        return y + self.bias if self.bias is not None else y  # the bias once, after the sum


class TPMLP(nn.Module):
    """The block's MLP, column-parallel fc then row-parallel proj: GELU acts on the split activations locally."""

    def __init__(self, fc: ColumnParallelLinear, proj: RowParallelLinear):
        super().__init__()
        self.fc, self.proj = fc, proj

    @classmethod
    def from_mlp(cls, mlp, rank: int | None = None, world: int | None = None, group=None):
        return cls(ColumnParallelLinear.from_linear(mlp.fc, rank, world, group),
                   RowParallelLinear.from_linear(mlp.proj, rank, world, group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, C); inside: (B, T, ffn/w)


class TPAttention(nn.Module):
    """Causal self-attention with heads/w heads per rank: q, k, v column-parallel, output projection row-parallel."""

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, local_heads: int):
        super().__init__()
        self.qkv, self.proj, self.local_heads = qkv, proj, local_heads

    @classmethod
    def from_attention(cls, attn, rank: int | None = None, world: int | None = None, group=None):
        rank, world = _rank_world(rank, world)
        heads = _split(attn.heads, world, "heads")
        C = attn.proj.in_features
        n = C // world
        # qkv's weight stacks q, k, v (3C, C): take this rank's heads from each of the three.
        rows = torch.cat([torch.arange(k * C + rank * n, k * C + (rank + 1) * n) for k in range(3)])
        w = attn.qkv.weight.detach()[rows].clone()  # (3C/w, C)
        b = attn.qkv.bias.detach()[rows].clone() if attn.qkv.bias is not None else None
        return cls(ColumnParallelLinear(w, b, group), RowParallelLinear.from_linear(attn.proj, rank, world, group), heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 × (B, T, C/w)
        q, k, v = (t.view(B, T, self.local_heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, nh/w, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh/w, T, hd): no communication
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, C) after the all-reduce


class TPBlock(nn.Module):
    """A transformer block with attention and MLP tensor-parallel; the LayerNorms are replicated."""

    def __init__(self, block, rank: int | None = None, world: int | None = None, group=None):
        super().__init__()
        self.ln_1, self.ln_2 = block.ln_1, block.ln_2
        self.attn = TPAttention.from_attention(block.attn, rank, world, group)
        self.mlp = TPMLP.from_mlp(block.mlp, rank, world, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def all_reduces_per_layer(batch: int, seq_len: int, hidden: int, bytes_per_element: int = 2) -> dict:
    """Per transformer layer and step: 2 all-reduces forward + 2 backward, each of b·s·h elements
    (Shoeybi et al. 2019, §3: "two all-reduces in the forward path and two in the backward path")."""
    for name, value in (("batch", batch), ("seq_len", seq_len), ("hidden", hidden),
                        ("bytes_per_element", bytes_per_element)):
        positive_int(name, value)
    size = batch * seq_len * hidden * bytes_per_element
    return {"forward": 2, "backward": 2, "bytes_each": size, "bytes_total": 4 * size}


def parallelize_mlp(mlp: nn.Module, mesh) -> nn.Module:
    """The same MLP with DTensor: fc ColwiseParallel, proj RowwiseParallel (weights become DTensor shards)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(mlp, mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})


def count_collectives(fn, *args) -> dict:
    """Run fn(*args) under DTensor's CommDebugMode; return {collective name: calls} (forward and backward)."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as mode:
        fn(*args)
    return {str(k).split(".")[-1]: v for k, v in mode.get_comm_counts().items()}
