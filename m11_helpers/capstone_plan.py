"""The capstone's plan for the reference script on CPU ranks: bytes per rank and elements moved per step, exact.

    flags = Flags(parallel="fsdp2", bf16=True, ac=True, accum=2)      # scripts/train.py's levers
    p = plan_run(flags, world_size=2, batch=16)      # the tiny GPT: p["parameters"], p["gradients"],
    p["optimizer"], p["activations"], p["total"], p["comm_elements"], p["bytes_sent"]   # per rank, per step
    flags.argv()                                     # ['--parallel', 'fsdp2', '--bf16', '--ac', '--accum', '2']

Model states are counted from the parameter shapes, with the bytes per element of the memory layout
each flag gives (`model_states.LAYOUTS`): DDP in fp32 "fp32", DDP with --bf16 (torch.amp autocast)
"autocast", FSDP2 "fsdp2-mp" (fp32 shards whether or not it computes in bf16). FSDP2 keeps each
parameter's dim-0 chunk (torch.chunk: ⌈d₀/N⌉ rows, the last ones shorter; Zhao et al. 2023, "PyTorch
FSDP", §3; ZeRO-3, Rajbhandari et al. 2020, §5) and so the gradients and AdamW moments of that chunk;
AdamW adds one 4-byte `step` per parameter tensor. Activations are `activations.activation_bytes` for
one micro-batch (B / (N·K) sequences) with the script's SDPA attention (flash=True): fp32, 16-bit
(FSDP2's MixedPrecisionPolicy), autocast (DDP --bf16), full recomputation (--ac). One eager-CPU fact
on top (`cpu_bf16_norm_stats`): a bf16 LayerNorm on a CPU keeps its mean and rstd in bf16, not fp32.
Measured equal, byte for byte, on real ranks (tests/test_capstone.py). Lesson 11.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import torch

from m11_helpers.activations import activation_bytes
from m11_helpers.comm_model import bus_factor
from m11_helpers.config import TINY_GPT, TransformerConfig
from m11_helpers.model_states import bytes_per_param
from m11_helpers.validate import one_of, positive_int

__all__ = ["PARALLEL", "ACCUM", "Flags", "FLAG_GRID", "param_shapes", "fsdp_local_numel", "rank_model_states",
           "fsdp_units", "comm_elements", "cpu_bf16_norm_stats", "plan_run", "layout_of"]

PARALLEL = ("ddp", "fsdp2")
ACCUM = (1, 2, 4)  # the accumulation steps the grid (and exercise 11.3) considers
STEP_BYTES = 4  # AdamW's `step`: one fp32 scalar per parameter tensor


@dataclasses.dataclass(frozen=True)
class Flags:
    """The reference script's memory levers: --parallel, --bf16, --ac, --accum."""

    parallel: str = "ddp"
    bf16: bool = False
    ac: bool = False
    accum: int = 1

    def __post_init__(self) -> None:
        one_of("parallel", self.parallel, PARALLEL)
        one_of("bf16", self.bf16, (False, True))
        one_of("ac", self.ac, (False, True))
        positive_int("accum", self.accum)

    def argv(self) -> list[str]:
        """The command-line flags of scripts/train.py for these levers."""
        return (["--parallel", self.parallel] + (["--bf16"] if self.bf16 else []) + (["--ac"] if self.ac else [])
                + ["--accum", str(self.accum)])

    @property
    def levers(self) -> int:
        """How many levers are on: FSDP2, bf16, recomputation, accumulation (K > 1) count one each."""
        return (self.parallel == "fsdp2") + self.bf16 + self.ac + (self.accum > 1)

    def __str__(self) -> str:
        on = [self.parallel.upper()] + (["bf16"] if self.bf16 else []) + (["AC"] if self.ac else [])
        return " + ".join(on + ([f"accum {self.accum}"] if self.accum > 1 else []))


FLAG_GRID = tuple(Flags(p, b, a, k) for p, b, a, k in itertools.product(PARALLEL, (False, True), (False, True), ACCUM))


def layout_of(flags: Flags) -> str:
    """The `model_states` layout the script trains in under `flags`."""
    if flags.parallel == "fsdp2":
        return "fsdp2-mp"  # fp32 shards; --bf16 only changes the gathered compute copy
    return "autocast" if flags.bf16 else "fp32"


@functools.cache
def param_shapes(cfg: TransformerConfig = TINY_GPT) -> tuple[tuple[int, ...], ...]:
    """Shapes of the tiny GPT's distinct parameters (a tied one once), built on the meta device: no memory."""
    blocks, root = fsdp_units(cfg)
    return blocks + root


def fsdp_local_numel(shape: tuple[int, ...], world_size: int, rank: int) -> int:
    """Elements of `shape` that FSDP2's Shard(0) puts on `rank`: rows min(c, max(0, d₀ − r·c)), c = ⌈d₀/N⌉."""
    positive_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
    rows, rest = shape[0], math.prod(shape[1:])
    chunk = math.ceil(rows / world_size)
    return min(chunk, max(0, rows - rank * chunk)) * rest


def rank_model_states(shapes: list[tuple[int, ...]], world_size: int, flags: Flags, rank: int = 0) -> dict:
    """Bytes on `rank`: weights·Ψ_r, grads·Ψ_r, (master + Adam)·Ψ_r + 4·tensors (Ψ_r: all of Ψ for DDP, the FSDP2 chunk)."""
    positive_int("world_size", world_size)
    if flags.parallel == "ddp":
        local = sum(math.prod(s) for s in shapes)
    else:
        local = sum(fsdp_local_numel(s, world_size, rank) for s in shapes)
    b = bytes_per_param(layout_of(flags))
    return {"parameters": b["weights"] * local, "gradients": b["grads"] * local,
            "optimizer": (b["master"] + b["optimizer"]) * local + STEP_BYTES * len(shapes), "local_params": local}


@functools.cache
def fsdp_units(cfg: TransformerConfig = TINY_GPT) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(shapes in the blocks, shapes of the root): the script shards each block, then the root (the rest).

    From the tiny GPT built on the meta device (no memory); parameters() yields a tied tensor once."""
    from m11_helpers.models import TinyGPT

    with torch.device("meta"):
        model = TinyGPT(cfg)
    inner = {id(p) for b in model.blocks for p in b.parameters()}
    blocks = tuple(tuple(p.shape) for p in model.parameters() if id(p) in inner)
    return blocks, tuple(tuple(p.shape) for p in model.parameters() if id(p) not in inner)


def comm_elements(flags: Flags, world_size: int, cfg: TransformerConfig = TINY_GPT) -> dict:
    """Elements per optimizer step, each collective's full tensor (ZeRO §7.2–7.3; the FSDP2 docs).

    DDP all-reduces Ψ once per step (no_sync on the first K−1 micro-batches). FSDP2 all-gathers each
    block in every micro-batch's forward and again in its backward, the root (embeddings, final norm)
    once per micro-batch — FSDP2 keeps the root unsharded from its forward to its backward
    (fully_shard docs, reshard_after_forward) — and reduce-scatters Ψ once, on the last micro-batch
    (set_requires_gradient_sync). FSDP2 pads d₀ to N·⌈d₀/N⌉: Ψ counted with the padding.
    """
    n = positive_int("world_size", world_size)
    blocks, root = fsdp_units(cfg)
    if flags.parallel == "ddp":
        psi = sum(math.prod(s) for s in blocks + root)
        return {"all_reduce": psi, "all_gather": 0, "reduce_scatter": 0, "total": psi}

    def padded(shapes):
        return sum(n * math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)

    gather = flags.accum * (2 * padded(blocks) + padded(root))
    scatter = padded(blocks) + padded(root)
    return {"all_reduce": 0, "all_gather": gather, "reduce_scatter": scatter, "total": gather + scatter}


def cpu_bf16_norm_stats(cfg: TransformerConfig, micro_batch: int, *, ac: bool = False) -> int:
    """Bytes a CPU saves LESS than `activation_bytes` for a pure-bf16 LayerNorm model: mean and rstd in 2 bytes, not 4.

    Eager CPU `native_layer_norm` returns its statistics in the input's dtype; CUDA's are fp32 (the model's
    assumption). Per token: 2 statistics × 2 bytes per norm, two norms per layer (unless recomputed) + the final one.
    """
    if cfg.norm != "layernorm":
        raise ValueError(f"cfg.norm must be 'layernorm' (RMSNorm keeps one statistic), got {cfg.norm!r}")
    norms = (0 if ac else 2 * cfg.layers) + 1
    return norms * 2 * 2 * positive_int("micro_batch", micro_batch) * cfg.seq_len


def plan_run(flags: Flags, world_size: int, batch: int = 16, *, cfg: TransformerConfig = TINY_GPT, rank: int = 0,
             device: str = "cpu") -> dict:
    """The plan for `scripts/train.py` with `flags` on `world_size` ranks and a global batch of `batch` sequences.

    Bytes on `rank`: model states, activations of ONE micro-batch (what autograd keeps between its forward
    and backward), their sum "total"; per step: elements communicated and bytes this rank sends (ring:
    all-reduce 2(N−1)/N of the tensor, all-gather and reduce-scatter (N−1)/N; nccl-tests' bus factors).
    """
    n, b = positive_int("world_size", world_size), positive_int("batch", batch)
    one_of("device", device, ("cpu", "cuda"))
    if b % (n * flags.accum):
        raise ValueError(f"batch must be divisible by world_size × accum = {n * flags.accum}, got {b}")
    micro = b // (n * flags.accum)
    shapes = param_shapes(cfg)
    states = rank_model_states(shapes, n, flags, rank)
    ddp_autocast = flags.bf16 and flags.parallel == "ddp"
    acts = activation_bytes(cfg, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=ddp_autocast,
                            recompute="full" if flags.ac else "none")["total"]
    if device == "cpu" and flags.bf16 and not ddp_autocast:
        acts -= cpu_bf16_norm_stats(cfg, micro, ac=flags.ac)
    comm = comm_elements(flags, n, cfg)
    lay = bytes_per_param(layout_of(flags))
    gather_bytes = 2 if flags.bf16 else 4  # FSDP2 gathers the compute dtype, reduces in fp32 (reduce_dtype)
    sent = (bus_factor("all_reduce", n) * comm["all_reduce"] * lay["grads"]
            + bus_factor("all_gather", n) * comm["all_gather"] * gather_bytes
            + bus_factor("reduce_scatter", n) * comm["reduce_scatter"] * 4)
    out = {"flags": flags, "world_size": n, "batch": b, "micro_batch": micro, "num_params": sum(map(math.prod, shapes)),
           **states, "activations": acts, "comm_elements": comm["total"], "bytes_sent": sent}
    out["states"] = out["parameters"] + out["gradients"] + out["optimizer"]
    out["total"] = out["states"] + acts
    return out
