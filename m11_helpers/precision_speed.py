"""Is 16-bit faster here? The cases lesson 06 times, and what this CPU offers for 16-bit math.

    speed_cases("cpu")       # {case: {precision: fn}}: the tiny GPT and one large matmul, fwd + bwd
    cpu_16bit_support()      # "vector ISA AVX2; 16-bit units: none (16-bit math runs via fp32)"

16-bit formats are faster only where the hardware has 16-bit arithmetic (GPU tensor cores; on CPUs
AVX-512-BF16 or AMX), and only for tensors large enough that the casts do not dominate.
`benchmarks/bf16_speed.py` measures more sizes side by side; timings go through `timing.time_it`.
"""

from __future__ import annotations

from typing import Callable

import torch

from m11_helpers.validate import positive_int

__all__ = ["speed_cases", "cpu_16bit_support"]


def speed_cases(device: str = "cpu", matmul_size: int = 1024) -> dict[str, dict[str, Callable[[], None]]]:
    """{case: {precision: fn}}: one forward+backward of the tiny GPT (batch 16) and of an n×n matmul, per precision."""
    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    n = positive_int("matmul_size", matmul_size)
    x, y = (t.to(device) for t in tokens(16).tensors)  # (16, 32) each
    model = tiny_gpt(0).to(device)

    def gpt_step(dtype):
        def step():
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(x, y)
            loss.backward()
        return step

    def matmul(dtype):
        a = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)  # (n, n)
        b = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)  # (n, n)
        return lambda: (a @ b).float().sum().backward()

    precisions = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    return {"tiny GPT fwd+bwd (autocast, batch 16)": {k: gpt_step(v) for k, v in precisions.items()},
            f"{n}x{n} matmul fwd+bwd": {k: matmul(v) for k, v in precisions.items()}}


def cpu_16bit_support() -> str:
    """What this CPU offers for 16-bit math: torch's vector ISA plus the bf16/fp16 flags Linux reports."""
    cap = torch.backends.cpu.get_cpu_capability()  # "AVX2", "AVX512", ... (what torch dispatches to)
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:  # not Linux: report the ISA only
        return f"vector ISA {cap} (CPU flags unavailable)"
    wanted = [fl for fl in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16") if fl in flags]
    return f"vector ISA {cap}; 16-bit units: {', '.join(wanted) if wanted else 'none (16-bit math runs via fp32)'}"
