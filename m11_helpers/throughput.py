"""Tokens per second and MFU for a training step, against a peak that says where it came from.

    peak, source = device_peak(torch.device("cuda:0"), "bf16")   # 989.4e12, 'H100 SXM datasheet (dense bf16) ...'
    peak, source = device_peak(torch.device("cpu"), "fp32")      # measured: no datasheet peak for a CPU
    step_throughput(tokens=16 * 32, seconds=0.05, model=TINY_GPT, world_size=4, peak_flops=peak, recompute="full")

MFU = (6N + 12·L·H·Q·T)·(tokens/s) / (chips · peak), attention included, recomputation not counted; HFU counts
what recomputation re-runs: `compute_budget.model_flops_utilization` / `hardware_flops_utilization` (Lesson 01;
Chowdhery et al. 2022, PaLM, App. B), imported here, not re-derived. The peak is a GPU's dense datasheet figure from
lesson 01's table (`hardware_specs.CHIPS`) for the dtype the matmuls run in. A CPU has no datasheet
figure in that table, so the peak is *measured*: the median FLOP/s of an n×n matmul on this process's
threads (`hardware.measure_matmul`), and the label says so — an MFU against a measured matmul rate is
"fraction of what this core's GEMM reaches", not a datasheet MFU. Lesson 10 (the reference script).
"""

from __future__ import annotations

import torch

from m11_helpers.compute_budget import hardware_flops_utilization, model_flops_utilization
from m11_helpers.config import TransformerConfig
from m11_helpers.hardware import measure_matmul
from m11_helpers.hardware_specs import CHIPS
from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["chip_for", "device_peak", "step_throughput", "GPU_NAMES"]

# torch.cuda.get_device_name() fragments → the row of lesson 01's table with the same dense peaks,
# first match wins. The PCIe and NVL cards of H100 and H200 run other clocks and power limits than the
# SXM parts, and the Grace superchips (GH200, GB200) have datasheets of their own ("GH200" also
# contains "H200"): no row, so no datasheet peak (say so, do not guess). The one lookup for the
# course: `m11 gpu-check` uses it too.
GPU_NAMES = [("H100 PCIE", None), ("H100 NVL", None), ("H200 NVL", None), ("GH200", None), ("GB200", None),
             ("H100", "H100 SXM"), ("H200", "H200 SXM"),
             ("A100", "A100 SXM 80GB"), ("B200", "B200 (HGX)"), ("MI300X", "MI300X")]


def chip_for(device_name: str) -> str | None:
    """The CHIPS row for a device name such as 'NVIDIA H100 80GB HBM3', or None when the table has none."""
    name = device_name.upper()  # 'H100 PCIe', 'A100-PCIE-40GB': the drivers do not agree on case
    for fragment, row in GPU_NAMES:
        if fragment in name:
            return row
    return None


def device_peak(device: torch.device, dtype: str = "bf16", *, matmul_n: int = 512) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) for `device` computing in `dtype` ("bf16", "fp32" or "tf32")."""
    one_of("dtype", dtype, ("bf16", "fp32", "tf32"))
    positive_int("matmul_n", matmul_n)
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        row = chip_for(name)
        if row is not None and dtype in CHIPS[row].peak_tflops:
            return CHIPS[row].peak_flops(dtype), f"{row} datasheet, dense {dtype} ({CHIPS[row].source.split(',')[0]})"
        label = f"no datasheet peak for {name} in lesson 01's table: measured {matmul_n}² {dtype} matmul"
    else:
        label = (f"no datasheet peak for this CPU: measured {matmul_n}² {dtype} matmul on "
                 f"{torch.get_num_threads()} thread(s)")
    measured = "bf16" if dtype == "bf16" else "fp32"
    return measure_matmul(matmul_n, measured, device=device), label


def step_throughput(tokens: int, seconds: float, model: int | TransformerConfig, world_size: int, peak_flops: float,
                    recompute: str = "none", share: float = 1.0) -> dict:
    """{"tokens_per_s", "mfu", "hfu"} of one optimizer step: model FLOPs (a config: attention included) and hardware
    FLOPs (+ what `recompute` re-runs in `share` of the layers) per token × tokens/s over world_size · peak (PaLM, App. B)."""
    positive_int("tokens", tokens)
    tps = tokens / positive_real("seconds", seconds)
    return {"tokens_per_s": tps, "mfu": model_flops_utilization(tps, model, world_size, peak_flops),
            "hfu": hardware_flops_utilization(tps, model, world_size, peak_flops, recompute=recompute, share=share)}
