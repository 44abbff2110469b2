"""Lesson 05 — FSDP2's knobs as practitioners tune them, each measured on real ranks: memory, traffic, equality.

    rows = launch(measure_knobs, list(KNOBS), num_processes=4)[0]   # per setting: peaks, gathers, bytes, grad error
    show_table([[k, r["forward_peak"], …] for k, r in rows.items()])

Settings (torch.distributed.fsdp.fully_shard on each block of the tiny GPT, then the root):
  reshard=True     free each block's full parameters after its forward; gather again in backward (ZeRO-3: 3Ψ)
  reshard=False    keep them until backward (no second gather: 2Ψ, parameters whole through the step)
  reshard=2        after forward keep shards over groups of 2 ranks (ZeRO++ hpZ, Wang et al. 2023 §3.2):
                   backward's all-gather then runs inside a group of 2 (on a cluster: inside a node)
  prefetch=2       explicit `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch` of the next
                   two blocks (FSDP2 prefetches one by default): gathers run earlier, more is whole at once
  bf16             MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): half the all-gather bytes
  cpu_offload      CPUOffloadPolicy: shards and optimizer step on the host; on a CPU-only machine the host is
                   the device, so this only shows the policy runs — the memory it saves lives on a GPU
Memory: tensor bytes alive at the peak of forward and of backward (`m11_helpers.live_memory`). Traffic:
every all-gather / reduce-scatter FSDP2 issues, with its group size and dtype (its custom-collective hook).
Gradients are compared with the same step in one process (full_tensor of each sharded gradient).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# In the caller on purpose (pipeline_run, fsdp): forked ranks inherit the import.
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from m11_helpers.validate import one_of

__all__ = ["KNOBS", "measure_knobs", "WireLog"]

KNOBS = ("reshard=True", "reshard=False", "reshard=2", "prefetch=2", "bf16", "cpu_offload")


class WireLog:
    """FSDP2's all-gathers and reduce-scatters: (kind, elements of the full tensor, group size, dtype, wire bytes).

    Wire bytes per rank for a ring over g ranks: (g−1)/g × the full tensor (Chan et al. 2007; lesson 02).
    """

    def __init__(self):
        self.records: list[tuple[str, int, int, torch.dtype, float]] = []

    def attach(self, model) -> "WireLog":
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        rec = self.records

        def wire(t, group):
            g = group.size()
            return (g - 1) / g * t.numel() * t.element_size()

        class Gather(DefaultAllGather):
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                rec.append(("all_gather", output_tensor.numel(), group.size(), output_tensor.dtype,
                            wire(output_tensor, group)))
                return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                                        async_op=async_op)

        class Scatter(DefaultReduceScatter):
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                rec.append(("reduce_scatter", input_tensor.numel(), group.size(), input_tensor.dtype,
                            wire(input_tensor, group)))
                return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                                        op=op, async_op=async_op)

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_custom_all_gather(Gather())
                m.set_custom_reduce_scatter(Scatter())
        return self

    def totals(self) -> dict:
        out = {"gathers": 0, "gather_wire_bytes": 0.0, "scatter_wire_bytes": 0.0, "gather_groups": set(),
               "gather_dtypes": set(), "scatter_dtypes": set()}
        for kind, _, g, dtype, b in self.records:
            if kind == "all_gather":
                out["gathers"] += 1
                out["gather_wire_bytes"] += b
                out["gather_groups"].add(g)
                out["gather_dtypes"].add(dtype)
            else:
                out["scatter_wire_bytes"] += b
                out["scatter_dtypes"].add(dtype)
        return out


def _shard(model, mesh, knob: str):
    kw: dict = {"mesh": mesh}
    if knob.startswith("reshard="):
        v = knob.split("=")[1]
        kw["reshard_after_forward"] = {"True": True, "False": False}[v] if v in ("True", "False") else int(v)
    if knob == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if knob == "cpu_offload":
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **{**kw, "reshard_after_forward": True})  # the root (embeddings, head): ZeRO-3 always
    if knob == "prefetch=2":
        blocks = list(model.blocks)
        for i, b in enumerate(blocks):
            b.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
            b.set_modules_to_backward_prefetch(blocks[max(0, i - 2):i][::-1])
    return model


def measure_knobs(knobs: list[str], batch: int = 4, seq_len: int = 8, seed: int = 0) -> dict[str, dict]:
    """On each rank (via `launch`): one forward + backward of the tiny GPT per setting; memory, traffic, grad error."""
    from m11_helpers.launch import rank_device
    from m11_helpers.live_memory import track_live_bytes
    from m11_helpers.models import tiny_gpt

    for k in knobs:
        one_of("knob", k, KNOBS)
    rank, n = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    x = torch.randint(0, 64, (batch * n, seq_len), generator=torch.Generator().manual_seed(seed + 1)).to(device)  # (B, T)
    ref = tiny_gpt(seed).to(device)
    ref(x, x).backward()  # the one-process step on the whole batch (the loss is a mean: ranks' means average to it)
    mesh = init_device_mesh(device.type, (n,))
    out = {}
    for knob in knobs:
        model = _shard(tiny_gpt(seed).to(device), mesh, knob)
        log = WireLog().attach(model)
        local = x.chunk(n)[rank]  # (B/N, T): this rank's rows
        with track_live_bytes() as mem:
            loss = model(local, local)
            mem.phase("backward")
            loss.backward()
        err = 0.0
        for p, q in zip(model.parameters(), ref.parameters()):
            err = max(err, (p.grad.full_tensor().float() - q.grad).abs().max().item())
        t = log.totals()
        out[knob] = {"forward_peak": mem.peaks["start"], "backward_peak": mem.peaks["backward"],
                     "gathers": t["gathers"], "gather_wire_bytes": t["gather_wire_bytes"],
                     "scatter_wire_bytes": t["scatter_wire_bytes"], "gather_groups": t["gather_groups"],
                     "gather_dtypes": t["gather_dtypes"], "scatter_dtypes": t["scatter_dtypes"], "grad_error": err}
    return out
