"""Attention speed on this machine, measured side by side in one run (lesson 09).

    python benchmarks/attention.py [--threads 1]

Naive attention (materialises the s×s scores) vs PyTorch's SDPA (a fused flash-style CPU kernel) vs
our tiled `flash_attention` (Python loops over tiles), forward + backward, causal, fp32, B=1, H=8,
D=64, over sequence lengths; ratios against naive. The fusion benchmark is `benchmarks/fusion.py`.
Timings only: not run in CI.
"""

import argparse

import torch

from m11_helpers.attention import flash_attention, naive_attention
from m11_helpers.display import show_table
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
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s); times are medians of 3 runs")
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    rows = []
    for s in (256, 512, 1024, 2048):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, s, 64, generator=g).requires_grad_() for _ in range(3))  # (B, H, T, D)
        tn = fwd_bwd(lambda *x: naive_attention(*x, causal=True), q, k, v)
        ts = fwd_bwd(sdpa, q, k, v)
        tt = fwd_bwd(lambda *x: flash_attention(*x, block_q=128, block_k=128, causal=True), q, k, v)
        rows.append((s, tn * 1e3, ts * 1e3, tt * 1e3, tn / ts, tn / tt))
    show_table(rows, ["s", "naive ms", "sdpa ms", "tiled (ours) ms", "naive / sdpa", "naive / tiled"], floatfmt=".2f",
               title="attention forward + backward, causal, fp32, B=1, H=8, D=64")


if __name__ == "__main__":
    main()
