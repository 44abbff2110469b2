"""Kernel fusion: the same LayerNorm → bias → GELU chain as many kernels or as one, and the bytes each moves.

    ln_bias_gelu_unfused(x, w, b, bias)    # one PyTorch op per arithmetic step: ~17 kernels
    ln_bias_gelu_library(x, w, b, bias)    # F.layer_norm + add + F.gelu: 3 library kernels
    traffic = kernel_traffic(fn, x, w, b, bias)   # every aten op run, with bytes read and written
    fused_traffic_bytes(x, w, b, bias)     # one fused kernel: read inputs once, write the output once
    compiled, why = try_compile(fn)        # torch.compile, or None and the reason (no C++ compiler…)

Why fusion helps: an element-wise op does one or two FLOPs per element it loads, far below any
chip's FLOP/byte ridge (lesson 01), so its time is memory traffic. Each separate kernel writes its
result to memory and the next reads it back; a fused kernel keeps intermediates in registers. The
traffic model counts, for each op, the bytes of its tensor inputs plus outputs — an upper bound
that ignores caches (real on a GPU's HBM for tensors larger than L2; a CPU's caches hide part of it).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from m11_helpers.timing import time_it
from m11_helpers.validate import positive_int

__all__ = ["layernorm_unfused", "gelu_tanh_unfused", "ln_bias_gelu_unfused", "ln_bias_gelu_library",
           "KernelCall", "kernel_traffic", "traffic_bytes", "fused_traffic_bytes", "try_compile",
           "time_fn", "chain_inputs"]


def layernorm_unfused(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """(x − μ)/√(σ² + ε)·w + b, one op per step (Ba et al. 2016), as a textbook would write it."""
    mu = x.mean(dim=-1, keepdim=True)  # (N, 1)
    xc = x - mu  # (N, C)
    var = (xc * xc).mean(dim=-1, keepdim=True)  # (N, 1)
    return xc * torch.rsqrt(var + eps) * w + b  # (N, C)


def gelu_tanh_unfused(x: torch.Tensor) -> torch.Tensor:
    """½x(1 + tanh(√(2/π)(x + 0.044715x³))) (Hendrycks & Gimpel 2016, eq. for the tanh approximation)."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


def ln_bias_gelu_unfused(x, w, b, bias):
    """GELU(LayerNorm(x) + bias), every step its own kernel."""
    return gelu_tanh_unfused(layernorm_unfused(x, w, b) + bias)


def ln_bias_gelu_library(x, w, b, bias):
    """The same chain from PyTorch's library kernels: LayerNorm and GELU are each already one kernel."""
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b) + bias, approximate="tanh")


def chain_inputs(rows: int = 4096, cols: int = 1024, dtype=torch.float32, seed: int = 0):
    """x (rows, cols) and the LayerNorm weight, bias and the extra bias (cols,), seeded."""
    positive_int("rows", rows)
    positive_int("cols", cols)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g).to(dtype)  # (N, C)
    w, b, bias = (torch.randn(cols, generator=g).to(dtype) for _ in range(3))  # 3 × (C,)
    return x, w, b, bias


@dataclass(frozen=True)
class KernelCall:
    op: str
    read: int  # bytes of the op's tensor inputs
    written: int  # bytes of its tensor outputs


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[KernelCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat_in = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        flat_out = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts if t.dim() > 0)  # 0-d: scalars
        if not func.__name__.startswith(("view", "_unsafe_view", "detach", "alias", "expand", "t.")):
            self.calls.append(KernelCall(str(func.__name__), nbytes(flat_in), nbytes(flat_out)))
        return out


def kernel_traffic(fn, *inputs) -> list[KernelCall]:
    """Run fn(*inputs) eagerly and record every aten op it dispatched with the bytes it read and wrote."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    rec = _Recorder()
    with torch.no_grad(), rec:
        fn(*inputs)
    return rec.calls


def traffic_bytes(fn, *inputs) -> int:
    """Σ over kernels of (bytes read + bytes written): the memory traffic of running fn op by op."""
    return sum(c.read + c.written for c in kernel_traffic(fn, *inputs))


def fused_traffic_bytes(*tensors: torch.Tensor, outputs: int = 1) -> int:
    """Σ inputs + `outputs` × the first input's bytes: one kernel reads everything once, writes once."""
    if not tensors:
        raise ValueError("tensors must name at least one input")
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return nbytes + outputs * tensors[0].numel() * tensors[0].element_size()


def try_compile(fn):
    """(torch.compile(fn), "") when Inductor can build kernels here (it needs a C++ compiler on CPU),
    else (None, reason). The first call is what compiles: time it separately."""
    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx[-1] if isinstance(inductor_config.cpp.cxx, tuple) else inductor_config.cpp.cxx
    if not torch.cuda.is_available() and shutil.which(cxx or "g++") is None and shutil.which("g++") is None:
        return None, "no C++ compiler found: TorchInductor cannot build CPU kernels on this machine"
    try:
        return torch.compile(fn), ""
    except Exception as exc:  # pragma: no cover - depends on the machine
        return None, f"torch.compile failed: {type(exc).__name__}: {exc}"


def time_fn(fn, *inputs, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of fn(*inputs) over `repeats` runs after `warmup`, under no_grad, synchronising a GPU
    (`m11_helpers.timing.time_it` with the inputs bound)."""
    on_gpu = bool(inputs) and isinstance(inputs[0], torch.Tensor) and inputs[0].is_cuda
    with torch.no_grad():
        return time_it(lambda: fn(*inputs), repeats=repeats, warmup=warmup,
                       sync=torch.cuda.synchronize if on_gpu else None).median
