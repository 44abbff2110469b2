"""A training run's budget: how many FLOPs (6·N·D), how many days at a given MFU, what fits in a chip's memory
(lesson 01).

    training_flops(175e9, 300e9)                                  # 3.15e23 (GPT-3)
    model_flops_per_token(RUNNING_EXAMPLE)                        # 6N + 12·L·H·Q·T = 4.69e10 (+15.9 % for attention)
    hardware_flops_per_token(RUNNING_EXAMPLE, recompute="full")   # 8N + 16·L·H·Q·T: what the chips actually execute
    model_flops_utilization(238.3e3, 540.35e9, 6144, 275e12, layers=118, attn_width=48 * 256, seq_len=2048)  # 0.462
    training_days(175e9, 300e9, 1024, 312e12, 140 / 312, flops_per_param_token=8)   # 33.9 (Megatron-LM)
    min_chips(param_count(RUNNING_EXAMPLE), chip("H100 SXM").memory_bytes, "autocast")   # 2

**MFU and HFU, one definition each** (Chowdhery et al. 2022, 'PaLM', Appendix B). Model FLOPs per token
are 6N + 12·L·H·Q·T: 6N for the matmuls with weights (forward 2N, backward 4N) and 12·L·H·Q·T for the
attention scores QKᵀ and their use on V (L layers, H·Q the attention width, T tokens of context; PaLM counts
the full T × T, no causal halving). MFU = model FLOPs/s over peak: recomputation is *not* counted, so it
compares runs that recompute differently. HFU (hardware FLOPs utilisation) counts what the chips execute:
full recomputation adds a forward (8N + 16·L·H·Q·T), selective recomputation of attention only adds 4·L·H·Q·T
(Korthikanti et al. 2022, §5). Megatron-LM's 140 TFLOP/s per A100 is an HFU (Narayanan et al. 2021, §5.1).

Bytes per parameter come from `m11_helpers.model_states` (a layout name, e.g. "autocast" or "megatron":
16 B either way) or are given as a number (2 for bf16 weights alone). Capacities are bytes: pass
`Chip.memory_bytes`, which is binary (an "80 GB" H100 holds 80 GiB = 85.9e9 bytes).
"""

from __future__ import annotations

import math

from m11_helpers.config import TransformerConfig, param_count
from m11_helpers.model_states import LAYOUTS, bytes_per_param
from m11_helpers.validate import fraction, non_negative_int, one_of, positive_real

__all__ = ["SECONDS_PER_DAY", "training_flops", "training_days", "model_flops_per_token", "hardware_flops_per_token",
           "attention_share", "model_flops_utilization", "hardware_flops_utilization", "PUBLISHED_MFU",
           "per_param_bytes", "memory_needed", "max_params", "min_chips"]

SECONDS_PER_DAY = 86_400


def training_flops(params: float, tokens: float) -> float:
    """C = 6·N·D: forward 2N + backward 4N FLOPs per token (Kaplan et al. 2020, §2.1)."""
    positive_real("params", params)
    positive_real("tokens", tokens)
    return 6 * params * tokens


def training_days(params: float, tokens: float, gpus: int, peak_flops: float, mfu: float,
                  flops_per_param_token: float = 6) -> float:
    """T = k·N·D / (gpus · peak · MFU) in days; k = 6 (Kaplan), 8 with full activation recomputation
    (Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU Clusters', §5.1)."""
    positive_real("gpus", gpus)
    positive_real("peak_flops", peak_flops)
    fraction("mfu", mfu)
    positive_real("flops_per_param_token", flops_per_param_token)
    total = training_flops(params, tokens) * flops_per_param_token / 6
    return total / (gpus * peak_flops * mfu) / SECONDS_PER_DAY


RECOMPUTE = ("none", "selective", "full")


def _shape(model: float | TransformerConfig, layers: int, attn_width: int, seq_len: int) -> tuple[float, int, int, int]:
    """(N, L, H·Q, T) from a TransformerConfig, or N and the three given as numbers (0: no attention term)."""
    if isinstance(model, TransformerConfig):
        return float(param_count(model)), model.layers, model.heads * model.head_dim, model.seq_len
    positive_real("params", model)
    return (float(model), non_negative_int("layers", layers), non_negative_int("attn_width", attn_width),
            non_negative_int("seq_len", seq_len))


def model_flops_per_token(model: float | TransformerConfig, layers: int = 0, attn_width: int = 0,
                          seq_len: int = 0) -> float:
    """6N + 12·L·H·Q·T: a training step's model FLOPs per token, attention included (PaLM, Appendix B)."""
    n, l_, hq, t = _shape(model, layers, attn_width, seq_len)
    return 6 * n + 12 * l_ * hq * t


def hardware_flops_per_token(model: float | TransformerConfig, layers: int = 0, attn_width: int = 0,
                             seq_len: int = 0, recompute: str = "none", share: float = 1.0) -> float:
    """Model FLOPs + what recomputation re-runs: full +(2N + 4·L·H·Q·T) (one more forward), selective +4·L·H·Q·T
    (attention's core only; Korthikanti et al. 2022, §5). Narayanan et al. 2021 (§5.1) count the full case.
    `share`: the fraction of layers recomputed (every K-th block: ⌈L/K⌉/L), which scales the extra."""
    one_of("recompute", recompute, RECOMPUTE)
    fraction("share", share)
    n, l_, hq, t = _shape(model, layers, attn_width, seq_len)
    extra = {"none": 0.0, "selective": 4 * l_ * hq * t, "full": 2 * n + 4 * l_ * hq * t}[recompute]
    return model_flops_per_token(model, layers, attn_width, seq_len) + share * extra


def attention_share(model: float | TransformerConfig, layers: int = 0, attn_width: int = 0, seq_len: int = 0) -> float:
    """12·L·H·Q·T / 6N: what 6N leaves out (0.159 for the 7B at 4K tokens)."""
    n, l_, hq, t = _shape(model, layers, attn_width, seq_len)
    return 12 * l_ * hq * t / (6 * n)


def _rate(tokens_per_second: float, chips: int, peak_flops: float) -> float:
    for name, v in (("tokens_per_second", tokens_per_second), ("chips", chips), ("peak_flops", peak_flops)):
        positive_real(name, v)
    return tokens_per_second / (chips * peak_flops)


def model_flops_utilization(tokens_per_second: float, model: float | TransformerConfig, chips: int,
                            peak_flops: float, *, layers: int = 0, attn_width: int = 0, seq_len: int = 0) -> float:
    """MFU = (6N + 12·L·H·Q·T)·(tokens/s) / (chips · peak): recomputation not counted (PaLM, Appendix B; PaLM 540B
    on 6144 TPU v4: 46.2 %). Without layers/attn_width/seq_len (or a config) the attention term is 0: 6N only."""
    return model_flops_per_token(model, layers, attn_width, seq_len) * _rate(tokens_per_second, chips, peak_flops)


def hardware_flops_utilization(tokens_per_second: float, model: float | TransformerConfig, chips: int,
                               peak_flops: float, *, recompute: str = "none", layers: int = 0, attn_width: int = 0,
                               seq_len: int = 0, share: float = 1.0) -> float:
    """HFU = hardware FLOPs per token (recomputation counted) · (tokens/s) / (chips · peak) (PaLM, Appendix B)."""
    return (hardware_flops_per_token(model, layers, attn_width, seq_len, recompute, share)
            * _rate(tokens_per_second, chips, peak_flops))


# What whole training runs reach, as published: (run, low, high, what is counted, source).
PUBLISHED_MFU = [
    ("GPT-3 175B, V100", 0.213, 0.213, "MFU", "Chowdhery et al. 2022, 'PaLM', Table 3"),
    ("Gopher 280B, TPU v3", 0.325, 0.325, "MFU", "Chowdhery et al. 2022, 'PaLM', Table 3"),
    ("Megatron-Turing NLG 530B, A100", 0.302, 0.302, "MFU", "Chowdhery et al. 2022, 'PaLM', Table 3"),
    ("PaLM 540B, 6144 TPU v4", 0.462, 0.462, "MFU",
     "Chowdhery et al. 2022, 'PaLM', Table 3 (57.8 % counting rematerialisation: HFU)"),
    ("Llama 3 405B, 8K-16K H100", 0.38, 0.43, "MFU, bf16",
     "Llama Team 2024, 'The Llama 3 Herd of Models', Table 4"),
    ("GPT-3 175B on 1024 A100 (Megatron-LM)", 140 / 312, 140 / 312, "HFU: 140 of 312 TFLOP/s, recomputation counted",
     "Narayanan et al. 2021, §5.1"),
]


def per_param_bytes(bytes_per_param_or_layout: float | str) -> float:
    """A number of bytes per parameter, or a `model_states` layout's total (16 for 'autocast')."""
    if isinstance(bytes_per_param_or_layout, str):
        if bytes_per_param_or_layout not in LAYOUTS:
            raise ValueError(f"bytes_per_param must be a number or one of {list(LAYOUTS)}, "
                             f"got {bytes_per_param_or_layout!r}")
        return bytes_per_param(bytes_per_param_or_layout)["total"]
    return positive_real("bytes_per_param", bytes_per_param_or_layout)


def memory_needed(params: float, bytes_per_param: float | str = 2) -> float:
    """M = N · bytes per parameter (model states only: no activations, no workspace)."""
    positive_real("params", params)
    return params * per_param_bytes(bytes_per_param)


def max_params(memory_bytes: float, bytes_per_param: float | str = 2) -> int:
    """N_max = ⌊memory / bytes per parameter⌋: the largest model whose states fit."""
    positive_real("memory_bytes", memory_bytes)
    return int(memory_bytes // per_param_bytes(bytes_per_param))


def min_chips(params: float, memory_bytes: float, bytes_per_param: float | str = 2) -> int:
    """⌈N · bytes / memory⌉: the fewest chips that hold the states together, sharded evenly (ZeRO-3/FSDP)."""
    positive_real("memory_bytes", memory_bytes)
    return math.ceil(memory_needed(params, bytes_per_param) / memory_bytes)
