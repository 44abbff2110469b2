"""The capstone's plan: memory, communication and time per rank for a config, before anything runs.

    p = predict_run(TINY_GPT, world_size=4, micro_batch=2, parallel="fsdp2")   # bytes per rank, elements moved
    p["parameters"], p["optimizer"], p["activations"], p["comm_elements"]
    predict_gpu_run(RUNNING_EXAMPLE, gpus=8, parallel="fsdp2", bf16=True, checkpointing=True)  # GB and seconds on H100s

Model states are counted exactly, from the parameter shapes: DDP keeps every parameter, its fp32
gradient and AdamW's two fp32 moments on every rank (4 + 4 + 8 bytes per parameter, plus one 4-byte
`step` per tensor); FSDP2 (`fully_shard`) keeps each parameter's dim-0 chunk (torch.chunk: chunks of
⌈d₀/N⌉ rows, the last ones shorter) and so the gradients and moments of that chunk (Zhao et al. 2023,
"PyTorch FSDP", §3; ZeRO-3, Rajbhandari et al. 2020, §5). Activations of the tiny GPT are counted
term by term from what each op saves for backward (`tiny_gpt_activation_bytes`); for the 7B-style
model the planner uses Korthikanti et al. 2022 (§4) via `zero.activation_bytes`. Lesson 11.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from m11_helpers.config import TransformerConfig, param_count
from m11_helpers.hardware_specs import chip
from m11_helpers.memory import SavedTensors
from m11_helpers.validate import fraction, one_of, positive_int, positive_real
from m11_helpers.zero import activation_bytes as korthikanti_activation_bytes

__all__ = ["PARALLEL", "LEVERS", "param_shapes", "fsdp_local_numel", "model_state_bytes", "tiny_gpt_activation_bytes",
           "comm_elements", "predict_run", "track_activations", "checkpoint_blocks", "local_bytes", "resume_drill", "step_seconds", "predict_gpu_run", "lever_rows", "compare"]

PARALLEL = ("ddp", "fsdp2")
ADAM_BYTES = 8  # AdamW's exp_avg and exp_avg_sq, fp32, per element of the (local) parameter
STEP_BYTES = 4  # AdamW's `step`: one fp32 scalar tensor per parameter tensor (torch.optim.AdamW, capturable=False)


def _check(world_size: int, parallel: str) -> None:
    positive_int("world_size", world_size)
    one_of("parallel", parallel, PARALLEL)


def param_shapes(cfg: TransformerConfig) -> list[tuple[int, ...]]:
    """Shapes of the tiny GPT's distinct parameters (tied ones once), built on the meta device: no memory."""
    from m11_helpers.models import TinyGPT

    with torch.device("meta"):
        model = TinyGPT(cfg)
    return [tuple(p.shape) for p in model.parameters()]  # parameters() yields a tied tensor once


def fsdp_local_numel(shape: tuple[int, ...], world_size: int, rank: int) -> int:
    """Elements of `shape` that FSDP2's Shard(0) puts on `rank`: rows min(c, max(0, d₀ − r·c)), c = ⌈d₀/N⌉."""
    _check(world_size, "fsdp2")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
    rows, rest = shape[0], math.prod(shape[1:])
    chunk = math.ceil(rows / world_size)
    return min(chunk, max(0, rows - rank * chunk)) * rest


def model_state_bytes(shapes: list[tuple[int, ...]], world_size: int, parallel: str = "ddp", rank: int = 0) -> dict:
    """Bytes on `rank`: parameters 4·Ψ_r, gradients 4·Ψ_r, AdamW 8·Ψ_r + 4·tensors (Ψ_r = Ψ for DDP, the shard for FSDP2)."""
    _check(world_size, parallel)
    if parallel == "ddp":
        local = sum(math.prod(s) for s in shapes)
    else:
        local = sum(fsdp_local_numel(s, world_size, rank) for s in shapes)
    return {"parameters": 4 * local, "gradients": 4 * local,
            "optimizer": ADAM_BYTES * local + STEP_BYTES * len(shapes), "local_params": local}


def tiny_gpt_activation_bytes(cfg: TransformerConfig, micro_batch: int, *, checkpointing: bool = False,
                              bf16: bool = False, seq_len: int | None = None, separate_targets: bool = True) -> int:
    """Bytes autograd keeps after one tiny-GPT forward, counted op by op from what each op saves for backward.

    fp32, per token and layer (4-byte values): ln_1 input h + mean, rstd 2; qkv input h; q, k, v 3h (one
    buffer); attention output h + log-sum-exp a (fused SDPA never stores the T×T scores); proj input h (a
    transpose + reshape copy); ln_2 input h + 2; fc input h; GELU input f; GELU output f → 8h + 2f + a + 4.
    bf16 autocast: matmul inputs/outputs in 2 bytes, norms and softmax statistics in fp32, the proj input a
    view of the attention output → 20h + 4f + 4a + 16 bytes; plus autocast's bf16 copies of every matmul
    weight, saved too: 2(L(4h² + 2hf) + Vh) bytes per micro-batch, whatever its size.
    Checkpointing each block keeps only its (fp32) input: 4h. Outside the blocks: ln_f input 4h + 8, head
    input 4h (2h in bf16), log-softmax output 4V (fp32 under autocast too), token ids and targets 8 + 8
    (int64), positions 8T, the loss' weight 4.
    """
    positive_int("micro_batch", micro_batch)
    T = cfg.seq_len if seq_len is None else seq_len
    h, f, a, V, L = cfg.hidden, cfg.ffn_hidden, cfg.heads, cfg.vocab_size, cfg.layers
    if checkpointing:
        layer = 4 * h
    else:
        layer = 20 * h + 4 * f + 4 * a + 16 if bf16 else 4 * (8 * h + 2 * f + a + 4)  # bytes per token
    head = 4 * h + 8 + (2 if bf16 else 4) * h + 4 * V
    ids = 8 * (2 if separate_targets else 1)  # int64 inputs (saved by the embedding) and targets (by the loss)
    copies = 0
    if bf16:  # autocast's weight copies: the blocks' only when they are not recomputed
        copies = 2 * V * h + (0 if checkpointing else 2 * L * (4 * h * h + 2 * h * f))
    return micro_batch * T * (L * layer + head + ids) + 8 * T + 4 + copies


def comm_elements(shapes: list[tuple[int, ...]], parallel: str, accum: int = 1, world_size: int = 1) -> dict:
    """Elements per optimizer step, each collective's full tensor (ZeRO §7.2–7.3): DDP all-reduces Ψ once per
    step (no_sync on the other K−1 micro-batches); FSDP2 per micro-batch all-gathers Ψ in forward and Ψ again
    in backward, and reduce-scatters Ψ: 3Ψ·K — Ψ counted with FSDP2's padding (d₀ rounded up to N·⌈d₀/N⌉)."""
    one_of("parallel", parallel, PARALLEL)
    positive_int("accum", accum)
    psi = sum(math.prod(s) for s in shapes)
    if parallel == "ddp":
        return {"all_reduce": psi, "all_gather": 0, "reduce_scatter": 0, "total": psi}
    psi = sum(world_size * math.ceil(s[0] / world_size) * math.prod(s[1:]) for s in shapes)  # padded shards
    gather, scatter = accum * 2 * psi, accum * psi
    return {"all_reduce": 0, "all_gather": gather, "reduce_scatter": scatter, "total": gather + scatter}


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """Run each block's forward under torch.utils.checkpoint: only its input is kept, the rest recomputed.

    The block's own forward is replaced (so its hooks, e.g. FSDP2's all-gather, still run on the call) and
    state-dict keys stay unchanged. Apply before sharding (torchtitan's order: checkpointing, then FSDP).
    """
    for block in model.blocks:
        inner = block.forward  # the original bound method: what backward re-runs
        block.forward = lambda x, inner=inner: checkpoint(inner, x, use_reentrant=False)  # (B, T, C) → (B, T, C)
    return model


def local_bytes(tensors) -> int:
    """Bytes this rank stores: a DTensor's local shard, a plain tensor whole (numel × element size)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


@contextlib.contextmanager
def track_activations() -> Iterator[SavedTensors]:
    """`memory.track_saved_tensors` for a wrapped model: skips parameters *and views of them* by identity.

    Under FSDP2 the gathered parameters are freed after forward (their storage shrinks to 0 bytes), so
    excluding them by storage address, as `track_saved_tensors(model)` does, is impossible; a Linear
    saves `weight.t()`, a view whose `_base` is the parameter. Unique storages are counted once, whole.
    """
    tracker = SavedTensors()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t._base if t._base is not None else t, nn.Parameter):
            return t  # a weight, not an activation: it exists whether or not we train
        return tracker._pack(t)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield tracker
    finally:
        tracker.release()


def predict_run(cfg: TransformerConfig, world_size: int, micro_batch: int, *, parallel: str = "ddp", accum: int = 1,
         checkpointing: bool = False, bf16: bool = False, rank: int = 0) -> dict:
    """The capstone plan for the tiny GPT on `world_size` ranks: bytes per rank and elements moved per step.

    Ring collectives send (N−1)/N of each full tensor per rank, ×2 for an all-reduce (Patarasuk & Yuan 2009).
    """
    shapes = param_shapes(cfg)
    states = model_state_bytes(shapes, world_size, parallel, rank)
    acts = tiny_gpt_activation_bytes(cfg, micro_batch, checkpointing=checkpointing, bf16=bf16)
    comm = comm_elements(shapes, parallel, accum, world_size)
    n = world_size
    sent = 4 * (n - 1) / n * (2 * comm["all_reduce"] + comm["all_gather"] + comm["reduce_scatter"])
    out = {"parallel": parallel, "world_size": n, "micro_batch": micro_batch, "accum": accum,
           "checkpointing": checkpointing, "bf16": bf16, "num_params": sum(math.prod(s) for s in shapes), **states,
           "activations": acts, "comm_elements": comm["total"], "bytes_sent": sent}
    out["total"] = out["parameters"] + out["gradients"] + out["optimizer"] + out["activations"]
    return out


def step_seconds(num_params: float, tokens: float, flops_per_s: float, *, mfu: float = 0.4, comm_bytes: float = 0.0,
                 bandwidth: float = 1.0, checkpointing: bool = False, overlap: bool = True) -> dict:
    """Compute 6Ψ·tokens (8Ψ with full recomputation: one more forward) / (peak·MFU) (Kaplan et al. 2020, §2.1;
    Korthikanti et al. 2022, §4.3); communication bytes/bandwidth; overlapped: max of the two, else their sum."""
    fraction("mfu", mfu)
    positive_real("flops_per_s", flops_per_s)
    positive_real("bandwidth", bandwidth)
    compute = (8 if checkpointing else 6) * num_params * tokens / (flops_per_s * mfu)
    comm = comm_bytes / bandwidth
    return {"compute": compute, "comm": comm, "step": max(compute, comm) if overlap else compute + comm}


def predict_gpu_run(cfg: TransformerConfig, gpus: int = 8, *, parallel: str = "fsdp2", bf16: bool = True,
             checkpointing: bool = False, micro_batch: int = 1, accum: int = 1, gpu: str = "H100 SXM",
             mfu: float = 0.4) -> dict:
    """Per-GPU memory (GB, 10⁹) and step time for `cfg` on one node of `gpus` GPUs.

    Model states: 16 bytes/parameter (fp32 weights, fp32 grads, AdamW; bf16 autocast keeps fp32 weights,
    like FSDP2's MixedPrecisionPolicy), sharded by FSDP2. Activations: Korthikanti et al. 2022 (§4) at 16-bit
    (×2 in fp32), flash attention assumed off (their formula); full recompute with checkpointing. Time:
    `step_seconds` at the chip's bf16 or TF32 dense peak, NVLink's per-direction bandwidth for the ring.
    """
    _check(gpus, parallel)
    psi = float(param_count(cfg))
    shard = gpus if parallel == "fsdp2" else 1
    states = 16 * psi / shard
    acts = korthikanti_activation_bytes(cfg, micro_batch, "full" if checkpointing else "none") * (1 if bf16 else 2)
    spec = chip(gpu)
    flops = spec.peak_tflops["bf16" if bf16 else "tf32"] * 1e12
    elements = accum * 3 * psi if parallel == "fsdp2" else 2 * psi  # ZeRO §7: 3Ψ vs the all-reduce's 2Ψ
    comm_bytes = 4 * elements * (gpus - 1) / gpus  # fp32 gradients and parameters on the wire
    t = step_seconds(psi, micro_batch * accum * cfg.seq_len, flops, mfu=mfu, comm_bytes=comm_bytes,
                     bandwidth=spec.interconnect_gbs / 2 * 1e9, checkpointing=checkpointing)
    return {"model_states_gb": states / 1e9, "activations_gb": acts / 1e9, "total_gb": (states + acts) / 1e9,
            "fits": states + acts <= spec.memory_gb * 1e9, "compute_s": t["compute"], "comm_s": t["comm"],
            "step_s": t["step"], "tokens_per_s": gpus * micro_batch * accum * cfg.seq_len / t["step"]}


# The decision guide: which lever for which bottleneck, what it saves and what it costs.
LEVERS = [
    {"lever": "data parallel (DDP)", "bottleneck": "time", "saves": "step time ÷ N (more samples per second)",
     "costs": "all-reduce 2Ψ per step; full model states on every rank", "source": "Li et al. 2020 (PyTorch DDP)"},
    {"lever": "ZeRO / FSDP", "bottleneck": "memory", "saves": "model states 16Ψ → 16Ψ/N",
     "costs": "3Ψ instead of 2Ψ communicated (ZeRO-3)", "source": "Rajbhandari et al. 2020, §5, §7"},
    {"lever": "mixed precision (bf16)", "bottleneck": "time, memory", "saves": "most activations 4 → 2 bytes "
     "(0.76× measured on the tiny GPT); tensor-core rate (989 vs 495 TFLOP/s on H100)", "costs": "fp32 master weights kept; rounding (loss scaling "
     "only for fp16)", "source": "Micikevicius et al. 2018"},
    {"lever": "gradient accumulation", "bottleneck": "memory", "saves": "activations ÷ K at the same global batch",
     "costs": "K sequential micro-batches: no speed-up", "source": "Goyal et al. 2017; Lesson 07"},
    {"lever": "activation checkpointing", "bottleneck": "memory", "saves": "activations → one input per block",
     "costs": "one extra forward: ≈ +33 % compute", "source": "Chen et al. 2016; Korthikanti et al. 2022, §4"},
    {"lever": "global-norm clipping", "bottleneck": "stability", "saves": "a loss spike from one bad batch",
     "costs": "one global norm per step (an all-reduce of a scalar when sharded)", "source": "Pascanu et al. 2013, §3.2"},
    {"lever": "LR warmup", "bottleneck": "stability", "saves": "early divergence at large batch / large LR",
     "costs": "a few slower steps at the start", "source": "Goyal et al. 2017, §2.2"},
    {"lever": "tensor parallel", "bottleneck": "memory, time", "saves": "per-layer weights and compute ÷ TP",
     "costs": "4 all-reduces of activations per layer: NVLink only", "source": "Shoeybi et al. 2019; Narayanan et al. 2021"},
    {"lever": "pipeline parallel", "bottleneck": "memory", "saves": "layers ÷ PP per GPU", "costs": "bubble (p−1)/m; "
     "point-to-point activations", "source": "Huang et al. 2019 (GPipe); Narayanan et al. 2021"},
    {"lever": "preemption-safe checkpoints", "bottleneck": "cost", "saves": "spot prices without lost work",
     "costs": "a checkpoint write per notice / interval", "source": "Young 1974; Lesson 10"},
]


def lever_rows(cfg: TransformerConfig, gpus: int = 8, micro_batch: int = 1, gpu: str = "H100 SXM") -> list[dict]:
    """predict_gpu_run for the capstone's lever configurations, one row each (the expected figures of the lever table)."""
    configs = [("DDP fp32", dict(parallel="ddp", bf16=False)), ("FSDP2 fp32", dict(parallel="fsdp2", bf16=False)),
               ("FSDP2 + bf16", dict(parallel="fsdp2")),
               ("FSDP2 + bf16 + checkpointing", dict(parallel="fsdp2", checkpointing=True))]
    return [{"config": name, **predict_gpu_run(cfg, gpus, micro_batch=micro_batch, gpu=gpu, **kw)} for name, kw in configs]


def compare(planned: dict, measured: dict, keys=("parameters", "gradients", "optimizer", "activations")) -> list[dict]:
    """Planned vs measured per key, with the relative error (measured / planned − 1)."""
    rows = []
    for k in keys:
        p, m = planned[k], measured[k]
        rows.append({"what": k, "planned": p, "measured": m, "error": (m / p - 1) if p else float(m != 0)})
    return rows


def resume_drill(save_fn, load_fn, steps: int = 6, stop: int = 3, parallel: str = "fsdp2", batch: int = 8,
                 seed: int = 0) -> dict:
    """On each rank (via `launch`): train `steps` steps straight through, then again stopped after `stop`:
    `state = save_fn(model, opt, stop)`, round-tripped through torch.save / torch.load(weights_only=True),
    `start = load_fn(fresh_model, fresh_opt, state)`, and trained on from `start`. Bit-exact or not."""
    import io

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from m11_helpers.data import tokens
    from m11_helpers.fault_tolerance import batch_indices
    from m11_helpers.fsdp import apply_fsdp, init_device_mesh
    from m11_helpers.models import tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()
    _check(n, parallel)
    x_all, y_all = tokens(n=256, seed=seed).tensors  # (256, T), (256, T)

    def fresh():
        model = tiny_gpt(seed)
        if parallel == "fsdp2":
            apply_fsdp(model, init_device_mesh("cpu", (n,)))
        else:
            model = torch.nn.parallel.DistributedDataParallel(model)
        return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def train(model, opt, start, end, losses):
        local = batch // n
        for step in range(start, end):
            idx = batch_indices(step, batch, len(x_all), seed=seed)[rank * local:(rank + 1) * local]  # (B/N,)
            loss = model(x_all[idx], y_all[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())

    def weights(model):
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # every rank: full tensors

    full_losses, resumed_losses = [], []
    model, opt = fresh()
    train(model, opt, 0, steps, full_losses)
    reference = weights(model)
    model, opt = fresh()
    train(model, opt, 0, stop, resumed_losses)
    buffer = io.BytesIO()
    torch.save(save_fn(model, opt, stop), buffer)  # what a checkpoint file would hold
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    model, opt = fresh()  # a new process after the restart: nothing survives but the file
    start = load_fn(model, opt, state)
    train(model, opt, start, steps, resumed_losses)
    final = weights(model)
    equal = len(reference) > 0 and reference.keys() == final.keys() and all(torch.equal(reference[k], final[k])
                                                                              for k in reference)
    del model, opt
    return {"rank": rank, "start": start, "full_losses": full_losses, "resumed_losses": resumed_losses,
            "bitwise_equal": equal}
