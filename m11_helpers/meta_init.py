"""Build a model on the meta device, shard it, then allocate and initialise only this rank's shards.

    with torch.device("meta"):
        model = TinyGPT(cfg)                  # shapes only: no memory, no random numbers drawn
    fully_shard(...)                          # optional: parameters become DTensor shards (still meta)
    materialize(model, device, seed=0)        # to_empty + GPT-2 init; every world size gets the same weights

Why: a model built the ordinary way is allocated and initialised whole on every rank before FSDP
shards it — 28 GB of fp32 weights per rank for the 7B example. On the meta device construction
costs nothing; `to_empty` allocates each rank's shards only (FSDP2 docs, "meta-device
initialisation"; torchtitan does the same). The weights must then be initialised *as if* the model
were whole, or a run on 4 ranks would start from different weights than one on 2: every rank draws
each parameter's full tensor from one seeded generator, in `named_parameters()` order, and keeps its
own slice (`distribute_tensor(..., src_data_rank=None)`: no communication; torch < 2.7 has no such
keyword and scatters rank 0's tensor instead: the same values, since every rank drew the same
tensor). That costs one full parameter of CPU memory at a time, never the whole model.

The initialisation is GPT-2's (Radford et al. 2019; nanoGPT): Linear and Embedding weights
N(0, 0.02), biases 0, LayerNorm/RMSNorm weights 1 and biases 0. Buffers are not handled: a model
with buffers (RoPE tables) must recompute them after `to_empty`, so it is refused. Lesson 10.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from m11_helpers.validate import non_negative_int

__all__ = ["materialize", "init_value", "STD"]

STD = 0.02  # GPT-2's weight standard deviation


def init_value(module: nn.Module, name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """The full initial value of `module`'s parameter `name` (GPT-2's rule), drawn from `generator`."""
    if isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight":
        return torch.randn(shape, generator=generator) * STD
    if name == "bias":
        return torch.zeros(shape)
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and name == "weight":
        return torch.ones(shape)
    raise ValueError(f"no initialisation rule for {type(module).__name__}.{name}: add one to init_value")


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device | str, seed: int = 0) -> nn.Module:
    """`model.to_empty(device)`, then initialise every parameter (sharded or not) from `seed`; returns `model`."""
    non_negative_int("seed", seed)
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"model has buffers {buffers[:3]}: recompute them after to_empty (materialize only "
                         "initialises parameters)")
    # Allocate this rank's storage (its shards under FSDP2), uninitialised. Swapping tensors in place
    # keeps each Parameter object, so tied weights stay tied: without it to_empty gives a DTensor
    # parameter a new object per module, and FSDP2 would train the head's copy of the tied embedding.
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    owners = {id(p): (m, n) for m in model.modules() for n, p in m.named_parameters(recurse=False)}
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():  # a tied parameter once, in the same order on every rank
        module, name = owners[id(p)]
        full = init_value(module, name, p.shape, generator).to(p.device)  # p.shape: the GLOBAL shape, DTensor or not
        if isinstance(p, DTensor):
            p.to_local().copy_(_local_slice(full, p))  # this rank's slice of the same full tensor
        else:
            p.copy_(full)
    return model


def _local_slice(full: torch.Tensor, p: DTensor) -> torch.Tensor:
    """This rank's part of `full` under `p`'s mesh and placements."""
    try:
        # Every rank holds the same `full`: each keeps its own slice, nothing is sent.
        return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    except TypeError as err:
        # `src_data_rank` is torch 2.7 (pytorch/pytorch#143883); the floor is 2.6. Without it rank 0's
        # tensor is scattered: a collective, which every rank reaches here in the same order.
        if "src_data_rank" not in str(err):
            raise
        return distribute_tensor(full, p.device_mesh, p.placements).to_local()
