"""Bytes per parameter of training with Adam, by memory layout: ZeRO's "model states", one owner for every lesson.

    bytes_per_param("autocast")      # {'weights': 4, 'grads': 4, 'master': 0, 'optimizer': 8, 'total': 16}
    model_state_bytes(7_500_000_000, "deepspeed", world_size=64, zero_stage=1)["total"]   # 31.4e9 (ZeRO Fig. 1)
    model_state_bytes(psi, "megatron", world_size=d, zero_stage=1)["total"]  # (6 + 12/d)·Ψ (Megatron Core)
    gradient_bytes(param_count(RUNNING_EXAMPLE), "autocast")   # 27.0e9: what one DDP step all-reduces

"Mixed precision" names several layouts that cost the same 16 B/param in different places, and they
communicate different bytes: torch.amp autocast keeps fp32 parameters *and fp32 gradients* (DDP
all-reduces 4 B/param), DeepSpeed keeps 16-bit parameters and gradients next to an fp32 master
copy (ZeRO §3.1: 2Ψ + 2Ψ + 12Ψ = 16), Megatron-LM's bf16 keeps bf16 parameters with fp32 main gradients
(Megatron Core's table: 18 B/param, 6 + 12/d with its distributed optimizer), FSDP2's
MixedPrecisionPolicy keeps fp32 shards and gathers bf16 copies. Each `Layout` says which framework uses it and where that is documented. Adam's two
moments are fp32 in every layout but "pure-bf16". Activations are not model states: see
`m11_helpers.activations`. AdamW's `step` counter (one 4-byte scalar per parameter *tensor*) is left out.
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import one_of, positive_int

__all__ = ["Layout", "LAYOUTS", "MEGATRON_CORE_TABLE", "PARTS", "ZERO_STAGES", "as_layout", "bytes_per_param", "model_state_bytes",
           "gradient_bytes"]

PARTS = ("weights", "grads", "master", "optimizer")
ZERO_STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Bytes per parameter of each model state, and the dtype (bytes/element) gradients are reduced in."""

    name: str
    weights: int  # the parameters the forward reads (fp32 under autocast, 16-bit under Megatron/DeepSpeed)
    grads: int  # the gradient buffer backward accumulates into
    master: int  # an fp32 copy of the weights the optimizer updates (0 when the weights are fp32)
    optimizer: int  # Adam's exp_avg + exp_avg_sq
    grad_reduce_bytes: int  # bytes per element of the gradients a data-parallel step all-reduces/reduce-scatters
    framework: str  # who trains this way
    source: str  # where the layout is documented
    note: str = ""  # transient copies, defaults, risks
    forward_copies: int = 0  # bytes/param of 16-bit weight copies held from forward to backward (not in total)
    title: str = ""  # a short name for tables and labels

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.optimizer


_ZERO = "Rajbhandari et al. 2020 (ZeRO), §3.1: 2Ψ + 2Ψ + KΨ, K = 12"
# Megatron Core developer guide, "Distributed Optimizer" (docs.nvidia.com/megatron-core/developer-guide/latest/
# api-guide/dist_optimizer.html, read 2026-12): bytes/param, non-distributed | distributed over d ranks:
# fp16 params + fp16 grads 20 | 4 + 16/d; bf16 params + fp32 grads 18 | 6 + 12/d; fp32 params + fp32 grads 16 | 8 + 8/d.
_MCORE = ("Megatron Core developer guide, Distributed Optimizer (read 2026-12): 'bf16 parameters, fp32 gradients: "
          "18; 6 + 12/d'")
MEGATRON_CORE_TABLE = {  # (param dtype, main-grad dtype): (bytes non-distributed, (a, b) for a + b/d distributed)
    ("fp16", "fp16"): (20, (4, 16)), ("bf16", "fp32"): (18, (6, 12)), ("fp32", "fp32"): (16, (8, 8))}

LAYOUTS: dict[str, Layout] = {lay.name: lay for lay in (
    Layout("fp32", 4, 4, 0, 8, 4, "plain PyTorch fp32 training with torch.optim.AdamW",
           "PyTorch torch.optim.AdamW docs (exp_avg, exp_avg_sq in the parameter's dtype)",
           "no low-precision copy anywhere", title="fp32 AdamW"),
    Layout("autocast", 4, 4, 0, 8, 4, "torch.amp.autocast(bf16/fp16) + AdamW, plain DDP (no comm hook)",
           "PyTorch AMP docs (torch.amp): parameters and .grad keep the parameters' dtype, fp32",
           "gradients are fp32 (4 B) and DDP all-reduces them in fp32; autocast casts each weight to 16-bit per "
           "op and the copies are saved for backward: 2 B/param more from forward to backward (forward_copies), "
           "freed with the graph", forward_copies=2, title="torch.amp autocast (fp32 params and grads)"),
    Layout("autocast+bf16-hook", 4, 4, 0, 8, 2, "autocast + DDP with bf16_compress_hook",
           "PyTorch DDP communication hooks docs: default_hooks.bf16_compress_hook",
           "same states as 'autocast'; the hook casts each fp32 gradient bucket to bf16 for the all-reduce "
           "and back: half the bytes on the wire", forward_copies=2, title="autocast + DDP bf16_compress_hook"),
    Layout("megatron", 2, 4, 4, 8, 4, "Megatron-LM / Megatron Core --bf16 (the default: accumulate_allreduce_grads_"
           "in_fp32); NeMo's bf16-mixed (grad_reduce_in_fp32=True)", _MCORE,
           "bf16 parameters, fp32 main gradients (4 B) accumulated across micro-batches and reduced in fp32, fp32 "
           "main parameters and Adam: 18 B/param, 6 + 12/d with the distributed optimizer (ZeRO-1). Megatron's table "
           "has no 16 B row: fp16 params with fp16 grads cost 20 (its optimizer copies the grads to fp32)",
           title="Megatron-LM bf16 (bf16 params, fp32 main grads, fp32 master)"),
    Layout("deepspeed", 2, 2, 4, 8, 2, "DeepSpeed ZeRO with bf16 or fp16 enabled", _ZERO,
           "gradients are reduced in the model's 16-bit dtype unless communication_data_type is set "
           "(deepspeed/runtime/engine.py, communication_data_type); bf16 with data_types.grad_accum_dtype='fp32' "
           "at ZeRO stage 1 switches to DeepSpeed's BF16_Optimizer, which keeps fp32 gradients (the 18 B of 'megatron')",
           title="DeepSpeed bf16 (bf16 params and grads, fp32 master)"),
    Layout("fsdp2-mp", 4, 4, 0, 8, 4, "FSDP2 fully_shard with MixedPrecisionPolicy(param_dtype=bf16, "
           "reduce_dtype=fp32)", "PyTorch FSDP2 docs: fully_shard, MixedPrecisionPolicy",
           "sharded fp32 parameters and gradients; each layer's bf16 unsharded copy exists only while the "
           "layer runs (all-gathered in forward, again in backward) and gradients are reduce-scattered in fp32",
           title="FSDP2 MixedPrecisionPolicy (bf16 compute, fp32 shards and reduce)"),
    Layout("pure-bf16", 2, 2, 0, 4, 2, "bf16 parameters and bf16 Adam states, no master copy (e.g. "
           "model.to(torch.bfloat16) + AdamW)", "Zamirai et al. 2020, 'Revisiting BFloat16 Training', §3",
           "half the memory of the mixed layouts, but an update smaller than half a bf16 ulp of the weight "
           "(2^-9 to 2^-8 of |w|) is rounded away: small learning rates stall without stochastic rounding or Kahan "
           "summation (Zamirai et al. §3-4)", title="pure bf16 (no master, bf16 Adam)"),
)}


def as_layout(layout: str | Layout) -> Layout:
    """The `Layout` called `layout` (a Layout is returned as it is)."""
    if isinstance(layout, Layout):
        return layout
    return LAYOUTS[one_of("layout", layout, LAYOUTS)]


def bytes_per_param(layout: str | Layout) -> dict[str, int]:
    """weights + grads + master + optimizer bytes per parameter, e.g. 2 + 2 + 4 + 8 = 16 (ZeRO §3.1)."""
    lay = as_layout(layout)
    parts = {p: getattr(lay, p) for p in PARTS}
    return {**parts, "total": lay.total}


def model_state_bytes(num_params: int, layout: str | Layout, world_size: int = 1, zero_stage: int = 0) -> dict[str, int]:
    """Per-rank bytes: stage ≥ 1 shards optimizer + master, ≥ 2 grads, 3 weights, each to ⌈Ψ/N⌉ (ZeRO §5.1, Fig. 1).

    ZeRO partitions a flat buffer of Ψ elements into N equal parts (padded), so a sharded state costs
    bytes × ⌈Ψ/N⌉ on each rank; unsharded states cost bytes × Ψ. Returns bytes per part and "total".
    """
    psi = positive_int("num_params", num_params)
    n = positive_int("world_size", world_size)
    one_of("zero_stage", zero_stage, ZERO_STAGES)
    lay = as_layout(layout)
    shard = -(-psi // n)  # ⌈Ψ/N⌉
    first_sharded = {"master": 1, "optimizer": 1, "grads": 2, "weights": 3}  # ZeRO §5.1: P_os, P_os+g, P_os+g+p
    out = {p: getattr(lay, p) * (shard if zero_stage >= first_sharded[p] else psi) for p in PARTS}
    out["total"] = sum(out.values())
    return out


def gradient_bytes(num_params: int, layout: str | Layout) -> int:
    """Ψ × grad_reduce_bytes: the gradient bytes one data-parallel step reduces (each element once)."""
    return positive_int("num_params", num_params) * as_layout(layout).grad_reduce_bytes
