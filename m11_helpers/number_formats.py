"""Number formats and underflow: what FP32, FP16, BF16 and FP8 can hold, and where a gradient goes to zero (lesson 06).

    bits(0.1, torch.bfloat16)                    # '0 01111011 1001101'
    round_trip(1 + 1e-3, torch.bfloat16)         # stored 1.0: the update is lost
    cast_fractions(grads, torch.float16, 2**8)   # how many entries flush to zero / go subnormal / overflow
    plot_log2_histogram(grads, torch.float16)    # the gradients against the format's window

Sources: IEEE 754-2019 §3 (binary formats); Micikevicius et al. 2018, "Mixed Precision Training"
(ICLR), §3.2 and Fig. 3 (activation gradients below FP16's range); Kalamkar et al. 2019, "A Study of
BFLOAT16 for Deep Learning Training"; Micikevicius et al. 2022, "FP8 Formats for Deep Learning".
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["FORMATS", "format_limits", "finfo_table", "bits", "round_trip", "cast_fractions", "activation_grads",
           "log2_window", "plot_log2_histogram"]

# name -> (torch dtype, exponent bits, mantissa bits); fp8 e4m3 is the "fn" variant (no inf).
FORMATS: dict[str, tuple[torch.dtype, int, int]] = {
    "fp32": (torch.float32, 8, 23),
    "fp16": (torch.float16, 5, 10),
    "bf16": (torch.bfloat16, 8, 7),
    "fp8_e4m3": (torch.float8_e4m3fn, 4, 3),
    "fp8_e5m2": (torch.float8_e5m2, 5, 2),
}
_BY_DTYPE = {dt: (name, e, m) for name, (dt, e, m) in FORMATS.items()}
_INT_VIEW = {32: torch.int32, 16: torch.int16, 8: torch.uint8}


def _fmt(dtype: torch.dtype) -> tuple[str, int, int]:
    return _BY_DTYPE[one_of("dtype", dtype, _BY_DTYPE)]


def format_limits(exp_bits: int, man_bits: int) -> dict[str, float]:
    """IEEE-style binary format: max=(2-2⁻ᵐ)·2^bias, min normal=2^(1-bias), min subnormal=2^(1-bias-m), ε=2⁻ᵐ (IEEE 754 §3.3)."""
    one_of("exp_bits", exp_bits, range(2, 12))  # one exponent pattern is reserved: at least 2 bits
    positive_int("man_bits", man_bits)
    bias = 2 ** (exp_bits - 1) - 1  # the all-ones exponent is reserved for inf/NaN
    return {"max": (2 - 2.0**-man_bits) * 2.0**bias, "min_normal": 2.0 ** (1 - bias),
            "min_subnormal": 2.0 ** (1 - bias - man_bits), "eps": 2.0**-man_bits}


def finfo_table(dtypes: Iterable[torch.dtype] = tuple(f[0] for f in FORMATS.values())) -> list[dict]:
    """One row per dtype from `torch.finfo`: bits (sign/exponent/mantissa), max, min normal, min subnormal, ε."""
    rows = []
    for dt in dtypes:
        name, e, m = _fmt(dt)
        fi = torch.finfo(dt)
        rows.append({"format": name, "bits": f"1/{e}/{m}", "max": fi.max, "min normal": fi.smallest_normal,
                     "min subnormal": fi.smallest_normal * fi.eps, "eps": fi.eps})
    return rows


def bits(x: float, dtype: torch.dtype = torch.float32) -> str:
    """The stored bit pattern of `x` in `dtype`, as 'sign exponent mantissa' (e.g. '0 01111 0000000000')."""
    _, e, m = _fmt(dtype)
    width = 1 + e + m
    raw = int(torch.tensor([x], dtype=torch.float32).to(dtype).view(_INT_VIEW[width]).item())
    s = format(raw & ((1 << width) - 1), f"0{width}b")  # two's complement -> unsigned pattern
    return f"{s[0]} {s[1:1 + e]} {s[1 + e:]}"


def round_trip(x: float, dtype: torch.dtype) -> dict[str, float]:
    """x → dtype → float: the stored value, |error| and |error|/|x| (≤ ε/2 for normal numbers, round to nearest)."""
    _fmt(dtype)
    stored = torch.tensor([x], dtype=torch.float64).to(dtype).double().item()
    err = abs(stored - x)
    return {"stored": stored, "abs_error": err, "rel_error": err / abs(x) if x else 0.0}


def cast_fractions(values: torch.Tensor, dtype: torch.dtype = torch.float16, scale: float = 1.0) -> dict[str, float]:
    """Of the nonzero finite entries of `values`·scale cast to `dtype`: fractions that flush to 0, land subnormal, overflow."""
    _fmt(dtype)
    positive_real("scale", scale)
    v = values.detach().flatten().double()
    v = v[(v != 0) & torch.isfinite(v)] * scale  # scaling in float64 is exact: a power of two
    if v.numel() == 0:
        return {"zero": 0.0, "subnormal": 0.0, "overflow": 0.0}
    c = v.to(dtype).double()
    fi = torch.finfo(dtype)
    n = v.numel()
    return {"zero": (c == 0).sum().item() / n,
            "subnormal": ((c != 0) & (c.abs() < fi.smallest_normal)).sum().item() / n,
            "overflow": (~torch.isfinite(c) | (c.abs() > fi.max)).sum().item() / n}


def activation_grads(model: nn.Module, *inputs, module_type: type = nn.Linear) -> torch.Tensor:
    """Every gradient flowing into the outputs of `module_type` layers during one fp32 backward (flat, fp32)."""
    grads: list[torch.Tensor] = []
    hooks = [mod.register_full_backward_hook(lambda _m, _gi, go: grads.append(go[0].detach().flatten()))
             for mod in model.modules() if isinstance(mod, module_type)]
    try:
        model.zero_grad(set_to_none=True)
        model(*inputs).backward()  # the model must return a scalar loss
    finally:
        for h in hooks:
            h.remove()
    model.zero_grad(set_to_none=True)
    return torch.cat(grads).float()  # (total activation-gradient entries,)


def log2_window(dtype: torch.dtype) -> tuple[float, float, float]:
    """log₂ of the format's smallest subnormal, smallest normal and largest number: its window on a log₂ axis."""
    _fmt(dtype)
    fi = torch.finfo(dtype)
    return tuple(torch.tensor(v, dtype=torch.float64).log2().item()
                 for v in (fi.smallest_normal * fi.eps, fi.smallest_normal, fi.max))


def plot_log2_histogram(values: torch.Tensor, dtype: torch.dtype = torch.float16, scale: float = 1.0, ax=None,
                        title: str | None = None):
    """Histogram of log₂|values·scale| over the format's zones: flushed to 0, subnormal, normal (a matplotlib Axes)."""
    import matplotlib.pyplot as plt

    positive_real("scale", scale)
    lg = values[values != 0].abs().double().log2() + torch.tensor(scale, dtype=torch.float64).log2()  # (n,)
    lo_sub, lo, hi = log2_window(dtype)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 2.8))
    ax.hist(lg.numpy(), bins=120, color="tab:blue")
    name = _fmt(dtype)[0].upper()
    ax.axvspan(min(lg.min().item(), lo_sub) - 1, lo_sub, color="tab:red", alpha=0.15, label=f"{name}: becomes 0")
    ax.axvspan(lo_sub, lo, color="tab:orange", alpha=0.15, label=f"{name}: subnormal (fewer bits)")
    ax.axvspan(lo, hi, color="tab:green", alpha=0.10, label=f"{name}: normal range")
    ax.axvspan(hi, max(lg.max().item(), hi) + 1, color="tab:purple", alpha=0.15, label=f"{name}: overflows to inf")
    ax.set(xlabel="log2 |value × scale|", ylabel="count", yscale="log", xlim=(-70, 45), title=title)
    ax.legend(fontsize=7, loc="upper left")
    return ax
