"""Mixed-precision training as frameworks do it: what autocast runs in 16 bits, where the bytes go (lesson 06).

    autocast_dtype_table(model, idx)                  # which modules autocast runs in 16 bits
    opt = MasterWeightsAdamW(bf16_model.parameters())  # the Megatron-LM / DeepSpeed layout: fp32 master copy
    held_state_bytes(model, opt)                      # weights, grads, master, optimizer bytes, measured
    precision_run("pure-bf16")                        # the same training with the weights stored four ways

Two layouts cost the same 16 bytes per parameter (`m11_helpers.model_states` owns the figures):
`torch.amp.autocast` keeps fp32 parameters and fp32 gradients (4 + 4 + 8 for AdamW's two moments)
and casts each weight to 16 bits per op; Megatron-LM and DeepSpeed keep 16-bit parameters and
gradients next to an fp32 master copy (2 + 2 + 4 + 8: Rajbhandari et al. 2020, "ZeRO", §3.1).
Micikevicius et al. 2018, "Mixed Precision Training", §3.1: the master copy exists because a small
update added to a 16-bit weight rounds away. Activations: `m11_helpers.activations` (autocast=True)
and `m11_helpers.memory.track_saved_tensors`. Speed: `benchmarks/bf16_speed.py`.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["autocast_dtype_table", "autocast_op_table", "MasterWeightsAdamW", "held_state_bytes",
           "autocast_weight_copy_bytes", "MODES", "precision_run", "speed_cases", "cpu_16bit_support"]


# ----------------------------------------------------------------------------------------------
# What autocast does, gathered on a real model
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# The Megatron-LM / DeepSpeed layout: 16-bit parameters, an fp32 master copy (Micikevicius et al. §3.1)
# ----------------------------------------------------------------------------------------------


class MasterWeightsAdamW:
    """AdamW for a 16-bit model: the update happens on an fp32 master copy, then is rounded into the model.

    Per parameter: 2 B model weight + 2 B gradient (backward writes 16-bit grads) + 4 B master +
    8 B AdamW moments (fp32, on the master) = 16 B, ZeRO §3.1's 2Ψ + 2Ψ + 12Ψ.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.params = list(params)  # the model's 16-bit parameters: forward and backward read these
        self.master = [p.detach().float().clone() for p in self.params]  # fp32 copies the optimizer updates
        self.optimizer = torch.optim.AdamW(self.master, lr=positive_real("lr", lr), betas=betas, eps=eps,
                                           weight_decay=weight_decay)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()  # the 16-bit gradient, widened for the update
        self.optimizer.step()  # exp_avg, exp_avg_sq and the update itself, all fp32
        for p, m in zip(self.params, self.master):
            m.grad = None  # the fp32 gradient copy lives only for the step
            p.copy_(m)  # round the master to the model's dtype: small updates accumulate in the master


# ----------------------------------------------------------------------------------------------
# Memory: the bytes each part of a training setup really holds
# ----------------------------------------------------------------------------------------------


def _key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _optimizer_tensors(obj, found: list, seen: set) -> None:
    """(tensor, "state" | "copy") for every tensor reachable from `obj`'s attributes, containers and optimizers."""
    if id(obj) in seen or isinstance(obj, (nn.Module, type, str, bytes, int, float)) or callable(obj) and not \
            isinstance(obj, torch.optim.Optimizer):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found.append((obj, "copy"))
        if obj.grad is not None:
            found.append((obj.grad, "copy"))
    elif isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():  # exp_avg, exp_avg_sq, step: the optimizer's own memory
            found.extend((t, "state") for t in state.values() if isinstance(t, torch.Tensor))
        _optimizer_tensors(obj.param_groups, found, seen)
    elif isinstance(obj, dict):
        for v in obj.values():
            _optimizer_tensors(v, found, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _optimizer_tensors(v, found, seen)
    elif hasattr(obj, "__dict__"):
        _optimizer_tensors(vars(obj), found, seen)


def held_state_bytes(model: nn.Module, optimizer) -> dict[str, int]:
    """Bytes held now, by part: weights (model parameters), grads (their .grad), master (other tensors the
    optimizer keeps: weight copies and their grads), optimizer (its state), other (AdamW's 0-dim step counters).

    Measured from the tensors, each storage counted once: compare with `model_states.bytes_per_param`.
    """
    out = dict.fromkeys(("weights", "grads", "master", "optimizer", "other"), 0)
    seen: set = set()

    def add(part: str, t: torch.Tensor) -> None:
        if _key(t) not in seen:
            seen.add(_key(t))
            out[part] += t.untyped_storage().nbytes()

    params = list(model.parameters())
    for p in params:
        add("weights", p)
    for p in params:
        if p.grad is not None:
            add("grads", p.grad)
    found: list = []
    _optimizer_tensors(optimizer, found, set())
    for t, where in found:
        add("other" if t.dim() == 0 else "optimizer" if where == "state" else "master", t)
    out["total"] = sum(out[p] for p in ("weights", "grads", "master", "optimizer"))
    return out


def autocast_weight_copy_bytes(model: nn.Module, *inputs, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the 16-bit weight copies autocast saves for backward in one forward of `model(*inputs)`."""
    copies: dict = {}

    def pack(t: torch.Tensor):
        base = t if t._base is None else t._base  # matmuls save a transposed view of the copy
        fn = base.grad_fn  # a cast of a leaf (a parameter) is a weight copy, not an activation
        if fn is not None and type(fn).__name__ == "ToCopyBackward0" and any(
                f is not None and type(f).__name__ == "AccumulateGrad" for f, _ in fn.next_functions):
            copies[_key(t)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=dtype):
        model(*inputs)
    return sum(copies.values())


# ----------------------------------------------------------------------------------------------
# The same training, with the weights stored four ways
# ----------------------------------------------------------------------------------------------

MODES = {
    "fp32": "fp32 weights, fp32 AdamW",
    "autocast": "torch.amp autocast bf16: fp32 weights are the master",
    "deepspeed": "bf16 weights and grads + fp32 master copy (DeepSpeed, Megatron-LM): MasterWeightsAdamW",
    "pure-bf16": "bf16 weights, bf16 AdamW, no master",
}


def precision_run(mode: str, steps: int = 120, lr: float = 3e-4, every: int = 5, seed: int = 0) -> dict:
    """AdamW on the course MLP with the weights stored as `mode` says (MODES); the full-data loss every `every`
    steps and, per step, the fraction of stored weight entries the update left unchanged (rounded away)."""
    from m11_helpers.data import regression
    from m11_helpers.models import mlp

    one_of("mode", mode, MODES)
    positive_int("steps", steps)
    x_all, y_all = regression(256).tensors  # (256, 16), (256, 4)
    model = mlp(seed=seed)
    if mode in ("deepspeed", "pure-bf16"):
        model = model.to(torch.bfloat16)
    dt = next(model.parameters()).dtype
    opt = (MasterWeightsAdamW if mode == "deepspeed" else torch.optim.AdamW)(model.parameters(), lr=lr,
                                                                          weight_decay=0.0)
    stored = opt.master if mode == "deepspeed" else list(model.parameters())  # what the update is added to
    losses, unchanged = [], []
    for step in range(steps):
        i = torch.arange(step * 32, step * 32 + 32) % 256  # (32,) a fixed batch order
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            loss = F.mse_loss(model(x_all[i].to(dt)).float(), y_all[i])
        opt.zero_grad()
        loss.backward()
        before = [t.detach().clone() for t in stored]
        opt.step()
        same = sum((t == b).sum().item() for t, b in zip(stored, before))
        unchanged.append(same / sum(t.numel() for t in stored))
        if step % every == 0 or step == steps - 1:
            with torch.no_grad():
                losses.append((step, F.mse_loss(model(x_all.to(dt)).float(), y_all).item()))
    return {"loss": losses, "unchanged": sum(unchanged) / len(unchanged)}


# ----------------------------------------------------------------------------------------------
# Speed: what 16 bits buys on this machine (benchmarks/bf16_speed.py measures more sizes)
# ----------------------------------------------------------------------------------------------


def speed_cases(device: str = "cpu", matmul_size: int = 1024) -> dict[str, dict[str, Callable[[], None]]]:
    """{case: {precision: fn}}: one forward+backward of the tiny GPT (batch 16) and of an n×n matmul, per precision."""
    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    n = positive_int("matmul_size", matmul_size)
    x, y = (t.to(device) for t in tokens(16).tensors)  # (16, 32) each
    model = tiny_gpt(0).to(device)

    def gpt_step(dtype):
        def step():
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(x, y)
            loss.backward()
        return step

    def matmul(dtype):
        a = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)  # (n, n)
        b = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)  # (n, n)
        return lambda: (a @ b).float().sum().backward()

    precisions = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    return {"tiny GPT fwd+bwd (autocast, batch 16)": {k: gpt_step(v) for k, v in precisions.items()},
            f"{n}x{n} matmul fwd+bwd": {k: matmul(v) for k, v in precisions.items()}}


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
