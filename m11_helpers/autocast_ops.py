"""What `torch.amp.autocast` runs in 16 bits, gathered on a real model and op by op (lesson 06).

    autocast_dtype_table(model, idx)       # one row per module call: its input and output dtype
    autocast_op_table("cpu", torch.bfloat16)  # op -> (output dtype fed fp32, fed an already-16-bit tensor)

Autocast casts per op: matmuls and convolutions go down to 16 bits, numerically touchy ops up to
fp32, the rest run in their input's dtype. The lists are per device and change between torch
releases (PyTorch docs, "Automatic Mixed Precision", "Autocast Op Reference"), so the lesson checks
only what every build agrees on (matmul down, losses up) and shows the rest as measured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["autocast_dtype_table", "autocast_op_table"]


def _first_float(obj):
    if isinstance(obj, torch.Tensor):
        return obj.dtype if obj.is_floating_point() else None
    if isinstance(obj, (tuple, list)):
        return next((dt for dt in map(_first_float, obj) if dt is not None), None)
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
