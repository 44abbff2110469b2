"""Sequence parallelism (Megatron-SP): tensor parallelism whose LayerNorm/residual regions are split along the sequence
(lesson 12).

    block = SPBlock(tiny_gpt().blocks[0])        # on each rank of the tensor-parallel group: its weight slices
    y_local = block(x_local)                     # x_local (B, T/t, C): this rank's part of the sequence
    loss.backward(); sync_sequence_parallel_grads(block)   # LayerNorm and row-bias gradients: summed over ranks

Plain tensor parallelism (lesson 04) leaves LayerNorm, dropout and the residual adds replicated: every
rank of the group stores the same (B, T, C) activations there. Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", arXiv:2205.05198, §4.2.2, Fig. 5–6) split
those regions along the sequence instead, and replace TP's conjugate pair f/g with
  g  = all-gather along the sequence forward, reduce-scatter backward (before a column-parallel linear),
  ḡ  = reduce-scatter forward, all-gather backward (after a row-parallel linear).
An all-reduce *is* a reduce-scatter followed by an all-gather, so the bytes on the wire are TP's.

To store only the shard (÷ t) of the LayerNorm output that feeds a column-parallel linear,
`gather_linear` saves the shard and all-gathers it again in backward, as Megatron-LM does
(`LinearWithGradAccumulationAndAsyncCommunication` in megatron/core/tensor_parallel/layers.py): one
extra all-gather per such linear in backward, which Megatron overlaps with the weight-gradient GEMM.
`regather=False` keeps the gathered input instead (TP's bytes exactly, more memory). Works on the
default process group (the whole world is the tensor-parallel group).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from m11_helpers.collectives import backend_all_gather, backend_reduce_scatter
from m11_helpers.comm_count import CommCounter
from m11_helpers.comm_model import bus_factor
from m11_helpers.tensor_parallel import TPMLP, TPAttention

__all__ = ["COMM", "gather_sequence", "scatter_sequence", "gather_linear", "SPBlock",
           "sync_sequence_parallel_grads", "ring_bytes"]

# per op: calls, payload (the shard gathered, the full input reduce-scattered), wire = ring bytes sent
COMM = CommCounter()


def ring_bytes(op: str, full_bytes: float, world: int) -> float:
    """Bytes one rank sends in a ring: all-gather / reduce-scatter (t−1)/t·S, all-reduce 2(t−1)/t·S (S = the full
    tensor): lesson 02's bus factor (`comm_model.bus_factor`, nccl-tests) times S."""
    return bus_factor(op, world) * full_bytes


def _note(op: str, full: torch.Tensor, world: int) -> None:
    """Count one collective over the (B, T, C) tensor `full`: an all-gather's output, a reduce-scatter's input."""
    size = full.numel() * full.element_size()  # S
    COMM.add(op, size / world if op == "all_gather" else size, ring_bytes(op, size, world), full.numel())


def _all_gather_seq(x: torch.Tensor) -> torch.Tensor:
    """(B, T/t, C) on each rank -> (B, T, C), rank order along the sequence."""
    t = dist.get_world_size()
    flat = x.transpose(0, 1).contiguous()  # (T/t, B, C): the sequence first, so chunks are contiguous
    out = flat.new_empty((t * flat.shape[0], *flat.shape[1:]))  # (T, B, C)
    backend_all_gather(out, flat)
    _note("all_gather", out, t)
    return out.transpose(0, 1)  # (B, T, C)


def _reduce_scatter_seq(x: torch.Tensor) -> torch.Tensor:
    """(B, T, C) partial sums on each rank -> (B, T/t, C): this rank's part of the sum."""
    t = dist.get_world_size()
    flat = x.transpose(0, 1).contiguous()  # (T, B, C)
    if flat.shape[0] % t:
        raise ValueError(f"the sequence length ({flat.shape[0]}) must be divisible by the group size ({t})")
    out = flat.new_empty((flat.shape[0] // t, *flat.shape[1:]))  # (T/t, B, C)
    backend_reduce_scatter(out, flat)
    _note("reduce_scatter", flat, t)
    return out.transpose(0, 1)  # (B, T/t, C)


class _Gather(torch.autograd.Function):
    """g: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x):
        return _all_gather_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad)


class _Scatter(torch.autograd.Function):
    """ḡ: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad)


def gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """Megatron-SP's g (Korthikanti et al. 2022, §4.2.2): (B, T/t, C) -> (B, T, C)."""
    return _Gather.apply(x)


def scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """Megatron-SP's ḡ (Korthikanti et al. 2022, §4.2.2): (B, T, C) partial sums -> (B, T/t, C) of the sum."""
    return _Scatter.apply(x)


class _GatherLinear(torch.autograd.Function):
    """all-gather + column-parallel linear that saves only the shard and all-gathers it again in backward."""

    @staticmethod
    def forward(ctx, x_local, weight, bias):
        with torch.no_grad():
            full = _all_gather_seq(x_local)  # (B, T, C)
            out = F.linear(full, weight, bias)  # (B, T, out/t)
        ctx.save_for_backward(x_local, weight)  # the shard: ÷ t of what a plain linear would keep
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x_local, weight = ctx.saved_tensors
        full = _all_gather_seq(x_local)  # again: memory traded for one more all-gather
        grad_w = grad.flatten(0, -2).T @ full.flatten(0, -2)  # (out/t, C)
        grad_b = grad.flatten(0, -2).sum(0) if ctx.has_bias else None
        grad_x = _reduce_scatter_seq(grad @ weight)  # (B, T/t, C): sum over the group, this rank's part
        return grad_x, grad_w, grad_b


def gather_linear(x_local: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  regather: bool = True) -> torch.Tensor:
    """g then a column-parallel linear: (B, T/t, C) -> (B, T, out/t). regather=True stores the shard only."""
    if regather:
        return _GatherLinear.apply(x_local, weight, bias)
    return F.linear(gather_sequence(x_local), weight, bias)


class SPBlock(nn.Module):
    """The tiny GPT's block with tensor + sequence parallelism; weights sliced as lesson 04's TPBlock."""

    def __init__(self, block, regather: bool = True):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.ln_1, self.ln_2 = block.ln_1, block.ln_2  # replicated weights, sequence-sharded activations
        attn = TPAttention.from_attention(block.attn, rank, world)
        mlp = TPMLP.from_mlp(block.mlp, rank, world)
        self.qkv, self.attn_proj, self.local_heads = attn.qkv, attn.proj, attn.local_heads
        self.fc, self.proj = mlp.fc, mlp.proj
        self.regather = regather

    def _attention(self, x_local: torch.Tensor) -> torch.Tensor:
        qkv = gather_linear(self.ln_1(x_local), self.qkv.weight, self.qkv.bias, self.regather)  # (B, T, 3C/t)
        B, T, _ = qkv.shape
        q, k, v = (t.view(B, T, self.local_heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))  # (B, nh/t, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)  # (B, T, C/t)
        return scatter_sequence(F.linear(y, self.attn_proj.weight)) + self.attn_proj.bias  # (B, T/t, C)

    def _mlp(self, x_local: torch.Tensor) -> torch.Tensor:
        u = gather_linear(self.ln_2(x_local), self.fc.weight, self.fc.bias, self.regather)  # (B, T, ffn/t)
        return scatter_sequence(F.linear(F.gelu(u), self.proj.weight)) + self.proj.bias  # (B, T/t, C)

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        x_local = x_local + self._attention(x_local)  # (B, T/t, C): residual on the shard
        return x_local + self._mlp(x_local)

    def sequence_parallel_params(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole but sees only its sequence part through: their gradients are partial."""
        return [*self.ln_1.parameters(), *self.ln_2.parameters(), self.attn_proj.bias, self.proj.bias]


def sync_sequence_parallel_grads(block: SPBlock) -> None:
    """Sum the partial gradients of LayerNorm weights and row-parallel biases over the group (Megatron's
    `allreduce_sequence_parallel_grads`): each rank saw only T/t tokens through them."""
    for p in block.sequence_parallel_params():
        if p.grad is not None:
            dist.all_reduce(p.grad)
