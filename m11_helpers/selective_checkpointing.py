"""PyTorch's selective activation checkpointing (SAC): a policy decides, op by op, what to keep and what to recompute.

    ctx = sac_context(matmul_policy)                           # keep the Linear layers' outputs
    checkpoint(block, x, use_reentrant=False, context_fn=ctx)  # everything else is recomputed in backward
    gpt_forward(model, idx, targets, policy="blocks", context_fn=ctx)

`torch.utils.checkpoint.create_selective_checkpoint_contexts(policy_fn)` (PyTorch ≥ 2.4, "Selective
Activation Checkpoint" in the torch.utils.checkpoint docs) runs the checkpointed region under a
TorchDispatchMode that calls `policy_fn(ctx, op, *args, **kwargs)` for every ATen op: MUST_SAVE /
PREFER_SAVE keep the op's output in a cache the backward reads instead of recomputing it;
MUST_RECOMPUTE / PREFER_RECOMPUTE recompute it. `op` is an OpOverload such as `torch.ops.aten.mm.default`,
not `torch.mm`. torchtitan's default "op" SAC keeps matmuls and the attention kernels; Korthikanti et
al. 2022 (§4.2) keep everything but the core attention. Which of the two uses less memory depends on what
the saved ops' outputs weigh: measured in lesson 08. The cached outputs are not saved through autograd's
saved-tensor hooks, so `m11_helpers.memory` does not see them: measure with `activation_costs`.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # documented in PyTorch's TorchDispatchMode docs
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["LINEAR_MATMULS", "ALL_MATMULS", "ATTENTION_KERNELS", "matmul_policy", "save_ops_policy", "sac_context",
           "matmul_outputs"]

aten = torch.ops.aten
LINEAR_MATMULS = frozenset({aten.mm.default, aten.addmm.default})  # nn.Linear on 2-D views of (B, T, C)
ALL_MATMULS = LINEAR_MATMULS | {aten.bmm.default}  # + the textbook attention's q·kᵀ and softmax·v
# the fused attention kernels a policy may keep (torchtitan keeps these): whichever this torch build has
ATTENTION_KERNELS = frozenset(getattr(aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu") if hasattr(aten, name))


def save_ops_policy(ops: Iterable) -> Callable[..., CheckpointPolicy]:
    """A SAC policy: MUST_SAVE the outputs of `ops` (ATen OpOverloads), PREFER_RECOMPUTE everything else."""
    keep = frozenset(ops)

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


matmul_policy = save_ops_policy(LINEAR_MATMULS)  # "save matmuls only": the Linear layers' outputs
matmul_policy.__doc__ = "Keep the outputs of the Linear layers' matmuls (aten.mm, aten.addmm); recompute the rest."


def sac_context(policy: Callable[..., CheckpointPolicy] = matmul_policy) -> Callable:
    """The context_fn to hand to checkpoint(..., use_reentrant=False): selective checkpointing with `policy`."""
    if not callable(policy):
        raise ValueError(f"policy must be a callable (ctx, op, *args, **kwargs) -> CheckpointPolicy, got {policy!r}")
    return functools.partial(create_selective_checkpoint_contexts, policy)


class _Outputs(TorchDispatchMode):
    def __init__(self, ops):
        super().__init__()
        self.ops, self.nbytes = ops, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.ops:
            self.nbytes.append(out.untyped_storage().nbytes())
        return out


def matmul_outputs(module: torch.nn.Module, *args, ops: Iterable = LINEAR_MATMULS) -> list[int]:
    """Bytes of each output of `ops` (the Linear matmuls), in the order one forward of `module(*args)` runs them."""
    with torch.no_grad(), _Outputs(frozenset(ops)) as seen:
        module(*args)
    return seen.nbytes
