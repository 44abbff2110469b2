"""Is 16-bit faster here? fp32 vs bf16/fp16 forward+backward, measured side by side in one run.

    python benchmarks/bf16_speed.py            # CPU (and the first GPU, if there is one)
    python benchmarks/bf16_speed.py --reps 10 --sizes 64 256 1024 2048   # 2048: minutes (CPU fp16 has no fast path)

Prints, for the course's tiny GPT and for square matmuls of growing size, the time per
forward+backward (median of --reps runs, after one warm-up) in each precision and the ratio to
fp32 (>1 = slower than fp32). Lesson 06 cites it: on a CPU without 16-bit units (AVX2 only) bf16
is slower at every size; with AVX-512-BF16/AMX, large matmuls get faster while the tiny GPT (tiny
tensors, cast overhead) stays slower. One thread, as the course runs on CPU. Not part of the test
suite (timing).
"""

from __future__ import annotations

import argparse

import torch

from m11_helpers.data import tokens
from m11_helpers.models import tiny_gpt
from m11_helpers.precision_speed import cpu_16bit_support
from m11_helpers.timing import time_it


def timed(fn, reps: int, device: str) -> float:
    """Median seconds per call of `fn` over `reps` runs, after one warm-up (kernel selection, allocator)."""
    sync = torch.cuda.synchronize if device == "cuda" else None
    return time_it(fn, repeats=reps, warmup=1, sync=sync).median


def gpt_cases(device: str):
    x, y = (t[:16].to(device) for t in tokens(16).tensors)  # (16, 32) each
    model = tiny_gpt(0).to(device)
    pure = tiny_gpt(0).to(device, torch.bfloat16)

    def autocast(dtype):
        def step():
            with torch.autocast(device, dtype=dtype):
                loss = model(x, y)
            loss.backward()
        return step

    return {"fp32": lambda: model(x, y).backward(), "autocast bf16": autocast(torch.bfloat16),
            "autocast fp16": autocast(torch.float16), "pure bf16 weights": lambda: pure(x, y).backward()}


def matmul_cases(n: int, device: str):
    cases = {}
    for name, dt in [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)]:
        a = torch.randn(n, n, device=device, dtype=dt, requires_grad=True)  # (n, n)
        b = torch.randn(n, n, device=device, dtype=dt, requires_grad=True)
        cases[name] = lambda a=a, b=b: (a @ b).float().sum().backward()
    return cases


def report(title: str, cases: dict, reps: int, device: str) -> None:
    times = {k: timed(fn, reps, device) for k, fn in cases.items()}
    base = times["fp32"]
    cells = "  ".join(f"{k} {v * 1e3:8.2f} ms ({v / base:5.2f}x)" for k, v in times.items())
    print(f"{title:<26} {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    # 1024 is enough to see 16-bit units pay off; CPU fp16 matmuls take ~10 s each at 1024 on a busy core, 8x that at 2048
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    args = ap.parse_args()
    torch.set_num_threads(1)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}; CPU: {cpu_16bit_support()}; 1 thread; "
          f"median time per fwd+bwd of {args.reps} (ratio to fp32)")
    for device in devices:
        if device == "cuda":
            torch.set_num_threads(4)
            print(f"GPU: {torch.cuda.get_device_name(0)}")
        report(f"[{device}] tiny GPT, batch 16", gpt_cases(device), args.reps, device)
        sizes = args.sizes + ([4096, 8192] if device == "cuda" else [])
        for n in sizes:
            report(f"[{device}] matmul {n}x{n}", matmul_cases(n, device), args.reps, device)


if __name__ == "__main__":
    main()
