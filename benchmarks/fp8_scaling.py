"""FP8 scaling recipes side by side: error on the course model's tensors, GEMM error against bf16, where FP8 pays.

    python benchmarks/fp8_scaling.py

Three tables from one run, each a view of lesson 06's helpers (m11_helpers.fp8_scaling, fp8_lab):
1. the share of entries FP8 E4M3 degrades (error above its rounding bound 2^-4: underflow, flush,
   saturation) for each recipe, on real activations, weights and gradients of the widened tiny GPT,
   and the median per-entry error; 2. the relative error of an emulated FP8 GEMM (quantise, multiply
   in fp32, rescale per group) next to bf16's, both against fp32; 3. the roofline speedup of FP8 over
   bf16 on an H100 for GEMM shapes from the tiny GPT to a 70B layer, casts included and fused away.
Errors are deterministic (seeded); the speedups are a model (peaks and bandwidth from the datasheet).
"""

from __future__ import annotations

from m11_helpers.fp8_lab import error_table, fp8_gemm_speedup, model_tensors
from m11_helpers.fp8_scaling import matmul_error
from m11_helpers.hardware_specs import chip

RECIPES = ("tensorwise", "rowwise", "mx", "deepseek", "deepseek_w")


def show(title: str, rows: dict[str, dict[str, float]], fmt: str) -> None:
    cols = list(next(iter(rows.values())))
    print(f"\n{title}\n{'':34s}" + "".join(f"{c:>12s}" for c in cols))
    for name, row in rows.items():
        print(f"{name:34s}" + "".join(f"{row[c]:>12{fmt}}" for c in cols))


def main() -> None:
    tensors = model_tensors()
    show("share of entries degraded (error > 2^-4)", error_table(tensors, RECIPES, "degraded"), ".2%")
    show("median per-entry relative error", error_table(tensors, RECIPES, "typical_error"), ".2%")
    w = tensors["weight"].t().contiguous()  # (256, 1024): y = x Wᵀ
    gemm = {name: matmul_error(tensors[name], w) for name in ("activation", "activation + outlier (injected)")}
    show("GEMM x @ Wᵀ, relative error against fp32", gemm, ".2%")
    ratios = {r: gemm["activation"][r] / gemm["activation"]["bf16"] for r in gemm["activation"]}
    print("  FP8 error ÷ bf16 error (activation): " + ", ".join(f"{r} {v:.1f}×" for r, v in ratios.items()))
    h100 = chip("H100 SXM")
    shapes = {"tiny GPT fc (512×256 @ 256×1024)": (512, 1024, 256),
              "GPT-2 small fc (8k tokens, 768→3072)": (8192, 3072, 768),
              "7B fc (8k tokens, 4096→11008)": (8192, 11008, 4096),
              "70B fc (8k tokens, 8192→28672)": (8192, 28672, 8192)}
    print(f"\nroofline speedup of FP8 over bf16 on {h100.name} (>1: FP8 pays)")
    print(f"{'':40s}{'casts 5 B/elt':>15s}{'casts fused':>13s}")
    for name, (m, n, k) in shapes.items():
        print(f"{name:40s}{fp8_gemm_speedup(h100, m, n, k):>14.2f}×{fp8_gemm_speedup(h100, m, n, k, 0):>12.2f}×")


if __name__ == "__main__":
    main()
