"""The figures several lessons state, each computed once, printed one way, and tagged so lessons cannot disagree.

    say("7b.grad_bytes.autocast")      # prints, and returns:
    # M11-7B gradient bytes one data-parallel step reduces, torch.amp autocast (fp32 params and grads): 27.0 GB  [m11:7b.grad_bytes.autocast]
    say("7b.activations.full", note="lesson 04's planner adds one rebuilt layer")   # a remark before the tag

Every value is computed from the helpers that own it (`m11_helpers.config`, `model_states`,
`activations`), never typed in. `say` prints the canonical line, ending in the tag `[m11:key]`;
tests/test_quantities.py reads every lesson's and solution's checked outputs and fails when a tag is
unknown, when a printed line is not `say(key)`'s current line (a stale output), or when two notebooks
print the same key differently. `QUANTITIES` is the registry, `KEYS` its keys.

Units: GB = 10⁹ bytes, as papers and datasheets count (the ZeRO paper's 120 GB, "13.5 GB of bf16
weights"); GiB = 2³⁰ bytes, what allocators, `nvidia-smi` and `torch.cuda.memory_allocated` report, and
what an "80 GB" HBM stack holds (80 GiB). Memory that must fit on a device is shown in both.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable, Mapping

from m11_helpers.activations import activation_bytes
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.model_states import LAYOUTS, ZERO_STAGES, bytes_per_param, gradient_bytes, model_state_bytes
from m11_helpers.validate import non_negative_real, one_of

__all__ = ["GB", "GiB", "Quantity", "QUANTITIES", "KEYS", "format_gb", "value", "line", "say", "find_tags",
           "check_outputs"]

GB = 10**9
GiB = 2**30
TAG = re.compile(r"\[m11:([A-Za-z0-9_.+\-]+)\]\s*$")


def format_gb(n_bytes: float, *, gib: bool = False) -> str:
    """'27.0 GB' (10⁹ B; 2 decimals below 10 GB), with gib=True '107.8 GB = 100.4 GiB' (2³⁰ B)."""
    non_negative_real("n_bytes", n_bytes)

    def fmt(x: float) -> str:
        return f"{x:.1f}" if x >= 10 else f"{x:.2f}"

    out = f"{fmt(n_bytes / GB)} GB"
    return out + f" = {fmt(n_bytes / GiB)} GiB" if gib else out


@dataclasses.dataclass(frozen=True)
class Quantity:
    """One shared figure: what it is, how to compute it (no arguments), how to show it, where it comes from."""

    label: str
    unit: str  # "bytes" (shown in GB, + GiB when gib), "bytes/param", "params"
    compute: Callable[[], int | dict]
    source: str
    gib: bool = False  # also show GiB: memory that must fit on a device

    def text(self) -> str:
        v = self.compute()
        if self.unit == "bytes":
            return format_gb(v, gib=self.gib)
        if self.unit == "bytes/param":
            parts = " + ".join(str(v[p]) for p in ("weights", "grads", "master", "optimizer"))
            return f"{v['total']} B/param ({parts}: weights + grads + master + Adam)"
        if self.unit == "params":
            return f"{v:,} parameters ({v / 1e9:.2f} B)"
        raise ValueError(f"unit must be one of 'bytes', 'bytes/param', 'params', got {self.unit!r}")  # pragma: no cover


def _psi() -> int:
    return param_count(RUNNING_EXAMPLE)


def _acts(**kw) -> Callable[[], int]:
    return lambda: activation_bytes(RUNNING_EXAMPLE, 1, **kw)["total"]


def _peak(**kw) -> Callable[[], int]:
    def f() -> int:
        a = activation_bytes(RUNNING_EXAMPLE, 1, recompute="full", **kw)
        return a["total"] + a["transient"]
    return f


def _registry() -> dict[str, Quantity]:
    name = "M11-7B"
    q: dict[str, Quantity] = {
        "7b.params": Quantity(f"{name} (Llama-2-7B shape) parameters", "params", _psi,
                              "config.param_count; Touvron et al. 2023, Table 1 (6,738,415,616)"),
        "7b.weights.bf16": Quantity(f"{name} weights in bf16 (2 B/param)", "bytes", lambda: 2 * _psi(),
                                    "2Ψ", gib=True),
    }
    for key, lay in LAYOUTS.items():
        q[f"7b.bytes_per_param.{key}"] = Quantity(
            f"{name} model states per parameter, {lay.title}", "bytes/param",
            lambda k=key: bytes_per_param(k), lay.source)
        q[f"7b.model_states.{key}"] = Quantity(
            f"{name} model states, {lay.title}, one replica (DDP)", "bytes",
            lambda k=key: model_state_bytes(_psi(), k)["total"], lay.source, gib=True)
        for stage in (1, 2, 3):
            q[f"7b.model_states.{key}.zero{stage}.n8"] = Quantity(
                f"{name} model states per GPU, {lay.title}, {ZERO_STAGES[stage]} on 8 GPUs", "bytes",
                lambda k=key, s=stage: model_state_bytes(_psi(), k, 8, s)["total"],
                f"{lay.source}; Rajbhandari et al. 2020 (ZeRO), §5.1", gib=True)
        q[f"7b.grad_bytes.{key}"] = Quantity(
            f"{name} gradient bytes one data-parallel step reduces, {lay.title}", "bytes",
            lambda k=key: gradient_bytes(_psi(), k), f"Ψ × {lay.grad_reduce_bytes} B; {lay.source}")
    where = f"{name} activations, micro-batch 1 × 4096 tokens, bf16, 32 layers + output layer"
    korthikanti = "activations.activation_bytes; Korthikanti et al. 2022, §4"
    q.update({
        "7b.activations.none": Quantity(f"{where}, no recomputation, no flash", "bytes", _acts(), korthikanti,
                                        gib=True),
        "7b.activations.none.flash": Quantity(f"{where}, no recomputation, flash attention", "bytes",
                                              _acts(flash=True), korthikanti + "; Dao et al. 2022", gib=True),
        "7b.activations.selective": Quantity(f"{where}, selective recomputation (s² terms)", "bytes",
                                             _acts(recompute="selective"), korthikanti + ".2", gib=True),
        "7b.activations.full": Quantity(f"{where}, full recomputation (each layer's input kept)", "bytes",
                                        _acts(recompute="full"), korthikanti + ".3", gib=True),
        "7b.activations.full.peak": Quantity(
            f"{where}, full recomputation, peak in backward (+ one layer rebuilt, no flash)", "bytes",
            _peak(), korthikanti + ".3", gib=True),
        "7b.activations.full.peak.flash": Quantity(
            f"{where}, full recomputation, peak in backward (+ one layer rebuilt, flash)", "bytes",
            _peak(flash=True), korthikanti + ".3; Dao et al. 2022", gib=True),
        "7b.autocast_weight_copies": Quantity(
            f"{name} bf16 weight copies torch.amp autocast saves for backward (every matmul weight)", "bytes",
            lambda: activation_bytes(RUNNING_EXAMPLE, 1, autocast=True)["weight_copies"],
            "activations.activation_bytes(autocast=True); PyTorch AMP docs (autocast's cast cache)", gib=True),
    })
    return q


QUANTITIES: dict[str, Quantity] = _registry()
KEYS: tuple[str, ...] = tuple(QUANTITIES)


def value(key: str) -> int | dict:
    """The quantity's value, computed now from its helper."""
    return QUANTITIES[one_of("key", key, KEYS)].compute()


def line(key: str, *, note: str = "") -> str:
    """'<label>: <value>[  (<note>)]  [m11:key]' — the canonical line `say` prints."""
    q = QUANTITIES[one_of("key", key, KEYS)]
    return f"{q.label}: {q.text()}" + (f"  ({note})" if note else "") + f"  [m11:{key}]"


def say(key: str, **fmt: str) -> str:
    """Print the canonical line of `key` (fmt: note="..." adds a remark before the tag) and return it."""
    for k in fmt:
        one_of("fmt keyword", k, ("note",))
    out = line(key, **fmt)
    print(out)
    return out


def find_tags(text: str) -> list[tuple[str, str]]:
    """(key, line) for every line of `text` that ends in an [m11:key] tag."""
    out = []
    for raw in text.splitlines():
        m = TAG.search(raw)
        if m:
            out.append((m.group(1), raw.strip()))
    return out


def check_outputs(outputs: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[str]:
    """Problems in tagged lines of {source name: output text}: unknown keys, stale values, disagreements."""
    items = outputs.items() if isinstance(outputs, Mapping) else outputs
    problems, seen = [], {}  # seen: key -> (value text, where)
    for where, text in items:
        for key, printed in find_tags(text):
            if key not in QUANTITIES:
                problems.append(f"{where}: unknown quantity [m11:{key}] (quantities.KEYS lists the known ones)")
                continue
            q = QUANTITIES[key]
            head = f"{q.label}: "
            shown = printed[len(head):].split("  ")[0] if printed.startswith(head) else printed
            if not printed.startswith(head) or shown != q.text():
                problems.append(f"{where}: [m11:{key}] printed {printed!r}, say() now prints {line(key)!r} "
                                "(stale output: re-run the cell)")
            if key in seen and seen[key][0] != shown:
                problems.append(f"[m11:{key}]: {seen[key][1]} prints {seen[key][0]!r}, {where} prints {shown!r}")
            seen.setdefault(key, (shown, where))
    return problems
