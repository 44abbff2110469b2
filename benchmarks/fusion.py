"""Fusion speed on this machine, measured side by side in one run (lesson 09).

    python benchmarks/fusion.py [--threads 1] [--no-compile] [--rows 4096]

The LayerNorm → bias → GELU chain three ways: op by op as a textbook writes it (19 kernels), from
PyTorch's library kernels (F.layer_norm, add, F.gelu: 3), and torch.compile'd (TorchInductor
generates fused C++ or Triton kernels; on CPU it needs a C++ compiler). Prints the bytes the first two
move against the one-kernel minimum, and the time of each (median of 5 runs under no_grad) with the ratios. Lesson 09
quotes the ratios with the date and machine they were measured on. Timings only: not run in CI.
"""

import argparse
import platform
import time

import torch

from m11_helpers.display import show_table
from m11_helpers.fusion import (
    chain_inputs,
    fused_traffic_bytes,
    ln_bias_gelu_library,
    ln_bias_gelu_unfused,
    time_fn,
    traffic_bytes,
    try_compile,
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s), {platform.processor() or platform.machine()}, "
          f"vector ISA {torch.backends.cpu.get_cpu_capability()}")
    x, w, b, bias = chain_inputs(a.rows, 1024)  # x (rows, 1024) fp32
    fused = fused_traffic_bytes(x, w, b, bias)
    times = {"op by op (textbook)": time_fn(ln_bias_gelu_unfused, x, w, b, bias),
             "library kernels": time_fn(ln_bias_gelu_library, x, w, b, bias)}
    traffic = {"op by op (textbook)": traffic_bytes(ln_bias_gelu_unfused, x, w, b, bias) / fused,
               "library kernels": traffic_bytes(ln_bias_gelu_library, x, w, b, bias) / fused}
    if not a.no_compile:
        c, why = try_compile(ln_bias_gelu_unfused)
        if c is None:
            print("torch.compile:", why)
        else:
            t0 = time.perf_counter()
            c(x, w, b, bias)
            print(f"torch.compile: the first call (compiling) took {time.perf_counter() - t0:.1f} s")
            times["torch.compile"] = time_fn(c, x, w, b, bias)
            traffic["torch.compile"] = None  # whatever kernels Inductor generated: not counted here
    unfused, library = times["op by op (textbook)"], times["library kernels"]
    show_table([(name, traffic[name], t * 1e3, unfused / t, library / t) for name, t in times.items()],
               ["LayerNorm → bias → GELU", "bytes × minimum", "ms", "speed-up vs textbook", "speed-up vs library"],
               floatfmt=".2f", title=f"x {tuple(x.shape)} fp32")


if __name__ == "__main__":
    main()
