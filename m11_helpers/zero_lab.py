"""The DP/ZeRO memory lab: the computation (tested), the figure, and the widget that only wires them (lesson 05).

    from m11_helpers.zero_lab import memory_lab
    memory_lab()            # sliders: parameters, GPUs, stage, offload, activations, GPU memory

Memory that must fit on a device is shown in GiB (2³⁰ bytes): an "80 GB" H100 or A100 carries
80 GiB of HBM (85,899,345,920 B), and allocators, `nvidia-smi` and `torch.cuda` count in GiB too.
GPU capacities come from `m11_helpers.hardware_specs` (the default: an H100 SXM); every other number
from `m11_helpers.zero.memory_breakdown` / `min_gpus`.
"""

from __future__ import annotations

from m11_helpers.activations import activation_bytes
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.hardware_specs import CHIPS, chip
from m11_helpers.quantities import GiB
from m11_helpers.validate import one_of, positive_int
from m11_helpers.zero import OFFLOADS, STAGES, memory_breakdown, min_gpus

__all__ = ["lab_rows", "lab_figure", "lab_summary", "memory_lab", "GPU_MEMORY_GIB", "DEFAULT_GPU"]

DEFAULT_GPU = chip("H100 SXM")  # the course's GPU: 80 GiB of HBM
# the slider's capacities: consumer cards (up to the RTX 5090's 32 GB of GDDR7, 2025: NVIDIA's launch specs as
# printed in reviews, e.g. Linux Format, May 2025) and 40 GB parts, then every GPU in hardware_specs (datasheet
# labels are GiB: "80 GB" = 80 GiB)
GPU_MEMORY_GIB = tuple(sorted({16, 24, 32, 40} | {round(c.memory_gib) for c in CHIPS.values() if c.kind == "GPU"}))
PARTS = [("parameters", "#4C72B0"), ("gradients", "#DD8452"), ("optimizer", "#55A868"), ("activations", "#C44E52")]
LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer": "optimizer state",
          "activations": "activations"}


def lab_rows(num_params: float, world_size: int, stage: int, *, offload: str = "none",
             activations: float = 0.0, gpu_bytes: float = DEFAULT_GPU.memory_bytes) -> list[dict]:
    """One row per stage 0..3 at this N: the bar's parts in GiB, its total, whether it fits, the fewest GPUs.

    Offload applies where it is valid (parameter offload only at stage 3); `selected` marks `stage`.
    """
    positive_int("world_size", world_size)
    one_of("stage", stage, STAGES)
    one_of("offload", offload, OFFLOADS)
    rows = []
    for s in STAGES:
        off = "optimizer" if (offload == "optimizer+params" and s != 3) else offload
        m = memory_breakdown(num_params, world_size, s, offload=off, activations=activations)
        rows.append({"stage": s, "label": STAGES[s], "selected": s == stage, "offload": off,
                     "parameters": m.parameters / GiB, "gradients": m.gradients / GiB,
                     "optimizer": m.optimizer / GiB, "activations": m.activations / GiB, "total": m.total / GiB,
                     "cpu": m.cpu / GiB, "fits": m.total <= gpu_bytes,
                     "min_gpus": min_gpus(num_params, gpu_bytes, s, activations=activations, offload=off)})
    return rows


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
    cap = gpu_bytes / GiB
    ax.axhline(cap, color="black", ls="--", lw=1.5, label=f"GPU memory {cap:.0f} GiB")
    for i, r in enumerate(rows):
        ax.text(i, r["total"], f"{r['total']:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(x), [r["label"] + ("\n(selected)" if r["selected"] else "") for r in rows])
    ax.set_ylabel("GiB per GPU (2³⁰ bytes)")
    ax.set_ylim(0, 1.25 * max(max(r["total"] for r in rows), cap))  # room for labels and legend
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def lab_summary(rows: list[dict], world_size: int) -> str:
    """The lab's numbers as HTML text (readable by a person or a browser test)."""
    sel = next(r for r in rows if r["selected"])
    fits = "fits" if sel["fits"] else "does NOT fit"
    need = sel["min_gpus"]
    lines = [f"<b>{sel['label']}</b> on {world_size} GPUs: <b>{sel['total']:.2f} GiB per GPU</b> — {fits}."
             f" Fewest GPUs that fit: <b>{need if need is not None else 'none'}</b>."]
    if sel["cpu"]:
        lines.append(f"Offloaded to host memory: {sel['cpu']:.2f} GiB per rank.")
    return "<br>".join(lines)


def memory_lab(num_params_billions: float | None = None, world_size: int = 8, stage: int = 3,
               gpu_gib: int = round(DEFAULT_GPU.memory_gib), activations_gib: float | None = None):
    """The DP/ZeRO memory lab: sliders → `lab_rows` → stacked bars per GPU vs the capacity line.

    Returns an `ipywidgets.VBox` (display it, or read `.children`: the seven controls, the summary
    (`HTML`) and the figure (`Image`, PNG)). Defaults: the 7B running example on 8 H100s (80 GiB
    each), with its activations for one 4096-token sequence under selective recomputation
    (`activations.activation_bytes`, Korthikanti et al. 2022 §4.2).
    """
    import ipywidgets as w

    if num_params_billions is None:
        num_params_billions = param_count(RUNNING_EXAMPLE) / 1e9
    if activations_gib is None:
        activations_gib = round(activation_bytes(RUNNING_EXAMPLE, 1, recompute="selective")["total"] / GiB, 1)
    style = {"description_width": "140px"}
    controls = {
        "params_b": w.FloatLogSlider(value=num_params_billions, base=10, min=-1, max=3, step=0.01,
                                     description="parameters (B)", style=style),
        "gpus": w.IntSlider(value=world_size, min=1, max=1024, description="GPUs (N)", style=style),
        "stage": w.Dropdown(options=[(v, k) for k, v in STAGES.items()], value=stage, description="stage", style=style),
        "offload": w.Dropdown(options=list(OFFLOADS), value="none", description="offload", style=style),
        "activations": w.Checkbox(value=True, description="include activations"),
        "act_gib": w.FloatSlider(value=activations_gib, min=0, max=200, step=0.5, description="activations (GiB)",
                                 style=style),
        "gpu_gib": w.Dropdown(options=list(GPU_MEMORY_GIB), value=gpu_gib, description="GPU memory (GiB)",
                              style=style),
    }
    # The summary and the plot are widgets whose values change, not output captured into an Output widget:
    # nothing depends on which cell's messages the front end routes where (a fresh JupyterLab once drew the
    # summary and never the plot), and a redraw replaces two values instead of clearing and re-rendering.
    summary, figure = w.HTML(), w.Image(format="png")

    def redraw(_change=None) -> None:
        v = {name: c.value for name, c in controls.items()}
        note = ("<i>parameter offload needs ZeRO-3: showing optimizer offload for stages 0-2</i><br>"
                if v["offload"] == "optimizer+params" and v["stage"] != 3 else "")
        rows = lab_rows(v["params_b"] * 1e9, v["gpus"], v["stage"], offload=v["offload"],
                        activations=v["act_gib"] * GiB if v["activations"] else 0.0, gpu_bytes=v["gpu_gib"] * GiB)
        summary.value = note + lab_summary(rows, v["gpus"])
        title = f"{v['params_b']:.2f}B parameters on {v['gpus']} × {v['gpu_gib']} GiB"
        figure.value = _png(lab_figure(rows, v["gpu_gib"] * GiB, title))

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([*controls.values(), summary, figure]).add_class("m11-lab")


def _png(fig) -> bytes:
    """A matplotlib figure as PNG bytes, closed afterwards (so the notebook's backend never shows it twice)."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")  # as the inline backend saves it
    plt.close(fig)
    return buf.getvalue()
