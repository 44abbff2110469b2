"""The roofline (Williams, Waterman & Patterson 2009): what a kernel can reach on a chip, from two numbers (lesson 01).

    matmul_intensity(4096, 4096, 4096, "bf16")          # 1365.3 FLOP/byte
    roofline_point(chip("H100 SXM"), 1, 4096, 4096)      # one token through a layer: memory-bound
    plot_roofline([chip("H100 SXM")], "bf16")

A kernel doing F FLOPs while moving B bytes to and from memory has intensity I = F / B; it runs no
faster than min(peak, I · bandwidth). Below the ridge I* = peak / bandwidth it is memory-bound.
Counts are the *least* traffic (each operand read once, the result written once): real kernels move
more, so the roofline is an upper bound, never a prediction.
"""

from __future__ import annotations

import math

from m11_helpers.hardware_specs import DTYPE_BYTES, Chip
from m11_helpers.validate import non_negative_real, positive_real

__all__ = ["dtype_bytes", "matmul_flops", "matmul_bytes", "arithmetic_intensity", "matmul_intensity", "ridge_point",
           "attainable_flops", "bound", "roofline_point", "plot_roofline"]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a spec-sheet dtype name ('fp32', 'bf16', …)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of (m×k) @ (k×n) = 2·m·n·k: one multiply and one add per inner-product term."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        positive_real(name, v)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, dtype: str = "bf16") -> int:
    """Least memory traffic of a matmul = (m·k + k·n + m·n)·bytes: read A and B once, write C once."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        positive_real(name, v)
    return (m * k + k * n + m * n) * dtype_bytes(dtype)


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
