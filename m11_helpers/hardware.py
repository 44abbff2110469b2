"""Lesson 01's code: the roofline, compute budgets, what fits in memory, and measuring this machine.

    from m11_helpers.hardware import matmul_intensity, attainable_flops, training_days, measure_matmul
    from m11_helpers.hardware_specs import CHIPS          # the spec table, each row with its source

Formulas are pure functions. Measurements use the *median* of a few repeats (`m11_helpers.timing`):
on a shared machine a few runs are slowed by other work, and the median ignores them. They time
whatever device they are given and synchronise a GPU before reading the clock.
"""

from __future__ import annotations

import math
from pathlib import Path

from m11_helpers.hardware_specs import CHIPS, DTYPE_BYTES, Chip
from m11_helpers.timing import time_it
from m11_helpers.validate import fraction, non_negative_real, positive_int, positive_real

__all__ = [
    "matmul_flops", "matmul_bytes", "matmul_intensity", "arithmetic_intensity", "ridge_point",
    "attainable_flops", "bound", "roofline_point", "training_flops", "training_days",
    "model_flops_utilization", "BYTES_PER_PARAM", "memory_needed", "max_params", "cpu_flags",
    "bf16_hardware", "measure_matmul", "measure_copy_bandwidth", "measure_kernels", "p2p_bandwidth", "measured_chip",
    "plot_roofline", "device_choices", "TORCH_DTYPES",
]

SECONDS_PER_DAY = 86_400


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


# ---------------------------------------------------------------- the roofline (Williams et al. 2009)

def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of (m×k) @ (k×n) = 2·m·n·k: one multiply and one add per inner-product term."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        positive_real(name, v)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, dtype: str = "bf16") -> int:
    """Least memory traffic of a matmul = (m·k + k·n + m·n)·bytes: read A and B once, write C once."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        positive_real(name, v)
    return (m * k + k * n + m * n) * _dtype_bytes(dtype)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """I = FLOPs / bytes moved to and from memory (Williams, Waterman & Patterson 2009, 'Roofline')."""
    positive_real("bytes_moved", bytes_moved)
    non_negative_real("flops", flops)
    return flops / bytes_moved


def matmul_intensity(m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """I = 2mnk / ((mk + kn + mn)·bytes); for a square n×n matmul I = n / (3·bytes / 2)."""
    return arithmetic_intensity(matmul_flops(m, n, k), matmul_bytes(m, n, k, dtype))


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """I* = peak FLOP/s / bandwidth (bytes/s): below it a kernel is memory-bound (Williams et al. 2009)."""
    positive_real("peak_flops", peak_flops)
    positive_real("bandwidth", bandwidth)
    return peak_flops / bandwidth


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """P = min(peak, I·bandwidth): the roofline (Williams et al. 2009, Fig. 1)."""
    positive_real("intensity", intensity)
    ridge_point(peak_flops, bandwidth)  # validates both
    return min(peak_flops, intensity * bandwidth)


def bound(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """'memory-bound' if I < I* (the slanted roof), else 'compute-bound' (the flat roof)."""
    positive_real("intensity", intensity)
    return "memory-bound" if intensity < ridge_point(peak_flops, bandwidth) else "compute-bound"


def roofline_point(device: Chip, m: int, n: int, k: int, dtype: str = "bf16") -> dict:
    """Where an (m×k)@(k×n) matmul sits on `device`'s roofline: intensity, attainable FLOP/s, bound, time."""
    peak, bw = device.peak_flops(dtype), device.bandwidth
    intensity = matmul_intensity(m, n, k, dtype)
    attainable = attainable_flops(intensity, peak, bw)
    return {"device": device.name, "dtype": dtype, "flops": matmul_flops(m, n, k),
            "bytes": matmul_bytes(m, n, k, dtype), "intensity": intensity, "ridge": ridge_point(peak, bw),
            "attainable": attainable, "fraction_of_peak": attainable / peak,
            "bound": bound(intensity, peak, bw), "seconds": matmul_flops(m, n, k) / attainable}


# ---------------------------------------------------------------- compute budget

def training_flops(params: float, tokens: float) -> float:
    """C = 6·N·D: forward 2N + backward 4N FLOPs per token (Kaplan et al. 2020, §2.1)."""
    positive_real("params", params)
    positive_real("tokens", tokens)
    return 6 * params * tokens


def training_days(params: float, tokens: float, gpus: int, peak_flops: float, mfu: float,
                  flops_per_param_token: float = 6) -> float:
    """T = k·N·D / (gpus · peak · MFU) in days; k = 6 (Kaplan), 8 with full activation recomputation
    (Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters', §5.1)."""
    positive_real("gpus", gpus)
    positive_real("peak_flops", peak_flops)
    fraction("mfu", mfu)
    positive_real("flops_per_param_token", flops_per_param_token)
    total = training_flops(params, tokens) * flops_per_param_token / 6
    return total / (gpus * peak_flops * mfu) / SECONDS_PER_DAY


def model_flops_utilization(tokens_per_second: float, params: float, chips: int, peak_flops: float) -> float:
    """MFU = 6·N·(tokens/s) / (chips · peak): useful FLOPs over peak, recomputation not counted
    (Chowdhery et al. 2022, 'PaLM', Appendix B; PaLM 540B reached 46.2 %)."""
    for name, v in (("tokens_per_second", tokens_per_second), ("params", params), ("chips", chips),
                    ("peak_flops", peak_flops)):
        positive_real(name, v)
    return 6 * params * tokens_per_second / (chips * peak_flops)


# ---------------------------------------------------------------- capacity

# Bytes of GPU memory per parameter. Training with mixed-precision Adam: bf16/fp16 weights (2) and
# gradients (2), plus fp32 master weights, momentum and variance (4 + 4 + 4) = 16
# (Rajbhandari et al. 2020, 'ZeRO', §3.1). Activations, KV cache and workspace come on top.
BYTES_PER_PARAM = {"fp32 weights": 4, "bf16 weights": 2, "int8 weights": 1, "mixed-precision Adam": 16}


def _bpp(bytes_per_param) -> float:
    if isinstance(bytes_per_param, str):
        if bytes_per_param not in BYTES_PER_PARAM:
            raise ValueError(f"bytes_per_param must be a number or one of {list(BYTES_PER_PARAM)}, "
                             f"got {bytes_per_param!r}")
        return BYTES_PER_PARAM[bytes_per_param]
    positive_real("bytes_per_param", bytes_per_param)
    return bytes_per_param


def memory_needed(params: float, bytes_per_param="bf16 weights") -> float:
    """M = N · bytes per parameter (states only: no activations)."""
    positive_real("params", params)
    return params * _bpp(bytes_per_param)


def max_params(memory_bytes: float, bytes_per_param="bf16 weights") -> int:
    """N_max = ⌊memory / bytes per parameter⌋: the largest model whose states fit."""
    positive_real("memory_bytes", memory_bytes)
    return int(memory_bytes // _bpp(bytes_per_param))


# ---------------------------------------------------------------- this machine

def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); an empty set elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_hardware(flags: set[str] | None = None) -> str:
    """Which bf16 matrix hardware an x86 CPU has: 'AMX' (tile units), 'AVX512-BF16' (dot-product
    instructions) or 'none' (bf16 is converted to fp32 in software)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return "none"


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be a torch.dtype or one of {list(TORCH_DTYPES)}, got {dtype!r}")
    return getattr(torch, TORCH_DTYPES[dtype])


TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _median_seconds(fn, device, repeats: int) -> float:
    """Median of `repeats` timed runs after one warm-up (first calls pick kernels and allocate)."""
    import torch

    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None
    return time_it(fn, repeats=repeats, warmup=1, sync=sync).median


def measure_matmul(n: int, dtype="fp32", device="cpu", repeats: int = 3) -> float:
    """Achieved FLOP/s of an n×n @ n×n matmul: 2n³ / median time of `repeats` runs (after one warm-up)."""
    import torch

    positive_int("n", n)
    positive_int("repeats", repeats)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=_torch_dtype(dtype))  # (n, n)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=_torch_dtype(dtype))  # (n, n)
    return matmul_flops(n, n, n) / _median_seconds(lambda: a @ b, device, repeats)


def measure_copy_bandwidth(megabytes: float = 128, device="cpu", repeats: int = 3) -> float:
    """Achieved memory bandwidth in bytes/s of `dst.copy_(src)`: 2·size (read + write) / median time of `repeats`.
    Use a size well beyond the last-level cache, or this measures the cache."""
    import torch

    positive_real("megabytes", megabytes)
    src = torch.ones(int(megabytes * 1e6) // 4, device=device)  # (n,) fp32
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _median_seconds(lambda: dst.copy_(src), device, repeats)


def measure_kernels(device="cpu", dtype="fp32", repeats: int = 3, vector_mb: float = 64) -> list[dict]:
    """Kernels of rising arithmetic intensity, each with its FLOPs and bytes (counted, not measured)
    and its achieved FLOP/s (measured, median of `repeats`): element-wise add, a·x + y, matrix-vector, matmuls."""
    import torch

    dt = _torch_dtype(dtype)  # validates dtype first
    b = torch.empty(0, dtype=dt).element_size()
    gen = torch.Generator().manual_seed(0)
    n_vec = int(vector_mb * 1e6) // b
    x = torch.randn(n_vec, generator=gen).to(device=device, dtype=dt)  # (n_vec,)
    y = torch.randn(n_vec, generator=gen).to(device=device, dtype=dt)  # (n_vec,)
    out = torch.empty_like(x)
    side = int(math.sqrt(n_vec // 4))  # a matrix of a quarter of the vector's bytes
    w = torch.randn(side, side, generator=gen).to(device=device, dtype=dt)  # (side, side)
    v = torch.randn(side, generator=gen).to(device=device, dtype=dt)  # (side,)
    cases = [
        ("x + y", lambda: torch.add(x, y, out=out), n_vec, 3 * n_vec * b),
        ("2·x + y", lambda: torch.add(y, x, alpha=2.0, out=out), 2 * n_vec, 3 * n_vec * b),
        (f"matvec {side}", lambda: w @ v, 2 * side * side, (side * side + 2 * side) * b),
    ]
    for n in (64, 256, 1024):
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dt)  # (n, n)
        c = torch.randn(n, n, generator=gen).to(device=device, dtype=dt)  # (n, n)
        cases.append((f"matmul {n}", lambda a=a, c=c: a @ c, 2 * n ** 3, 3 * n * n * b))
    rows = []
    for name, fn, flops, nbytes in cases:
        seconds = _median_seconds(fn, device, repeats)
        rows.append({"kernel": name, "flops": flops, "bytes": nbytes,
                     "intensity": flops / nbytes, "achieved": flops / seconds})
    return rows


def p2p_bandwidth(megabytes: float = 16, repeats: int = 3) -> float:
    """Run under `launch` on 2 ranks: rank 0 sends `megabytes` to rank 1, which answers with one number.
    Returns bytes/s (median of `repeats`, after one warm-up) on every rank: the cost of leaving the process."""
    import torch
    import torch.distributed as dist

    positive_real("megabytes", megabytes)
    if dist.get_world_size() != 2:
        raise ValueError(f"p2p_bandwidth needs exactly 2 ranks, got {dist.get_world_size()}")
    payload = torch.ones(int(megabytes * 1e6) // 4)  # (n,) fp32

    def transfer():
        if dist.get_rank() == 0:
            dist.send(payload, dst=1)
        else:
            dist.recv(payload, src=0)

    # the warm-up transfer sets up the connection; the barrier before each clock read lines the ranks
    # up, and the one after cannot end on rank 0 before rank 1 has it all: it stops the clock
    seconds = time_it(transfer, repeats=repeats, warmup=1, sync=dist.barrier).median
    rate = torch.tensor([payload.nbytes / seconds], dtype=torch.float64)
    dist.broadcast(rate, src=0)  # rank 0's clock is the one that saw the whole round trip
    return float(rate)


def measured_chip(name: str, peak_tflops: dict, bandwidth_bytes: float, memory_gb: float | None = None) -> Chip:
    """This machine as a `Chip`, from measured peaks (FLOP/s ÷ 1e12 per dtype) and bandwidth."""
    if memory_gb is None:
        try:
            import psutil

            memory_gb = psutil.virtual_memory().total / 1e9
        except ImportError:
            memory_gb = 1.0
    return Chip(name, "CPU", dict(peak_tflops), memory_gb, bandwidth_bytes / 1e12, "none (one host)", None,
                "measured in this notebook")


def device_choices(measured: Chip | None = None) -> dict[str, Chip]:
    """The lab's menu: the spec table, plus this machine when measured."""
    return {**({measured.name: measured} if measured else {}), **CHIPS}


# ---------------------------------------------------------------- the plot

def plot_roofline(devices: list[Chip], dtype: str = "bf16", points: list[dict] | None = None, ax=None,
                  intensity_range: tuple[float, float] = (0.01, 1e4)):
    """Log-log rooflines of `devices` at `dtype` (a device lacking it is skipped), with optional points
    ({'label', 'intensity', 'flops'}); returns the axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    xs = np.logspace(math.log10(intensity_range[0]), math.log10(intensity_range[1]), 200)
    for d in devices:
        dt = dtype if dtype in d.peak_tflops else next(iter(d.peak_tflops))
        peak = d.peak_flops(dt)
        ys = np.minimum(peak, xs * d.bandwidth)
        style = {"lw": 2.5, "color": "black"} if d.kind == "CPU" else {"lw": 1.2}
        ax.loglog(xs, ys, label=f"{d.name} ({dt})", **style)
        ax.plot([ridge_point(peak, d.bandwidth)], [peak], "o", ms=3, color=ax.lines[-1].get_color())
    for p in points or []:
        ax.plot(p["intensity"], p["flops"], p.get("marker", "s"), ms=7, label=p.get("label"),
                color=p.get("color"))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    return ax
