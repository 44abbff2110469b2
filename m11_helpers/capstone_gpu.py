"""The capstone's plan for a GPU node, before renting it: memory and step time per GPU, and which lever for what.

    p = predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="fsdp2", bf16=True, flash=True)   # bytes and seconds
    p["states"], p["activations"], p["total"], p["fits"], p["step_s"], p["tokens_per_s"]
    lever_rows(RUNNING_EXAMPLE)          # the lesson's table: one row per configuration of the script's levers
    lever_table()                        # the decision guide: bottleneck, saves, costs, source

The same levers as `scripts/train.py` on a GPU: --parallel ddp|fsdp2, --bf16 (FSDP2's MixedPrecisionPolicy,
or torch.amp autocast under DDP), --ac (full recomputation), PyTorch's fused SDPA attention (flash, the
default on GPUs). Memory comes from the course's one helper per quantity: model states from
`model_states` (layout "fp32", "autocast" or "fsdp2-mp", ZeRO-3 sharding for FSDP2), activations from
`activations.activation_bytes` (Korthikanti et al. 2022, §4, generalised to the Llama shape), their peak
in backward with recomputation (+ one rebuilt layer). "Fits" compares bytes with the chip's HBM in
bytes (80 GiB for an "80 GB" H100). Time is a model, not a measurement: the hardware FLOPs per token of
`compute_budget` (6Ψ + 12·L·H·Q·T, attention included; + one forward with recomputation) at an assumed HFU
of the datasheet peak, communication at NVLink's per-direction rate, the two overlapped; the MFU follows.
Lesson 11.
"""

from __future__ import annotations

from m11_helpers.activations import activation_bytes, activation_ratio
from m11_helpers.comm_model import bus_factor
from m11_helpers.compute_budget import hardware_flops_per_token, model_flops_per_token
from m11_helpers.config import TINY_GPT, TransformerConfig, param_count
from m11_helpers.hardware_specs import chip
from m11_helpers.model_states import gradient_bytes, model_state_bytes
from m11_helpers.validate import fraction, one_of, positive_int, positive_real

__all__ = ["step_seconds", "predict_gpu_run", "LEVER_CONFIGS", "lever_rows", "lever_table"]


def step_seconds(model: float | TransformerConfig, tokens: float, flops_per_s: float, *, hfu: float = 0.4,
                 comm_bytes: float = 0.0, bandwidth: float = 1.0, checkpointing: bool = False,
                 overlap: bool = True) -> dict:
    """Compute = hardware FLOPs per token (6N + 12·L·H·Q·T, + a forward with full recomputation) × tokens / (peak ·
    HFU) (PaLM, App. B; Korthikanti et al. 2022, §4.3); communication bytes/bandwidth; overlapped: max, else sum.

    The utilisation the chips sustain is an HFU: recomputation adds FLOPs at the same rate, so it lowers the MFU
    ("mfu" in the result: model FLOPs over the time at peak) and not the HFU. A number as `model` is N, no attention.
    """
    fraction("hfu", hfu)
    positive_real("flops_per_s", flops_per_s)
    positive_real("bandwidth", bandwidth)
    hardware = hardware_flops_per_token(model, recompute="full" if checkpointing else "none") * tokens
    compute = hardware / (flops_per_s * hfu)
    comm = comm_bytes / bandwidth
    step = max(compute, comm) if overlap else compute + comm
    return {"compute": compute, "comm": comm, "step": step,
            "mfu": model_flops_per_token(model) * tokens / (step * flops_per_s)}


def predict_gpu_run(cfg: TransformerConfig, gpus: int = 8, *, parallel: str = "fsdp2", bf16: bool = True,
                    ac: bool = False, flash: bool = False, micro_batch: int = 1, accum: int = 1,
                    gpu: str = "H100 SXM", hfu: float = 0.4) -> dict:
    """Per-GPU bytes and step seconds for `cfg` trained by the reference script on one node of `gpus` GPUs.

    Model states: model_state_bytes(Ψ, layout, gpus, 3 if FSDP2 else 0). Activations: one micro-batch,
    16-bit with bf16 (autocast under DDP: fp32 residual stream + saved bf16 weight copies), fp32 without;
    "activations" is the peak in backward (kept + one recomputed layer with --ac). Communication per GPU
    and step (ring, nccl-tests' bus factors): DDP all-reduces the gradients in their dtype once; FSDP2
    all-gathers 2Ψ per micro-batch in the compute dtype and reduce-scatters Ψ in fp32 once.
    """
    n = positive_int("gpus", gpus)
    one_of("parallel", parallel, ("ddp", "fsdp2"))
    positive_int("accum", accum)
    psi = param_count(cfg)
    layout = "fsdp2-mp" if parallel == "fsdp2" else ("autocast" if bf16 else "fp32")
    states = model_state_bytes(psi, layout, n, 3 if parallel == "fsdp2" else 0)["total"]
    a = activation_bytes(cfg, micro_batch, flash=flash, recompute="full" if ac else "none",
                         dtype_bytes=2 if bf16 else 4, autocast=bf16 and parallel == "ddp")
    acts = a["total"] + a["transient"]
    spec = chip(gpu)
    if parallel == "fsdp2":
        comm_bytes = (bus_factor("all_gather", n) * accum * 2 * psi * (2 if bf16 else 4)
                      + bus_factor("reduce_scatter", n) * psi * 4)
    else:
        comm_bytes = bus_factor("all_reduce", n) * gradient_bytes(psi, layout)
    tokens = micro_batch * accum * cfg.seq_len  # per GPU and step
    t = step_seconds(cfg, tokens, spec.peak_flops("bf16" if bf16 else "tf32"), hfu=hfu, comm_bytes=comm_bytes,
                     bandwidth=spec.interconnect_gbs / 2 * 1e9, checkpointing=ac)
    return {"states": states, "activations": acts, "kept": a["total"], "total": states + acts,
            "fits": states + acts <= spec.memory_bytes, "memory": spec.memory_bytes, "comm_bytes": comm_bytes,
            "compute_s": t["compute"], "comm_s": t["comm"], "step_s": t["step"], "tokens_per_s": n * tokens / t["step"],
            "mfu": t["mfu"]}


# The configurations of the lesson's plan table: each adds or swaps one lever.
LEVER_CONFIGS = {
    "DDP, fp32": dict(parallel="ddp", bf16=False), "DDP + bf16 autocast": dict(parallel="ddp"),
    "FSDP2, fp32": dict(parallel="fsdp2", bf16=False), "FSDP2 + bf16": dict(parallel="fsdp2"),
    "FSDP2 + bf16 + flash": dict(parallel="fsdp2", flash=True),
    "FSDP2 + bf16 + recompute": dict(parallel="fsdp2", ac=True),
}


def lever_rows(cfg: TransformerConfig, gpus: int = 8, micro_batch: int = 1, gpu: str = "H100 SXM") -> list[dict]:
    """predict_gpu_run for each of LEVER_CONFIGS, one row each (the figures of the lesson's plan table)."""
    return [{"config": name, **predict_gpu_run(cfg, gpus, micro_batch=micro_batch, gpu=gpu, **kw)}
            for name, kw in LEVER_CONFIGS.items()]


def lever_table() -> list[dict]:
    """The decision guide: which lever for which bottleneck, what it saves and what it costs, with its source."""
    r4, r16 = (activation_ratio(TINY_GPT, b, flash=True) for b in (4, 16))
    h100 = chip("H100 SXM").peak_tflops
    return [
        {"lever": "data parallel (DDP)", "bottleneck": "time", "saves": "step time ÷ N (N× the samples per second)",
         "costs": "an all-reduce of the gradients per step; full model states on every rank",
         "source": "Li et al. 2020 (PyTorch DDP)"},
        {"lever": "ZeRO-3 / FSDP2", "bottleneck": "memory", "saves": "model states 16Ψ → 16Ψ/N",
         "costs": "3Ψ moved per step instead of DDP's 2Ψ", "source": "Rajbhandari et al. 2020 (ZeRO), §5, §7"},
        {"lever": "bf16 compute", "bottleneck": "time, memory",
         "saves": f"2× tf32's tensor-core rate ({h100['bf16']:g} TFLOP/s on an H100); activations ≈ ½ with bf16 "
                  f"parameters, {r16:.2f}× (batch 16) to {r4:.2f}× (batch 4) under autocast",
         "costs": "fp32 master weights kept; autocast saves bf16 weight copies; loss scaling only for fp16",
         "source": "Micikevicius et al. 2018; PyTorch AMP and FSDP2 docs"},
        {"lever": "gradient accumulation", "bottleneck": "memory", "saves": "activations ÷ K at the same global batch",
         "costs": "K sequential micro-batches; FSDP2 gathers the weights K times",
         "source": "Goyal et al. 2017; lesson 07"},
        {"lever": "activation recomputation", "bottleneck": "memory",
         "saves": "activations → each layer's input (+ one layer rebuilt in backward)",
         "costs": "one more forward: 8Ψ + 16·L·h·s instead of 6Ψ + 12·L·h·s FLOPs per token (+33 %)",
         "source": "Chen et al. 2016; Korthikanti et al. 2022, §4.3"},
        {"lever": "flash attention", "bottleneck": "memory, time", "saves": "the a·s² attention scores per layer",
         "costs": "none at training time (recomputes the scores in backward, in SRAM)",
         "source": "Dao et al. 2022, §3.1"},
        {"lever": "global-norm clipping", "bottleneck": "stability", "saves": "a loss spike from one bad batch",
         "costs": "one global norm per step (a scalar all-reduce when sharded)", "source": "Pascanu et al. 2013, §3.2"},
        {"lever": "LR warmup", "bottleneck": "stability", "saves": "early divergence at large batch or LR",
         "costs": "a few slower steps at the start", "source": "Goyal et al. 2017, §2.2"},
        {"lever": "tensor parallel", "bottleneck": "memory, time", "saves": "each layer's weights and FLOPs ÷ TP",
         "costs": "4 activation all-reduces per layer: inside a node (NVLink)",
         "source": "Shoeybi et al. 2019; Narayanan et al. 2021"},
        {"lever": "pipeline parallel", "bottleneck": "memory", "saves": "layers ÷ PP per GPU",
         "costs": "the bubble (p−1)/m; point-to-point activations", "source": "Huang et al. 2019; Narayanan et al. 2021"},
        {"lever": "preemption-safe checkpoints", "bottleneck": "cost", "saves": "spot prices without lost work",
         "costs": "a checkpoint per interval and per notice", "source": "Young 1974; lesson 10"},
    ]
