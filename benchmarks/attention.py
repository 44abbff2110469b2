"""Attention and fusion speed on this machine, measured side by side in one run (lesson 09).

    python benchmarks/attention.py [--threads 1] [--no-compile]

Attention: naive (materialises the s×s scores) vs PyTorch's SDPA (a fused flash-style CPU kernel) vs
our tiled flash_attention, forward + backward, causal, fp32, B=1, H=8, D=64, over sequence lengths.
Fusion: the LayerNorm → bias → GELU chain op by op, from library kernels, and torch.compile'd (one
generated kernel). Ratios are against the naive / unfused version. Timings only: not run in CI.
"""

import argparse
import time

import torch

from m11_helpers.attention import flash_attention, naive_attention
from m11_helpers.fusion import (
    chain_inputs,
    fused_traffic_bytes,
    ln_bias_gelu_library,
    ln_bias_gelu_unfused,
    time_fn,
    traffic_bytes,
    try_compile,
)
from m11_helpers.timing import time_it


def fwd_bwd(fn, q, k, v, repeats=3):
    """Median seconds of forward + backward over `repeats` runs after one warm-up."""
    def step():
        for t in (q, k, v):
            t.grad = None  # a fresh backward each time, not one accumulating into .grad
        fn(q, k, v).sum().backward()

    return time_it(step, repeats=repeats, warmup=1).median


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s); times are medians of a few runs")
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(f"{'s':>6} {'naive ms':>9} {'sdpa ms':>9} {'tiled ms':>9} {'naive/sdpa':>11} {'naive/tiled':>12}")
    for s in (256, 512, 1024, 2048):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, s, 64, generator=g).requires_grad_() for _ in range(3))
        tn = fwd_bwd(lambda *x: naive_attention(*x, causal=True), q, k, v)
        ts = fwd_bwd(sdpa, q, k, v)
        tt = fwd_bwd(lambda *x: flash_attention(*x, block_q=128, block_k=128, causal=True), q, k, v)
        print(f"{s:>6} {tn * 1e3:>9.1f} {ts * 1e3:>9.1f} {tt * 1e3:>9.1f} {tn / ts:>11.2f} {tn / tt:>12.2f}")

    x, w, b, bias = chain_inputs(4096, 1024)
    fused = fused_traffic_bytes(x, w, b, bias)
    tu = time_fn(ln_bias_gelu_unfused, x, w, b, bias)
    tl = time_fn(ln_bias_gelu_library, x, w, b, bias)
    print(f"\nLayerNorm→bias→GELU, x {tuple(x.shape)} fp32: traffic unfused "
          f"{traffic_bytes(ln_bias_gelu_unfused, x, w, b, bias) / fused:.1f}×, library "
          f"{traffic_bytes(ln_bias_gelu_library, x, w, b, bias) / fused:.1f}× the one-kernel minimum")
    print(f"unfused {tu * 1e3:.1f} ms, library {tl * 1e3:.1f} ms ({tu / tl:.2f}× faster)")
    if not a.no_compile:
        c, why = try_compile(ln_bias_gelu_unfused)
        if c is None:
            print("torch.compile:", why)
        else:
            t0 = time.perf_counter()
            c(x, w, b, bias)
            print(f"torch.compile: first call (compiles) {time.perf_counter() - t0:.1f} s")
            tc = time_fn(c, x, w, b, bias)
            print(f"compiled {tc * 1e3:.1f} ms ({tu / tc:.2f}× faster than unfused, {tl / tc:.2f}× than library)")


if __name__ == "__main__":
    main()
