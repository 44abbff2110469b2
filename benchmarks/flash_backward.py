"""FlashAttention's tiled backward against autograd through full attention: the largest tensor and peak memory.

    python benchmarks/flash_backward.py            # T = 512 … 4096, one head of 64, causal, fp32
    python benchmarks/flash_backward.py --compile-flex    # also time torch.compile(flex_attention) on this CPU

For each T it runs, under lesson 09's allocation tracker (m11_helpers.flash_backward, a
TorchDispatchMode), (a) forward + backward of full attention through autograd and (b) the tiled
backward from the saved O and log-sum-exp, and prints the largest tensor either created and the
peak of what it held at once, with the ratio full ÷ tiled side by side. Seconds are one run each
(the tiled loop is Python: on a GPU the same algorithm is one fused kernel).
"""

from __future__ import annotations

import argparse
import time

import torch

from m11_helpers.attention import naive_attention, tiled_attention
from m11_helpers.flash_backward import allocation_profile, flash_backward

MiB = 2 ** 20


def profile(T: int, D: int = 64, block: int = 128) -> dict[str, dict]:
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, T, D, generator=g) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    t0 = time.perf_counter()
    full = allocation_profile(lambda: torch.autograd.grad(naive_attention(*leaves, causal=True), leaves, do))
    full["seconds"] = time.perf_counter() - t0
    o, lse = tiled_attention(q, k, v, block, block, causal=True, return_lse=True)
    t0 = time.perf_counter()
    tiled = allocation_profile(lambda: flash_backward(q, k, v, o, lse, do, block, block, causal=True))
    tiled["seconds"] = time.perf_counter() - t0
    return {"full (autograd)": full, "tiled backward": tiled}


def compile_flex() -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from m11_helpers.flex_masks import _mask_mod, document_ids
    doc = document_ids([100, 90, 66])
    q, k, v = (torch.randn(1, 2, 256, 16) for _ in range(3))
    mask = create_block_mask(_mask_mod(doc, True), 1, 2, 256, 256, device="cpu")
    fn = torch.compile(flex_attention)
    t0 = time.perf_counter()
    fn(q, k, v, block_mask=mask)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn(q, k, v, block_mask=mask)
    print(f"\ntorch.compile(flex_attention) on CPU: first call {first:.1f} s (compile), then "
          f"{(time.perf_counter() - t0) * 1e3:.2f} ms at T = 256")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--compile-flex", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'T':>6} {'method':>16} {'largest MiB':>12} {'peak MiB':>9} {'seconds':>8} {'(T,T) MiB':>10}")
    for T in args.sizes:
        res = profile(T)
        for name, p in res.items():
            print(f"{T:>6} {name:>16} {p['largest'] / MiB:>12.3f} {p['peak_live'] / MiB:>9.2f} {p['seconds']:>8.2f} "
                  f"{T * T * 4 / MiB:>10.1f}")
        f, t = res["full (autograd)"], res["tiled backward"]
        print(f"{'':>6} {'full ÷ tiled':>16} {f['largest'] / t['largest']:>11.0f}× {f['peak_live'] / t['peak_live']:>8.1f}×")
    if args.compile_flex:
        compile_flex()


if __name__ == "__main__":
    main()
