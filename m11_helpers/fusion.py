"""Kernel fusion: the same LayerNorm → bias → GELU chain as many kernels or as one, and the bytes each moves
(lesson 09).

    ln_bias_gelu_unfused(x, w, b, bias)    # one PyTorch op per arithmetic step: 19 kernels
    ln_bias_gelu_library(x, w, b, bias)    # F.layer_norm + add + F.gelu: 3 library kernels
    graph = kernel_graph(fn, x, w, b, bias, names=("x", "w", "b", "bias"))   # every kernel: reads, writes
    group_traffic(graph, [[0, 1, 2], [3, 4]])   # bytes moved when each group runs as one fused kernel
    traffic_bytes(fn, x, w, b, bias)       # every kernel on its own (eager PyTorch)
    fused_traffic_bytes(x, w, b, bias)     # one fused kernel: read inputs once, write the output once
    compiled, why = try_compile(fn)        # torch.compile, or None and the reason (no C++ compiler…)

Why fusion helps: an element-wise op does one or two FLOPs per element it loads, far below any
chip's FLOP/byte ridge (lesson 01), so its time is memory traffic. Each separate kernel writes its
result to memory and the next reads it back; a fused kernel keeps intermediates in registers. The
traffic model counts, for each kernel, the bytes of the distinct tensors it reads plus those it
writes — what a kernel must move when nothing stays in a cache between kernels (true of a GPU's HBM
for tensors larger than its L2; a CPU's caches hide part of it). Views move nothing.
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
           "KernelCall", "Kernel", "KernelGraph", "kernel_graph", "group_traffic", "kernel_traffic",
           "traffic_bytes", "fused_traffic_bytes", "try_compile", "time_fn", "chain_inputs"]


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
    read: int  # bytes of the distinct tensors the op reads
    written: int  # bytes of its tensor outputs


@dataclass(frozen=True)
class Kernel:
    """One ATen op run eagerly: the names of the distinct tensors it reads and of those it produces."""

    op: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


@dataclass(frozen=True)
class KernelGraph:
    """A function run op by op: its kernels in order, every tensor's bytes, and which tensors are its inputs/outputs."""

    kernels: tuple[Kernel, ...]
    nbytes: dict[str, int]  # tensor name -> bytes
    inputs: tuple[str, ...]  # the function's arguments ("x", "w", …)
    outputs: tuple[str, ...]  # the tensors it returns


class _Recorder(TorchDispatchMode):
    """Names every tensor (inputs by their given names, results t1, t2, …); views and in-place results keep
    the name of the tensor they alias. Holds every tensor so no id is reused while recording."""

    def __init__(self, named: dict[int, str]):
        super().__init__()
        self.names, self.keep, self.kernels, self.nbytes = dict(named), [], [], {}
        self.made = 0

    def name(self, t: torch.Tensor) -> str:
        if id(t) not in self.names:
            self.made += 1
            self.names[id(t)] = f"t{self.made}"
            self.keep.append(t)
        self.nbytes.setdefault(self.names[id(t)], t.numel() * t.element_size())
        return self.names[id(t)]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = lambda tree: [t for t in torch.utils._pytree.tree_leaves(tree)
                                if isinstance(t, torch.Tensor) and t.dim() > 0]  # 0-d: scalars ride along
        ins, outs = tensors((args, kwargs)), tensors(out)
        if func.is_view or func.__name__.startswith(("detach", "alias", "lift_fresh")):
            for o in outs:  # a view moves no bytes: it is another name for its base's memory
                self.names[id(o)] = self.name(ins[0])
                self.keep.append(o)
            return out
        reads = tuple(dict.fromkeys(self.name(t) for t in ins))  # distinct: x * x reads x once
        writes = []
        for o in outs:
            same = next((t for t in ins if t is o), None)  # in-place: the result is its input
            writes.append(self.name(same) if same is not None else self.name(o))
        self.kernels.append(Kernel(str(func.__name__), reads, tuple(writes)))
        return out


def kernel_graph(fn, *inputs: torch.Tensor, names: tuple[str, ...] | None = None) -> KernelGraph:
    """Run fn(*inputs) eagerly under no_grad and record every ATen kernel with what it reads and writes."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    names = tuple(names) if names is not None else tuple(f"in{i}" for i in range(len(inputs)))
    if len(names) != len(inputs):
        raise ValueError(f"names must give one name per input ({len(inputs)}), got {len(names)}")
    rec = _Recorder({id(t): n for t, n in zip(inputs, names)})
    for t in inputs:
        rec.name(t)
    with torch.no_grad(), rec:
        out = fn(*inputs)
    outs = tuple(rec.name(t) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
    return KernelGraph(tuple(rec.kernels), dict(rec.nbytes), names, outs)


def _check_groups(graph: KernelGraph, groups) -> list[list[int]]:
    groups = [list(g) for g in groups]
    if [i for g in groups for i in g] != list(range(len(graph.kernels))) or not all(groups):
        raise ValueError(f"groups must split kernels 0..{len(graph.kernels) - 1} into non-empty runs, in order, "
                         f"each kernel once; got {groups}")
    return groups


def group_traffic(graph: KernelGraph, groups) -> int:
    """Bytes moved when each group of consecutive kernels runs as ONE fused kernel.

    A group reads, once, every tensor its kernels read that it did not produce itself; it writes every
    tensor it produces except one read (and read only) by its own kernels that the function does not
    return — that one stays in registers. Every kernel alone: the eager traffic; all in one: the minimum.
    """
    groups = _check_groups(graph, groups)
    where = {k: gi for gi, g in enumerate(groups) for k in g}
    readers: dict[str, set[int]] = {}
    for k, kern in enumerate(graph.kernels):
        for n in kern.reads:
            readers.setdefault(n, set()).add(where[k])
    total = 0
    for gi, g in enumerate(groups):
        made = {n for k in g for n in graph.kernels[k].writes}
        reads = {n for k in g for n in graph.kernels[k].reads if n not in made}
        kept = {n for n in made if readers.get(n) == {gi} and n not in graph.outputs}
        total += sum(graph.nbytes[n] for n in reads) + sum(graph.nbytes[n] for n in made - kept)
    return total


def kernel_traffic(fn, *inputs) -> list[KernelCall]:
    """Run fn(*inputs) eagerly and list every ATen kernel with the bytes it read (distinct tensors) and wrote."""
    g = kernel_graph(fn, *inputs)
    return [KernelCall(k.op, sum(g.nbytes[n] for n in k.reads), sum(g.nbytes[n] for n in k.writes))
            for k in g.kernels]


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
