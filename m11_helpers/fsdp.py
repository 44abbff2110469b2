"""FSDP2 (`fully_shard`, DTensor) on a CPU device mesh: shard bytes, count the traffic, spot fallbacks (lesson 05).

    mesh = init_device_mesh("cpu", (world_size,))
    apply_fsdp(model, mesh, reshard_after_forward=True)   # each block, then the root: ZeRO-3
    counter = TrafficCounter().attach(model)               # counts every all-gather / reduce-scatter
    local_param_numel(model)                               # Ψ/N: this rank's shards, measured
    fsdp_memory_report()                                   # full blocks alive during and after forward

FSDP is PyTorch's ZeRO-3 (Zhao et al. 2023, "PyTorch FSDP"; FSDP2 docs, torch.distributed.fsdp):
parameters live as DTensor `Shard(0)` slices, are all-gathered just before a module's forward,
freed after it (`reshard_after_forward=True`), gathered again for backward, and gradients are
reduce-scattered: 3Ψ per step. `reshard_after_forward=False` keeps them after forward (no second
all-gather: 2Ψ, ZeRO-2-like memory for parameters during the step).

Accelerate's FSDP plugin does not shard on CPU: `is_sharded` tells whether a prepared model really is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

# Imported here, in the caller, on purpose: ranks forked by `launch` inherit them instead of each
# paying the seconds FSDP's import costs (it pulls in torch._dynamo).
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from m11_helpers.comm_count import CommCounter
from m11_helpers.comm_model import bus_factor
from m11_helpers.compare import max_diff

__all__ = ["apply_fsdp", "local_param_numel", "TrafficCounter", "is_sharded",
           "fsdp_step_report", "fsdp_memory_report", "accelerate_fsdp_probe"]


def apply_fsdp(model: nn.Module, mesh, reshard_after_forward: bool = True) -> nn.Module:
    """fully_shard each transformer block (or each Linear of a Sequential), then the root (torchtitan's order)."""
    units = list(model.blocks) if hasattr(model, "blocks") else [m for m in model.children()
                                                                  if any(True for _ in m.parameters())]
    for unit in units:  # one all-gather per unit: a block's parameters arrive together, just in time
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)  # the rest (embeddings, final norm)
    return model


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def local_param_numel(model: nn.Module) -> int:
    """Elements of parameters this rank stores: the DTensor shards' local parts (the full tensor if not sharded)."""
    return sum(_local(p).numel() for p in model.parameters())


def is_sharded(model: nn.Module) -> bool:
    """True when the model's parameters are DTensor shards (FSDP2 really applied), False for a DDP fallback."""
    return any(isinstance(p, DTensor) for p in model.parameters())


class TrafficCounter(CommCounter):
    """FSDP2's collectives, counted into the kit's `comm_count.CommCounter` by counting versions of its default
    all-gather / reduce-scatter.

    Per call: the payload this rank passed (its shard, its full gradient input), wire (N−1)/N·S of a
    ring (`comm_model.bus_factor`), and in `elements` the size S: the gathered (full) tensor of an
    all-gather, the full input of a reduce-scatter — the Ψ of the ZeRO paper's accounting (§7).
    `totals()` gives the elements per kind and the calls.
    """

    def attach(self, model: nn.Module) -> "TrafficCounter":
        try:  # private and version-dependent (FSDP2's default collectives): only the counter needs them
            from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
        except ImportError as err:
            raise RuntimeError(f"TrafficCounter needs FSDP2's DefaultAllGather/DefaultReduceScatter (private, "
                               f"torch.distributed.fsdp._fully_shard._fsdp_collectives), which torch "
                               f"{torch.__version__} does not have: {err}") from err
        count = self._count

        class CountingAllGather(DefaultAllGather):
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                count("all_gather", input_tensor, output_tensor, group)  # (S,) this rank's, (N·S,) gathered
                return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                                        async_op=async_op)

        class CountingReduceScatter(DefaultReduceScatter):
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                count("reduce_scatter", input_tensor, input_tensor, group)  # (N·S,) reduced
                return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                                        op=op, async_op=async_op)

        found = False
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_all_gather(CountingAllGather())
                module.set_custom_reduce_scatter(CountingReduceScatter())
                found = True
        if not found:
            raise ValueError("model has no FSDPModule: call fully_shard (apply_fsdp) before attaching the counter")
        return self

    def _count(self, op: str, passed: torch.Tensor, full: torch.Tensor, group) -> None:
        size = full.numel() * full.element_size()  # S
        self.add(op, passed.numel() * passed.element_size(), bus_factor(op, dist.get_world_size(group)) * size,
                 full.numel())

    def reset(self) -> None:
        self.clear()

    def totals(self) -> dict[str, int]:
        """Elements per kind since the last reset, and the number of calls."""
        return {"all_gather": self.elements("all_gather"), "reduce_scatter": self.elements("reduce_scatter"),
                "calls": self.calls()}


def fsdp_step_report(reshard_after_forward: bool = True, batch: int = 8, seed: int = 0) -> dict:
    """Run on each rank (via `launch`): shard the tiny GPT, one training step's forward + backward.

    Returns this rank's measured parameter elements, the step's traffic, the full model size, and
    the largest gradient difference from DDP on the same data (full_tensor() of FSDP's shards).
    """
    from m11_helpers.models import tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, 64, (batch, 32), generator=gen).chunk(n)[rank]  # (batch/N, T) this rank's data
    mesh = init_device_mesh("cpu", (n,))
    model = apply_fsdp(tiny_gpt(seed), mesh, reshard_after_forward)
    counter = TrafficCounter().attach(model)
    total = sum(p.numel() for p in model.parameters())  # DTensor numel is the full (global) size
    local = local_param_numel(model)
    model(x, x).backward()
    traffic = counter.totals()
    ddp = DDP(tiny_gpt(seed))
    ddp(x, x).backward()
    diff = max_diff([p.grad for p in model.parameters()], [q.grad for q in ddp.module.parameters()])
    del ddp  # a live DDP model at exit can abort the process (docs/cpu-distributed-facts.md)
    return {"rank": rank, "world_size": n, "num_params": total, "local_params": local,
            "all_gather": traffic["all_gather"], "reduce_scatter": traffic["reduce_scatter"],
            "calls": traffic["calls"], "max_grad_diff_vs_ddp": diff}


def _forward_backward_memory(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    from m11_helpers.live_memory import track_live_bytes

    with track_live_bytes() as mem:
        loss = model(x, x)
        mem.phase("after forward")
        mem.phase("backward")
        loss.backward()
    return {"forward peak": mem.peaks["start"], "after forward": mem.peaks["after forward"],
            "backward peak": mem.peaks["backward"]}


def fsdp_memory_report(batch: int = 1, seq_len: int = 8, seed: int = 0) -> dict:
    """Run on each rank (via `launch`): tensor bytes alive during one step, unsharded vs FSDP2 both ways.

    Measured with `m11_helpers.live_memory` (bytes the step's ops allocate and still hold) on the tiny
    GPT, a short sequence so that activations stay small next to a block's parameters. The same step
    without sharding gives the activations alone; what FSDP adds on top is parameters gathered and
    not yet freed. Returns bytes per case and `block_bytes`, one block's full fp32 parameters.
    """
    from m11_helpers.models import tiny_gpt

    x = torch.randint(0, 64, (batch, seq_len), generator=torch.Generator().manual_seed(seed + 1))  # (b, T)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plain = tiny_gpt(seed)
    out = {"block_bytes": 4 * sum(p.numel() for p in plain.blocks[0].parameters()),
           "unsharded": _forward_backward_memory(plain, x)}
    for reshard in (True, False):
        out[f"reshard_after_forward={reshard}"] = _forward_backward_memory(
            apply_fsdp(tiny_gpt(seed), mesh, reshard), x)
    return out


def accelerate_fsdp_probe(fsdp_version: int = 2) -> dict:
    """Run on each rank (via `launch`): ask Accelerate for FSDP on CPU and report what it really did."""
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    from m11_helpers.models import mlp

    plugin = FullyShardedDataParallelPlugin(fsdp_version=fsdp_version)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    model = acc.prepare(mlp())
    out = {"distributed_type": str(acc.distributed_type), "wrapper": type(model).__name__,
           "sharded": is_sharded(model), "local_params": local_param_numel(model)}
    del model
    return out
