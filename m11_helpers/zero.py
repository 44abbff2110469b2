"""Where the memory goes in data-parallel training, and what ZeRO's stages take away.

Mixed-precision Adam keeps, per parameter, 2 bytes of fp16/bf16 weights, 2 bytes of gradients and
K = 12 bytes of optimizer state (fp32 master weights, Adam's two fp32 moments): 16 Ψ bytes on
every data-parallel rank (Rajbhandari et al. 2020, "ZeRO", §3.1). ZeRO-1 shards the optimizer
state over N ranks, ZeRO-2 the gradients too, ZeRO-3 (= FSDP) the parameters too (§5.1, Fig. 1).

    memory_per_gpu(7.5e9, 64, stage=1) / 1e9   # 31.4 (GB, 10**9 bytes), the paper's Figure 1
    min_gpus(RUNNING_EXAMPLE params, 80e9, stage=3)

Units: every function returns **bytes**. `gb` divides by 10**9 (the ZeRO paper's GB); `gib` by
2**30 (what DeepSpeed's estimator and `accelerate estimate-memory` print, labelled "GB").
The from-scratch sharded optimizer is in `m11_helpers.zero_optimizer`; FSDP2 in `m11_helpers.fsdp`.
"""

from __future__ import annotations

import dataclasses
import math

from m11_helpers.config import TransformerConfig
from m11_helpers.validate import non_negative_real, one_of, positive_int, positive_real

__all__ = ["STAGES", "OFFLOADS", "MemoryBreakdown", "memory_breakdown", "memory_per_gpu", "reduction_factor",
           "min_gpus", "comm_volume", "activation_bytes", "optimizer_state_bytes", "deepspeed_estimate",
           "accelerate_estimate", "gb", "gib", "lab_rows", "lab_figure", "memory_lab"]

STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
OFFLOADS = ("none", "optimizer", "optimizer+params")  # ZeRO-Offload (Ren et al. 2021); ZeRO-Infinity (2021)


def gb(n_bytes: float) -> float:
    """n / 10⁹: the ZeRO paper's GB (and the GPU vendors' '80 GB')."""
    return n_bytes / 1e9


def gib(n_bytes: float) -> float:
    """n / 2³⁰: what DeepSpeed and `accelerate estimate-memory` print, labelled 'GB'."""
    return n_bytes / 2**30


def _check(num_params: float, world_size: int, stage: int) -> None:
    positive_real("num_params", num_params)
    positive_int("world_size", world_size)
    one_of("stage", stage, STAGES)


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU, by kind; `cpu` is what offload moved to the host (per rank)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float = 0.0
    cpu: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations


def memory_breakdown(num_params: float, world_size: int, stage: int, *, activations: float = 0.0,
                     offload: str = "none", param_bytes: int = 2, grad_bytes: int = 2,
                     optimizer_bytes: int = 12) -> MemoryBreakdown:
    """Per-GPU bytes: (2 + 2 + K)Ψ with the parts stage ≥ 1, 2, 3 shard divided by N (ZeRO §5.1, Fig. 1).

    offload="optimizer" moves the optimizer state and its gradient copy to the CPU (ZeRO-Offload,
    Ren et al. 2021, §4: the GPU keeps fp16 parameters and gradients while it computes);
    "optimizer+params" also moves the parameters (ZeRO-Infinity, Rajbhandari et al. 2021; stage 3).
    Activations are per rank and never sharded by data parallelism: pass them in bytes.
    """
    _check(num_params, world_size, stage)
    one_of("offload", offload, OFFLOADS)
    if offload == "optimizer+params" and stage != 3:
        raise ValueError(f"offload='optimizer+params' needs stage=3 (parameters are only sharded there), "
                         f"got stage={stage}")
    non_negative_real("activations", activations)
    n = world_size
    psi = float(num_params)
    params = param_bytes * psi / (n if stage >= 3 else 1)
    grads = grad_bytes * psi / (n if stage >= 2 else 1)
    optim = optimizer_bytes * psi / (n if stage >= 1 else 1)
    cpu = 0.0
    if offload != "none":
        cpu = optim + grads  # fp32 master + moments on the host; fp16 gradients are copied there to update
        optim = 0.0
    if offload == "optimizer+params":
        cpu += params
        params = 0.0  # streamed in layer by layer; the working buffer is small next to the rest
    return MemoryBreakdown(params, grads, optim, float(activations), cpu)


def memory_per_gpu(num_params: float, world_size: int, stage: int, **kw) -> float:
    """Bytes per GPU: DDP (2+2+K)Ψ; ZeRO-1 4Ψ + KΨ/N; ZeRO-2 2Ψ + (2+K)Ψ/N; ZeRO-3 (2+2+K)Ψ/N (ZeRO §5.1)."""
    return memory_breakdown(num_params, world_size, stage, **kw).total


def reduction_factor(world_size: int, stage: int, optimizer_bytes: int = 12) -> float:
    """DDP bytes / stage bytes for model states: 16/(4 + 12/N), 16/(2 + 14/N), N (ZeRO §5.1, Table 1)."""
    return memory_per_gpu(1.0, world_size, 0, optimizer_bytes=optimizer_bytes) / memory_per_gpu(
        1.0, world_size, stage, optimizer_bytes=optimizer_bytes)


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
    _check(num_params, world_size or 1, stage)
    volume = (3 if stage == 3 else 2) * float(num_params)
    return volume if world_size is None else volume * (world_size - 1) / world_size


def optimizer_state_bytes(num_params: int, world_size: int, master_weights: bool = False) -> int:
    """Bytes of AdamW state one ZeRO-1 rank holds: (8 or 12) · ⌈Ψ/N⌉ (ZeRO §5.1, K = 12 with fp32 master)."""
    _check(num_params, world_size, 1)
    return (12 if master_weights else 8) * math.ceil(num_params / world_size)


def activation_bytes(cfg: TransformerConfig, micro_batch: int = 1, recompute: str = "none") -> float:
    """L·sbh(34 + 5as/h) bytes; selective recompute L·34sbh; full L·2sbh (Korthikanti et al. 2022, §4, Tab. 2).

    Derived for a GPT block (4h GELU MLP, 16-bit activations, dropout masks): an estimate for other
    blocks. Data parallelism does not shard it: every rank holds its own micro-batch's activations.
    """
    one_of("recompute", recompute, ("none", "selective", "full"))
    positive_int("micro_batch", micro_batch)
    s, b, h, a = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads
    per_layer = {"none": s * b * h * (34 + 5 * a * s / h), "selective": 34 * s * b * h, "full": 2 * s * b * h}
    return cfg.layers * per_layer[recompute]


def deepspeed_estimate(num_params: int, stage: int, num_gpus: int, largest_layer_params: int = 0,
                       offload: bool = False) -> int:
    """DeepSpeed's model-state estimator (bytes per GPU): stage 2: 4Ψ + 16Ψ/N; stage 3: 4·Ψ_layer + 18Ψ/N.

    Transcribed from `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs`
    (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py); DeepSpeed prints these divided by 2**30 as "GB".
    """
    _check(num_params, num_gpus, stage)
    if stage == 2:
        return 2 * num_params if offload else 4 * num_params + int(16 * num_params / num_gpus)
    if stage == 3:
        layer = 4 * largest_layer_params
        return layer if offload else layer + int(18 * num_params / num_gpus)
    raise ValueError(f"stage must be 2 or 3 (DeepSpeed estimates only those), got {stage!r}")


def accelerate_estimate(num_params: int, dtype: str = "float32") -> int:
    """`accelerate estimate-memory`'s "Training using Adam": max(model, grads, optimizer, step), not a sum.

    From accelerate/commands/estimate.py (`estimate_training_usage`, then `max(item.values())`):
    float32 → max(4Ψ, 4Ψ, 8Ψ, 16Ψ) = 16Ψ; float16/bfloat16 → max(4Ψ, 6Ψ, 8Ψ, 8Ψ) = 8Ψ.
    The CLI prints it in 2**30 units.
    """
    one_of("dtype", dtype, ("float32", "float16", "bfloat16"))
    from accelerate.commands.estimate import estimate_training_usage

    return int(max(estimate_training_usage(4 * num_params, dtype).values()))


# ------------------------------------------------------------------------------------------------
# The memory lab: the computation (tested), the figure, and the widget that only wires them
# ------------------------------------------------------------------------------------------------


def lab_rows(num_params: float, world_size: int, stage: int, *, offload: str = "none",
             activations: float = 0.0, gpu_bytes: float = 80e9) -> list[dict]:
    """One row per stage 0..3 at this N: the bar's parts in GB (10⁹), its total, whether it fits.

    Offload applies where it is valid (parameter offload only at stage 3); `selected` marks `stage`.
    """
    _check(num_params, world_size, stage)
    rows = []
    for s in STAGES:
        off = "optimizer" if (offload == "optimizer+params" and s != 3) else offload
        m = memory_breakdown(num_params, world_size, s, offload=off, activations=activations)
        rows.append({"stage": s, "label": STAGES[s], "selected": s == stage, "offload": off,
                     "parameters": gb(m.parameters), "gradients": gb(m.gradients), "optimizer": gb(m.optimizer),
                     "activations": gb(m.activations), "total": gb(m.total), "cpu": gb(m.cpu),
                     "fits": m.total <= gpu_bytes,
                     "min_gpus": min_gpus(num_params, gpu_bytes, s, activations=activations, offload=off)})
    return rows


PARTS = [("parameters", "#4C72B0"), ("gradients", "#DD8452"), ("optimizer", "#55A868"), ("activations", "#C44E52")]
LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer": "optimizer state",
          "activations": "activations"}


def lab_figure(rows: list[dict], gpu_bytes: float, title: str = ""):
    """Stacked bars (parameters, gradients, optimizer state, activations) per GPU against capacity."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for part, color in PARTS:
        vals = [r[part] for r in rows]
        ax.bar(x, vals, bottom=bottom, color=color, label=LABELS[part], width=0.6, edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):  # the selected stage: one outline around its whole bar
        if r["selected"]:
            ax.bar(i, r["total"], width=0.6, fill=False, edgecolor="black", linewidth=2.5)
    ax.axhline(gb(gpu_bytes), color="black", ls="--", lw=1.5, label=f"GPU capacity {gb(gpu_bytes):.0f} GB")
    for i, r in enumerate(rows):
        ax.text(i, r["total"], f"{r['total']:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(x), [r["label"] + ("\n(selected)" if r["selected"] else "") for r in rows])
    ax.set_ylabel("GB per GPU (10⁹ bytes)")
    ax.set_ylim(0, 1.25 * max(max(r["total"] for r in rows), gb(gpu_bytes)))  # room for labels and legend
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def lab_summary(rows: list[dict], world_size: int) -> str:
    """The lab's numbers as HTML text (readable by a person or a browser test)."""
    sel = next(r for r in rows if r["selected"])
    fits = "fits" if sel["fits"] else "does NOT fit"
    need = sel["min_gpus"]
    lines = [f"<b>{sel['label']}</b> on {world_size} GPUs: <b>{sel['total']:.2f} GB per GPU</b> — {fits}."
             f" Fewest GPUs that fit: <b>{need if need is not None else 'none'}</b>."]
    if sel["cpu"]:
        lines.append(f"Offloaded to host memory: {sel['cpu']:.2f} GB per rank.")
    return "<br>".join(lines)


def memory_lab(num_params_billions: float = 6.738415616, world_size: int = 8, stage: int = 3,
               gpu_gb: float = 80.0, activations_gb: float = 18.3):
    """The DP/ZeRO memory lab: sliders → `lab_rows` → stacked bars per GPU vs the capacity line.

    Returns the `ipywidgets.interactive` (display it, or read `.children`: the seven controls, then
    the output with an HTML summary line and the figure). Defaults: the 7B running example on
    8 × 80 GB with 18.3 GB of activations (one 4096-token sequence, selective recomputation).
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    style = {"description_width": "140px"}
    controls = {
        "params_b": w.FloatLogSlider(value=num_params_billions, base=10, min=-1, max=3, step=0.01,
                                     description="parameters (B)", style=style),
        "gpus": w.IntSlider(value=world_size, min=1, max=1024, description="GPUs (N)", style=style),
        "stage": w.Dropdown(options=[(v, k) for k, v in STAGES.items()], value=stage, description="stage", style=style),
        "offload": w.Dropdown(options=list(OFFLOADS), value="none", description="offload", style=style),
        "activations": w.Checkbox(value=True, description="include activations"),
        "act_gb": w.FloatSlider(value=activations_gb, min=0, max=200, step=0.5, description="activations (GB)",
                                style=style),
        "gpu_gb": w.Dropdown(options=[16.0, 24.0, 40.0, 80.0, 141.0], value=gpu_gb, description="GPU memory (GB)",
                             style=style),
    }

    def draw(params_b, gpus, stage, offload, activations, act_gb, gpu_gb):
        if offload == "optimizer+params" and stage != 3:
            display(HTML("<i>parameter offload needs ZeRO-3: showing optimizer offload for stages 0-2</i>"))
        rows = lab_rows(params_b * 1e9, gpus, stage, offload=offload,
                        activations=act_gb * 1e9 if activations else 0.0, gpu_bytes=gpu_gb * 1e9)
        display(HTML(lab_summary(rows, gpus)))
        fig = lab_figure(rows, gpu_gb * 1e9, f"{params_b:.2f}B parameters on {gpus} × {gpu_gb:.0f} GB")
        plt.show()
        plt.close(fig)

    return w.interactive(draw, **controls)
