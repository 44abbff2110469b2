"""Lesson 06 — FP8 on the course model: the error of each scaling recipe on real tensors, and where FP8 pays.

    tensors = model_tensors()            # activations, weights, gradients of a trained tiny GPT (+ an outlier channel)
    error_table(tensors)                 # {tensor: {recipe: SNR dB}}, each recipe from m11_helpers.fp8_scaling
    fp8_gemm_speedup(chip("H100 SXM"), 8192, 8192, 8192)   # roofline: bf16 time / fp8 time, casts included

Tensors come from m11_helpers.models.TinyGPT widened to 256 channels (so DeepSeek-V3's 128-wide tiles
fit), trained a few AdamW steps on the course's token data. LLM activations carry a few channels
far larger than the rest (Dettmers et al. 2022, "LLM.int8()", §3.2: outliers up to 20× in a handful
of hidden dimensions; Sun et al. 2024, "Massive Activations in Large Language Models"); a model this
small has none, so "activation + outlier" multiplies one channel by 1000 — injected, and labelled so.

Where FP8 pays: an FP8 GEMM halves operand bytes and doubles peak FLOP/s, but dynamic scaling
first reads each bf16 operand for its amax, reads it again to cast it and writes it in FP8 (5 bytes
per element, memory-bound, unless fused into the producer by a compiler). Roofline times
(Williams et al. 2009) of both sides give the speedup; small GEMMs lose. This is the measured
pattern: torchao reports e2e speedups of 1.25× at 8B and 1.5× at 405B parameters with
torch.compile (docs.pytorch.org/ao, "Quantized Training", 2026), a GPT of 1.5B ran 2× *slower*
(pytorch/ao#1297), and Accelerate's guide promises gains "for larger models"
(huggingface.co/docs/accelerate, "Low Precision Training Methods").
"""

from __future__ import annotations

import dataclasses

import torch

from m11_helpers.fp8_scaling import quant_error
from m11_helpers.hardware_specs import Chip
from m11_helpers.roofline import dtype_bytes, matmul_flops
from m11_helpers.validate import non_negative_real, positive_int, positive_real

__all__ = ["FP8_CONFIG", "OUTLIER_GAIN", "model_tensors", "error_table", "fp8_gemm_times", "fp8_gemm_speedup"]

OUTLIER_GAIN = 1000.0  # the injected channel: "massive activations" reach thousands of times the median
CAST_BYTES_PER_ELEMENT = 5  # amax pass reads 2 bytes, the cast reads 2 and writes 1 (bf16 → fp8)


def _fp8_config():
    from m11_helpers.config import TINY_GPT
    return dataclasses.replace(TINY_GPT, name="tiny GPT, 256 wide", hidden=256, ffn_hidden=1024)


FP8_CONFIG = _fp8_config()


def model_tensors(steps: int = 5, batch: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Real 2-D tensors of one MLP of the widened tiny GPT after `steps` AdamW steps, keyed by what they are.

    activation: the input of block 1's fc layer (B·T, 256); weight: that layer's (1024, 256) weight;
    weight grad: its gradient; activation grad: dL/d(output of fc) (B·T, 1024), the gradient a
    backward GEMM consumes; activation + outlier: the activation with channel 7 ×OUTLIER_GAIN.
    """
    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    positive_int("steps", steps)
    x, y = tokens(batch, seed=seed).tensors  # (B, T) each
    model = tiny_gpt(seed, FP8_CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fc = model.blocks[1].mlp.fc
    seen: dict[str, torch.Tensor] = {}
    h1 = fc.register_forward_hook(lambda m, inp, out: seen.__setitem__("activation", inp[0].detach()))
    h2 = fc.register_full_backward_hook(lambda m, gin, gout: seen.__setitem__("activation grad", gout[0].detach()))
    try:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            model(x, y).backward()
            out = {"weight grad": fc.weight.grad.detach().clone()}
            opt.step()
    finally:
        h1.remove()
        h2.remove()
    act = seen["activation"].reshape(-1, FP8_CONFIG.hidden)  # (B·T, 256)
    outlier = act.clone()
    outlier[:, 7] *= OUTLIER_GAIN  # one hot channel, as LLMs have
    return {"activation": act, "activation + outlier (injected)": outlier, "weight": fc.weight.detach().clone(),
            "weight grad": out["weight grad"],
            "activation grad": seen["activation grad"].reshape(-1, FP8_CONFIG.ffn_hidden)}


def error_table(tensors: dict[str, torch.Tensor], recipes: tuple[str, ...] = ("tensorwise", "rowwise", "mx",
                                                                               "deepseek", "deepseek_w"),
                metric: str = "degraded") -> dict[str, dict[str, float]]:
    """{tensor: {recipe: metric}}; metric is one of quant_error's keys (snr_db, rel_error, typical_error, degraded, flushed)."""
    return {name: {r: quant_error(t, r)[metric] for r in recipes} for name, t in tensors.items()}


def fp8_gemm_times(device: Chip, m: int, n: int, k: int, cast_bytes_per_element: float = CAST_BYTES_PER_ELEMENT
                   ) -> dict[str, float]:
    """Roofline seconds of one (m×k)@(k×n) GEMM: bf16; fp8 (operands 1 byte, output bf16); the casts of both operands.

    t = max(FLOPs / peak, bytes / bandwidth) (Williams et al. 2009); the cast is memory-bound:
    (m·k + k·n) · cast_bytes_per_element / bandwidth.
    """
    for name, v in (("m", m), ("n", n), ("k", k)):
        positive_int(name, v)
    non_negative_real("cast_bytes_per_element", cast_bytes_per_element)
    flops, bw = matmul_flops(m, n, k), device.bandwidth  # peak_flops("fp8") raises for a chip without FP8
    bf16_bytes = (m * k + k * n + m * n) * dtype_bytes("bf16")
    fp8_bytes = (m * k + k * n) * dtype_bytes("fp8") + m * n * dtype_bytes("bf16")
    return {"bf16": max(flops / device.peak_flops("bf16"), bf16_bytes / bw),
            "fp8 gemm": max(flops / device.peak_flops("fp8"), fp8_bytes / bw),
            "casts": (m * k + k * n) * cast_bytes_per_element / bw}


def fp8_gemm_speedup(device: Chip, m: int, n: int, k: int, cast_bytes_per_element: float = CAST_BYTES_PER_ELEMENT
                     ) -> float:
    """bf16 time / (fp8 GEMM + casts): above 1 FP8 pays; at most peak_fp8 / peak_bf16 (2 on H100)."""
    t = fp8_gemm_times(device, m, n, k, cast_bytes_per_element)
    positive_real("fp8 time", t["fp8 gemm"] + t["casts"])
    return t["bf16"] / (t["fp8 gemm"] + t["casts"])
