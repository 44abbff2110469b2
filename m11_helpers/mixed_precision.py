"""Number formats, underflow, loss scaling and autocast: the code of lesson 06 (mixed precision).

    bits(0.1, torch.bfloat16)                 # '0 01111011 1001101'
    cast_fractions(grads, torch.float16, 2**8)  # how many entries flush to zero / overflow
    scaler = DynamicLossScaler(growth_interval=4)  # GradScaler's rule, from scratch
    autocast_dtype_table(model, idx)          # which modules autocast runs in 16 bits

Sources: IEEE 754-2019 §3 (binary formats); Micikevicius et al. 2018, "Mixed Precision Training"
(ICLR), §3 (master weights, loss scaling, FP32 accumulation); Kalamkar et al. 2019, "A Study of
BFLOAT16 for Deep Learning Training"; Micikevicius et al. 2022, "FP8 Formats for Deep Learning";
Rajbhandari et al. 2020, "ZeRO", §3.1 (the 16 bytes per parameter of mixed-precision Adam).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
from torch import nn

from m11_helpers.validate import one_of, positive_int, positive_real

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
    if dtype not in _BY_DTYPE:
        raise ValueError(f"dtype must be one of {[str(d) for d in _BY_DTYPE]}, got {dtype}")
    return _BY_DTYPE[dtype]


def format_limits(exp_bits: int, man_bits: int) -> dict[str, float]:
    """IEEE-style binary format: max=(2-2⁻ᵐ)·2^bias, min normal=2^(1-bias), min subnormal=2^(1-bias-m), ε=2⁻ᵐ (IEEE 754 §3.3)."""
    if not isinstance(exp_bits, int) or exp_bits < 2:
        raise ValueError(f"exp_bits must be an integer >= 2, got {exp_bits!r}")
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
        rows.append({"format": name, "bits": f"1/{e}/{m}", "max": fi.max, "min_normal": fi.smallest_normal,
                     "min_subnormal": fi.smallest_normal * fi.eps, "eps": fi.eps})
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


# ----------------------------------------------------------------------------------------------
# Dynamic loss scaling (Micikevicius et al. 2018, §3.2; the rule of torch.amp.GradScaler)
# ----------------------------------------------------------------------------------------------


def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """Overflow: scale·backoff, tracker 0. Else tracker+1, and after `growth_interval` clean steps: scale·growth, tracker 0."""
    positive_int("growth_interval", growth_interval)
    if not (growth_factor > 1 and 0 < backoff_factor < 1):
        raise ValueError(f"need growth_factor > 1 and 0 < backoff_factor < 1, got {growth_factor}, {backoff_factor}")
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker + 1 == growth_interval:
        grown = scale * growth_factor
        # the scale lives in an fp32 tensor in GradScaler: never grow it past fp32's max (inf)
        return (grown if grown <= torch.finfo(torch.float32).max else scale), 0
    return scale, growth_tracker + 1


class DynamicLossScaler:
    """GradScaler from scratch: scale the loss, unscale and check grads, skip the step on inf/NaN, update the scale."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        positive_real("init_scale", init_scale)
        update_scale(init_scale, 0, False, growth_factor, backoff_factor, growth_interval)  # validates
        self.scale_value, self.growth_tracker = float(init_scale), 0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.found_inf = False
        self.skipped_steps = 0

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value  # lifts small gradients out of fp16's underflow zone

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide every grad by the scale in fp32 (before clipping!); remember whether any is inf/NaN."""
        inv = torch.tensor(1.0 / self.scale_value, dtype=torch.float64).float()  # as GradScaler: fp32 1/scale
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())
                    p.grad.mul_(inv)
        self.found_inf = found
        self._unscaled = True
        return found

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (unless done already) and step, or skip the step when a grad overflowed. Returns True if stepped."""
        if not getattr(self, "_unscaled", False):
            self.unscale_(optimizer)
        if self.found_inf:
            self.skipped_steps += 1
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        self.scale_value, self.growth_tracker = update_scale(
            self.scale_value, self.growth_tracker, self.found_inf, self.growth_factor, self.backoff_factor,
            self.growth_interval)
        self._unscaled, self.found_inf = False, False


# ----------------------------------------------------------------------------------------------
# What autocast does, gathered on a real model
# ----------------------------------------------------------------------------------------------


def _first_float(obj):
    if isinstance(obj, torch.Tensor):
        return obj.dtype if obj.is_floating_point() else None
    if isinstance(obj, (tuple, list)):
        for o in obj:
            dt = _first_float(o)
            if dt is not None:
                return dt
    return None


def autocast_dtype_table(model: nn.Module, *inputs, device_type: str = "cpu",
                         dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """Run `model(*inputs)` under autocast with forward hooks; one row per module call: name, type, in/out dtype."""
    rows: list[dict] = []

    def hook(mod, args, out, name):
        rows.append({"module": name or "(model)", "type": type(mod).__name__,
                     "in": str(_first_float(args)).replace("torch.", ""),
                     "out": str(_first_float(out)).replace("torch.", "")})

    hooks = [m.register_forward_hook(lambda mod, a, o, n=n: hook(mod, a, o, n)) for n, m in model.named_modules()]
    try:
        with torch.no_grad(), torch.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return rows


def autocast_op_table(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[str, str]]:
    """Op -> (output dtype fed fp32, output dtype fed `dtype`) under autocast: cast down, cast up, or pass through."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 8, generator=g).to(device_type)  # (8, 8) an fp32 weight
    target = torch.zeros(4, dtype=torch.long, device=device_type)
    ops = {
        "matmul": lambda t: t @ w,
        "linear": lambda t: F.linear(t, w),
        "scaled_dot_product_attention": lambda t: F.scaled_dot_product_attention(t[None], t[None], t[None]),
        "gelu": lambda t: F.gelu(t),
        "softmax": lambda t: torch.softmax(t, -1),
        "log_softmax": lambda t: torch.log_softmax(t, -1),
        "layer_norm": lambda t: F.layer_norm(t, (8,)),
        "cross_entropy": lambda t: F.cross_entropy(t, target),
        "mse_loss": lambda t: F.mse_loss(t, t.detach()),
        "sum": lambda t: t.sum(),
        "exp": lambda t: t.exp(),
    }
    x32 = torch.randn(4, 8, generator=g).to(device_type)  # (4, 8)
    x16 = x32.to(dtype)  # the same activation, already 16-bit (the output of a matmul)
    out = {}
    with torch.autocast(device_type, dtype=dtype):
        for name, fn in ops.items():
            out[name] = tuple(str(fn(x).dtype).replace("torch.", "") for x in (x32, x16))
    return out


# ----------------------------------------------------------------------------------------------
# Memory: bytes per parameter of a training setup (ZeRO, Rajbhandari et al. 2020, §3.1)
# ----------------------------------------------------------------------------------------------

# setup -> bytes per parameter of (weights, gradients, fp32 master weights, optimizer states) with Adam
SETUPS: dict[str, dict[str, int]] = {
    "fp32": {"weights": 4, "grads": 4, "master": 0, "optimizer": 8},
    "mixed (16-bit + fp32 master)": {"weights": 2, "grads": 2, "master": 4, "optimizer": 8},
    "mixed, fp32 grads": {"weights": 2, "grads": 4, "master": 4, "optimizer": 8},
    "pure bf16 (no master)": {"weights": 2, "grads": 2, "master": 0, "optimizer": 4},
}


def bytes_per_param(setup: str = "mixed (16-bit + fp32 master)") -> dict[str, int]:
    """Mixed-precision Adam: 2P weights + 2P grads + 4P master + 8P (m, v) = 16P bytes (ZeRO §3.1: 2Ψ+2Ψ+12Ψ)."""
    one_of("setup", setup, SETUPS)
    parts = dict(SETUPS[setup])
    parts["total"] = sum(parts.values())
    return parts


def training_memory_gb(n_params: int, setup: str = "mixed (16-bit + fp32 master)") -> dict[str, float]:
    """Bytes per parameter × P, in GB (1e9 bytes), per part: weights, grads, master, optimizer, total."""
    positive_real("n_params", n_params)
    return {k: v * n_params / 1e9 for k, v in bytes_per_param(setup).items()}


@dataclasses.dataclass(frozen=True)
class SavedBytes:
    total: int
    by_dtype: dict[str, int]


def saved_activation_bytes(model: nn.Module, *inputs, autocast_dtype: torch.dtype | None = None) -> SavedBytes:
    """Bytes autograd saves for backward in one forward (deduplicated by storage, parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, str]] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        fn = t.grad_fn  # autocast's 16-bit copy of a weight is a cast of a leaf: weights, not activations
        weight_copy = fn is not None and type(fn).__name__ == "ToCopyBackward0" and any(
            f is not None and type(f).__name__ == "AccumulateGrad" for f, _ in fn.next_functions)
        if ptr not in params and not weight_copy:
            seen[ptr] = (t.untyped_storage().nbytes(), str(t.dtype).replace("torch.", ""))
        return t

    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        model(*inputs)
    by: dict[str, int] = {}
    for nbytes, dt in seen.values():
        by[dt] = by.get(dt, 0) + nbytes
    return SavedBytes(sum(by.values()), by)


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
