"""Lesson 01's measurements of this machine: matmul throughput, copy bandwidth, kernels on the roofline, and
the latency and bandwidth between two real processes (a ping-pong).

    from m11_helpers.hardware import measure_matmul, copy_bandwidth, ping_pong, fit_latency_bandwidth
    from m11_helpers.roofline import attainable_flops        # the formulas: roofline.py, compute_budget.py
    from m11_helpers.hardware_specs import CHIPS              # the spec table, each row with its source

Every figure is the *median* of a few repeats after a warm-up (`m11_helpers.timing.time_it`): on a
shared machine a few runs are slowed by other work, and the median ignores them. The helpers time
whatever device they are given and synchronise a GPU before reading the clock.

Bandwidth convention (one for the whole course): **bytes moved = bytes read + bytes written**, the
STREAM benchmark's "Copy" convention (McCalpin, STREAM, counts 2 × 8 bytes per element of
`a[i] = b[i]`) and the roofline's (`roofline.matmul_bytes` counts reads and writes). A copy of S bytes
in t seconds is 2S/t; the rate at which the copy itself completes, S/t, is half of that.

The roofline and budget formulas are re-exported here so `from m11_helpers import hardware as hw`
reaches the whole lesson; they live in `roofline.py` and `compute_budget.py`.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from m11_helpers.compute_budget import (  # noqa: F401 - re-exported: the lesson's one import
    PUBLISHED_MFU,
    hardware_flops_utilization,
    max_params,
    memory_needed,
    min_chips,
    model_flops_per_token,
    model_flops_utilization,
    training_days,
    training_flops,
)
from m11_helpers.hardware_specs import CHIPS, Chip
from m11_helpers.roofline import (  # noqa: F401 - re-exported: the lesson's one import
    arithmetic_intensity,
    attainable_flops,
    bound,
    matmul_bytes,
    matmul_flops,
    matmul_intensity,
    plot_roofline,
    ridge_point,
    roofline_point,
)
from m11_helpers.timing import time_it
from m11_helpers.validate import positive_int, positive_real

__all__ = [
    "cpu_flags", "bf16_hardware", "TORCH_DTYPES", "measure_matmul", "copy_bandwidth",
    "measure_kernels", "ping_pong", "ping_pong_sweep", "fit_latency_bandwidth", "measured_chip", "device_choices",
    # re-exported formulas
    "matmul_flops", "matmul_bytes", "matmul_intensity", "arithmetic_intensity", "ridge_point", "attainable_flops",
    "bound", "roofline_point", "plot_roofline", "training_flops", "training_days", "model_flops_utilization",
    "model_flops_per_token", "hardware_flops_utilization", "PUBLISHED_MFU", "memory_needed", "max_params", "min_chips",
]

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


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


def copy_bandwidth(nbytes: int = 64 * 2**20, device="cpu", repeats: int = 3) -> float:
    """Memory bandwidth of `dst.copy_(src)` for S = `nbytes`, in bytes/s: 2·S / median time (read S + write S,
    the STREAM "Copy" convention). The copy's own rate S/t is half of this. Use S well beyond the
    last-level cache, or this measures the cache. Inside `launch`, each rank measures its own thread."""
    import torch

    positive_int("nbytes", nbytes)
    positive_int("repeats", repeats)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)  # (S,) touched: no page faults in the timing
    dst = torch.zeros_like(src)  # (S,)
    return 2 * nbytes / _median_seconds(lambda: dst.copy_(src), device, repeats)


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


def ping_pong(nbytes: int, repeats: int = 5) -> float:
    """Run under `launch` on 2 ranks: rank 0 sends `nbytes`, rank 1 sends them back; one untimed warm-up
    exchange (it sets up the connection), then `repeats` timed. Returns the one-way time in seconds,
    median round trip / 2, on both ranks (rank 0's clock: it sees the whole round trip). Under NCCL
    (one GPU per rank) the message lives on the GPU and the clock waits for the GPU."""
    import torch
    import torch.distributed as dist

    positive_int("nbytes", nbytes)
    positive_int("repeats", repeats)
    if dist.get_world_size() != 2:
        raise ValueError(f"ping_pong needs exactly 2 ranks, got {dist.get_world_size()}")
    rank = dist.get_rank()
    gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)  # (S,) the message, S bytes
    trips = []
    for i in range(1 + repeats):
        sync()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, dst=1)
            dist.recv(buf, src=1)  # returns once the echo is back: a whole round trip
        else:
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)
        sync()
        if i:  # exchange 0 is the warm-up
            trips.append(time.perf_counter() - t0)
    one_way = torch.tensor([statistics.median(trips) / 2], dtype=torch.float64, device=device)
    dist.broadcast(one_way, src=0)
    return float(one_way)


def ping_pong_sweep(sizes: list[int], repeats: int = 5) -> list[float]:
    """Run under `launch` on 2 ranks: `ping_pong` at every size (bytes); one-way seconds per size."""
    return [ping_pong(int(s), repeats) for s in sizes]


def fit_latency_bandwidth(sizes, seconds) -> tuple[float, float]:
    """Least-squares fit of t = α + S / B to measured (S bytes, t seconds): returns (α in s, B in bytes/s)
    (Hockney 1994, 'The communication challenge for MPP', the α-β model). α is clamped at 0."""
    import numpy as np

    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if s.shape != t.shape or s.ndim != 1 or len(s) < 2 or len(set(s.tolist())) < 2:
        raise ValueError("sizes and seconds must be 1-D, of equal length, with at least 2 distinct sizes")
    slope, alpha = np.polyfit(s, t, 1)  # t ≈ slope·S + α
    positive_real("fitted seconds per byte (the slope: times must grow with size)", float(slope))
    return max(float(alpha), 0.0), float(1.0 / slope)


def measured_chip(name: str, peak_tflops: dict, bandwidth_bytes: float, memory_bytes: int | None = None) -> Chip:
    """This machine as a `Chip`, from measured peaks (FLOP/s ÷ 1e12 per dtype) and bandwidth (bytes/s)."""
    if memory_bytes is None:
        try:
            import psutil

            memory_bytes = int(psutil.virtual_memory().total)
        except ImportError:
            memory_bytes = 2**30
    return Chip(name, "CPU", dict(peak_tflops), int(memory_bytes), bandwidth_bytes / 1e12, "none (one host)", None,
                "measured in this notebook", as_of="this run")


def device_choices(measured: Chip | None = None) -> dict[str, Chip]:
    """The lab's menu: the spec table, plus this machine when measured."""
    return {**({measured.name: measured} if measured else {}), **CHIPS}
