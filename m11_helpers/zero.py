"""What ZeRO's stages take away from each data-parallel rank: memory per GPU, fewest GPUs, bytes sent (lesson 05).

The bytes per parameter come from `m11_helpers.model_states` (one owner for every lesson): the ZeRO
paper's layout is "deepspeed", bf16 weights + bf16 grads + fp32 master + Adam, 16 B (Rajbhandari et
al. 2020, "ZeRO", §3.1; Megatron-LM's default, "megatron", keeps fp32 grads: 18 B). ZeRO-1 shards the
optimizer state (master + moments) over N ranks, ZeRO-2 the gradients too, ZeRO-3 (= FSDP) the
weights too (§5.1, Fig. 1). This module adds what the lesson does with those bytes: offload, the
fewest GPUs that fit, the bytes each rank sends.

    memory_per_gpu(7_500_000_000, 64, stage=1) / GB       # 31.4, the paper's Figure 1
    min_gpus(param_count(RUNNING_EXAMPLE), chip("H100 SXM").memory_bytes, stage=3)

Units: every function returns **bytes**; show them with `quantities.format_gb` (GB = 10⁹, GiB = 2³⁰).
An "80 GB" GPU holds 80 GiB of HBM: compare with bytes, never with a label.
The from-scratch sharded optimizer is in `m11_helpers.zero_optimizer`, FSDP2 in `m11_helpers.fsdp`,
the memory lab (sliders) in `m11_helpers.zero_lab`.
"""

from __future__ import annotations

import dataclasses

from m11_helpers.comm_model import ring_bytes_sent
from m11_helpers.model_states import ZERO_STAGES, as_layout, model_state_bytes
from m11_helpers.validate import non_negative_real, one_of, positive_int, positive_real

__all__ = ["STAGES", "OFFLOADS", "MemoryBreakdown", "memory_breakdown", "memory_per_gpu", "reduction_factor",
           "min_gpus", "comm_volume", "bytes_sent_per_step", "deepspeed_estimate", "accelerate_estimate"]

STAGES = ZERO_STAGES  # {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
# "optimizer": ZeRO-Offload (Ren et al. 2021): optimizer state and its update on the CPU.
# "optimizer+params": ZeRO-3 also keeps the fp16 parameters in host memory (DeepSpeed's offload_param,
# introduced with ZeRO-Infinity, Rajbhandari et al. 2021, whose defining step is offloading to NVMe:
# modelled here as host memory, the `cpu` bytes).
OFFLOADS = ("none", "optimizer", "optimizer+params")


def _psi(num_params: float) -> int:
    """Ψ as an int (papers write 7.5e9): positive, rounded to whole parameters."""
    return positive_int("num_params", round(positive_real("num_params", num_params)))


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU, by kind; `cpu` is what offload moved to the host (per rank)."""

    parameters: float
    gradients: float
    optimizer: float  # fp32 master copy (if the layout has one) + Adam's two moments
    activations: float = 0.0
    cpu: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations


def memory_breakdown(num_params: float, world_size: int, stage: int, *, activations: float = 0.0,
                     offload: str = "none", layout: str = "deepspeed") -> MemoryBreakdown:
    """Per-GPU bytes: model_state_bytes(Ψ, layout, N, stage) by part, + activations, − what offload moves (ZeRO §5.1).

    offload="optimizer" moves the optimizer state and its gradient copy to the CPU (ZeRO-Offload,
    Ren et al. 2021, §4: the GPU keeps the 16-bit parameters and gradients while it computes);
    "optimizer+params" also moves the parameters (stage 3 only; see OFFLOADS). Activations are per
    rank and never sharded by data parallelism: pass them in bytes.
    """
    positive_int("world_size", world_size)
    one_of("stage", stage, STAGES)
    one_of("offload", offload, OFFLOADS)
    if offload == "optimizer+params" and stage != 3:
        raise ValueError(f"offload='optimizer+params' needs stage=3 (parameters are only sharded there), "
                         f"got stage={stage}")
    non_negative_real("activations", activations)
    part = model_state_bytes(_psi(num_params), as_layout(layout), world_size, stage)
    params, grads, optim = part["weights"], part["grads"], part["master"] + part["optimizer"]
    cpu = 0
    if offload != "none":
        cpu = optim + grads  # fp32 master + moments on the host; 16-bit gradients are copied there to update
        optim = 0
    if offload == "optimizer+params":
        cpu += params
        params = 0  # streamed in layer by layer; the working buffer is small next to the rest
    return MemoryBreakdown(params, grads, optim, float(activations), cpu)


def memory_per_gpu(num_params: float, world_size: int, stage: int, **kw) -> float:
    """Bytes per GPU: DDP 16Ψ; ZeRO-1 4Ψ + 12Ψ/N; ZeRO-2 2Ψ + 14Ψ/N; ZeRO-3 16Ψ/N (ZeRO §5.1, "deepspeed" layout)."""
    return memory_breakdown(num_params, world_size, stage, **kw).total


def reduction_factor(world_size: int, stage: int, layout: str = "deepspeed") -> float:
    """DDP bytes / stage bytes for model states: 16/(4 + 12/N), 16/(2 + 14/N), N (ZeRO §5.1, Table 1)."""
    n = positive_int("world_size", world_size)
    one_of("stage", stage, STAGES)
    # Ψ = N makes every shard exactly one element: the ratio of the formulas, with no rounding
    return model_state_bytes(n, layout, 1, 0)["total"] / model_state_bytes(n, layout, n, stage)["total"]


def min_gpus(num_params: float, gpu_bytes: float, stage: int, *, activations: float = 0.0,
             offload: str = "none", max_gpus: int = 1 << 20, **kw) -> int | None:
    """Smallest N with memory_per_gpu(Ψ, N, stage) <= gpu_bytes; None when no N fits (ZeRO §5.1)."""
    positive_real("gpu_bytes", gpu_bytes)

    def fits(n: int) -> bool:
        return memory_per_gpu(num_params, n, stage, activations=activations, offload=offload, **kw) <= gpu_bytes

    if not fits(max_gpus):  # memory only falls with N, so the largest N decides whether any fits
        return None
    lo, hi = 1, max_gpus  # binary search for the first N that fits
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def comm_volume(num_params: float, stage: int, world_size: int | None = None) -> float:
    """Elements moved per rank per step: 2Ψ for DDP/ZeRO-1/2, 3Ψ for ZeRO-3 (ZeRO §7.2-7.3).

    Ψ counts each collective's full tensor (the paper's convention). With `world_size`, the ring
    algorithm's actual send volume per rank: × (N-1)/N (Patarasuk & Yuan 2009).
    """
    one_of("stage", stage, STAGES)
    psi = _psi(num_params)
    volume = (3 if stage == 3 else 2) * psi
    return volume if world_size is None else volume * (positive_int("world_size", world_size) - 1) / world_size


def bytes_sent_per_step(num_params: int, stage: int, world_size: int, layout: str = "deepspeed",
                        gather_bytes: int | None = None) -> float:
    """Bytes one rank sends per step on rings: DDP all-reduces the gradients; ZeRO-1/2 reduce-scatter them and
    all-gather the weights; ZeRO-3 all-gathers the weights twice (forward, backward) (ZeRO §7.2-7.3).

    Each reduce-scatter or all-gather of S bytes sends (N-1)/N·S per rank, half of
    `comm_model.ring_bytes_sent(S, N)` (an all-reduce = reduce-scatter + all-gather). Gradients move
    in the layout's reduce dtype (`grad_reduce_bytes`), weights in `gather_bytes` per element (default:
    the layout's weight bytes; FSDP2 with MixedPrecisionPolicy(param_dtype=bf16) gathers in 2).
    """
    psi, lay = _psi(num_params), as_layout(layout)
    n = positive_int("world_size", world_size)
    one_of("stage", stage, STAGES)
    grads = psi * lay.grad_reduce_bytes
    if stage == 0:
        return ring_bytes_sent(grads, n)
    weights = psi * (lay.weights if gather_bytes is None else positive_int("gather_bytes", gather_bytes))
    gathers = 2 if stage == 3 else 1
    return ring_bytes_sent(grads, n) / 2 + gathers * ring_bytes_sent(weights, n) / 2


def deepspeed_estimate(num_params: int, stage: int, num_gpus: int, largest_layer_params: int = 0,
                       offload: bool = False) -> int:
    """DeepSpeed's model-state estimator (bytes per GPU): stage 2: 4Ψ + 16Ψ/N; stage 3: 4·Ψ_layer + 18Ψ/N.

    Transcribed from `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs`
    (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py); DeepSpeed prints these divided by 2**30 as "GB".
    """
    psi = _psi(num_params)
    positive_int("num_gpus", num_gpus)
    one_of("stage", stage, STAGES)
    if stage == 2:
        return 2 * psi if offload else 4 * psi + int(16 * psi / num_gpus)
    if stage == 3:
        layer = 4 * largest_layer_params
        return layer if offload else layer + int(18 * psi / num_gpus)
    raise ValueError(f"stage must be 2 or 3 (DeepSpeed estimates only those), got {stage!r}")


def accelerate_estimate(num_params: int, dtype: str = "float32") -> int:
    """`accelerate estimate-memory`'s "Training using Adam": max(model, grads, optimizer, step), not a sum.

    From accelerate/commands/estimate.py (`estimate_training_usage`, then `max(item.values())`):
    float32 → max(4Ψ, 4Ψ, 8Ψ, 16Ψ) = 16Ψ; float16/bfloat16 → max(4Ψ, 6Ψ, 8Ψ, 8Ψ) = 8Ψ.
    The CLI prints it in 2**30 units.
    """
    one_of("dtype", dtype, ("float32", "float16", "bfloat16"))
    from accelerate.commands.estimate import estimate_training_usage

    return int(max(estimate_training_usage(4 * _psi(num_params), dtype).values()))

