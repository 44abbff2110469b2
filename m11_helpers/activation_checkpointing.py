"""Activation (gradient) checkpointing: keep segment boundaries, recompute the inside during backward.

    loss = gpt_forward(model, idx, targets, policy="blocks")                 # every block checkpointed
    loss = gpt_forward(model, idx, targets, policy="first", checkpointed=3)  # only the first 3 blocks
    loss = gpt_forward(model, idx, targets, policy="blocks", context_fn=...)  # PyTorch's selective AC

Policies on the course's TinyGPT (`m11_helpers.models`), all with `torch.utils.checkpoint`
(`use_reentrant=False`):
  "none"        — autograd keeps every activation;
  "blocks"      — each block is one checkpoint: only block inputs are kept (full recomputation);
  "segments"    — `segments` runs of consecutive blocks, each one checkpoint (Chen et al. 2016, §3);
  "sqrt"        — "segments" with round(√L) segments: memory O(√L) for one extra forward;
  "first"/"last" — only the first (last) `checkpointed` blocks are checkpointed, one checkpoint each
                  (Megatron-LM's --recompute-method block --recompute-num-layers N checkpoints the first N);
  "attention"   — selective: only the core attention (scores, softmax, ·V) is recomputed
                  (Korthikanti et al. 2022, §4.2).
`context_fn` is handed to every checkpoint: `selective_checkpointing.sac_context` turns "blocks" into
PyTorch's selective activation checkpointing. What each policy keeps is measured by
`activation_costs`; the bytes a model keeps are modelled by `m11_helpers.activations`. Lesson 08.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from m11_helpers.activations import RECOMPUTE, activation_bytes
from m11_helpers.config import TransformerConfig, param_count
from m11_helpers.model_states import model_state_bytes
from m11_helpers.validate import non_negative_int, non_negative_real, one_of, positive_int

__all__ = ["POLICIES", "sqrt_segments", "segment_bounds", "chen_memory", "partial_peak", "fewest_checkpointed",
           "checkpointed_blocks", "device_memory", "gpt_forward", "llama_forward", "core_attention"]

POLICIES = ("none", "blocks", "segments", "sqrt", "first", "last", "attention")

# ---------------------------------------------------------------------------------------------
# Formulas: what a checkpointing plan keeps, in units of one block
# ---------------------------------------------------------------------------------------------


def sqrt_segments(layers: int) -> int:
    """round(√L), at least 1: Chen et al. 2016's segment count (§3, memory O(√L))."""
    positive_int("layers", layers)
    return max(1, round(math.sqrt(layers)))


def segment_bounds(layers: int, segments: int) -> list[tuple[int, int]]:
    """Split range(layers) into `segments` contiguous runs, sizes differing by at most one."""
    if positive_int("segments", segments) > positive_int("layers", layers):
        raise ValueError(f"segments must be an integer in 1..{layers}, got {segments!r}")
    q, r = divmod(layers, segments)
    out, start = [], 0
    for i in range(segments):
        end = start + q + (1 if i < r else 0)
        out.append((start, end))
        start = end
    return out


def chen_memory(layers: int, segments: int, boundary_bytes: float, block_bytes: float) -> float:
    """Peak ≈ k·boundary + ⌈L/k⌉·block: kept segment inputs + one segment recomputed (Chen et al. 2016, §3)."""
    bounds = segment_bounds(layers, segments)
    return segments * boundary_bytes + max(e - s for s, e in bounds) * block_bytes


def partial_peak(layers: int, checkpointed: int, boundary_bytes: float, block_bytes: float, *,
                 first: bool = True) -> float:
    """Peak of n of L blocks checkpointed: max(n·b + (L−n)·B, (n−1)·b + B) for the first n, n·b + (L−n)·B + B − b
    for the last n (b: a block's input, B: what an un-checkpointed block keeps, its input included).

    Backward meets the last blocks first: if they are the checkpointed ones, one is rebuilt while every stored
    block is still alive; if the first n are, the stored blocks are freed before any is rebuilt. Derived from
    Chen et al. 2016, §3 (lesson 08, exercise 8.1; measured in tests/test_activation_checkpointing.py).
    """
    L = positive_int("layers", layers)
    n = non_negative_int("checkpointed", checkpointed)
    if n > L:
        raise ValueError(f"checkpointed must be an integer in 0..{L}, got {n!r}")
    b, B = non_negative_real("boundary_bytes", boundary_bytes), non_negative_real("block_bytes", block_bytes)
    kept = n * b + (L - n) * B
    if n == 0:
        return kept
    return max(kept, (n - 1) * b + B) if first else kept + B - b


def fewest_checkpointed(layers: int, boundary_bytes: float, block_bytes: float, budget_bytes: float) -> int | None:
    """The smallest n whose first-n plan peaks within the budget (`partial_peak` ≤ budget), None when none does."""
    non_negative_real("budget_bytes", budget_bytes)
    for n in range(positive_int("layers", layers) + 1):
        if partial_peak(layers, n, boundary_bytes, block_bytes) <= budget_bytes:
            return n
    return None


def checkpointed_blocks(layers: int, policy: str, *, segments: int | None = None,
                        checkpointed: int | None = None) -> list[tuple[int, int, bool]]:
    """The plan: (start, end, checkpointed?) runs of blocks that cover range(layers), in order."""
    one_of("policy", policy, POLICIES)
    L = positive_int("layers", layers)
    if policy in ("none", "attention"):
        return [(0, L, False)]
    if policy in ("first", "last"):
        if checkpointed is None or not 0 <= non_negative_int("checkpointed", checkpointed) <= L:
            raise ValueError(f"checkpointed must be an integer in 0..{L} with policy={policy!r}, got {checkpointed!r}")
        lo, hi = (0, checkpointed) if policy == "first" else (L - checkpointed, L)
        plain = [(s, e, False) for s, e in ((0, lo), (hi, L)) if e > s]
        return sorted(plain + [(i, i + 1, True) for i in range(lo, hi)])
    if policy == "segments" and segments is None:
        raise ValueError("segments must be given with policy='segments' (an integer in 1..layers)")
    k = {"blocks": L, "sqrt": sqrt_segments(L)}.get(policy, segments)
    return [(s, e, True) for s, e in segment_bounds(L, k)]  # every segment checkpointed, the last one too


def device_memory(cfg: TransformerConfig, micro_batch: int, *, seq_len: int | None = None, recompute: str = "none",
                  flash: bool = True, gpus: int = 8, layout: str = "deepspeed", zero_stage: int = 3) -> dict:
    """Bytes one GPU holds at the worst moment of a step: model states (ZeRO §5.1) + activations + recompute transient.

    Model states from `model_states.model_state_bytes`, activations and the transient (one layer rebuilt, or
    one core attention) from `activations.activation_bytes` (Korthikanti et al. 2022, §4). The lab's arithmetic.
    """
    one_of("recompute", recompute, RECOMPUTE)
    acts = activation_bytes(cfg, micro_batch, seq_len=seq_len, recompute=recompute, flash=flash)
    states = model_state_bytes(param_count(cfg), layout, gpus, zero_stage)["total"]
    return {"model states": states, "activations": acts["total"], "transient": acts["transient"],
            "total": states + acts["total"] + acts["transient"]}


# ---------------------------------------------------------------------------------------------
# Policies on the tiny GPT
# ---------------------------------------------------------------------------------------------


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, naive: bool) -> torch.Tensor:
    """softmax(q kᵀ/√d + causal mask) v: SDPA, or the textbook version that materialises the (T × T) scores."""
    if not naive:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, nh, T, T): the s² term
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v  # (B, nh, T, hd)


def _block_selective(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Block.forward with only the core attention under checkpoint (what Megatron's selective recompute does)."""
    attn = block.attn
    B, T, C = x.shape
    q, k, v = attn.qkv(block.ln_1(x)).split(C, dim=2)  # 3 × (B, T, C)
    q, k, v = (t.view(B, T, attn.heads, C // attn.heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    y = checkpoint(core_attention, q, k, v, attn.attention == "naive", use_reentrant=False)  # (B, nh, T, hd)
    x = x + attn.proj(y.transpose(1, 2).reshape(B, T, C))
    return x + block.mlp(block.ln_2(x))


def _run_blocks(blocks, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def gpt_forward(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                policy: str = "none", segments: int | None = None, checkpointed: int | None = None,
                context_fn: Callable | None = None):
    """TinyGPT's forward (same numbers as `model(idx, targets)`) with a checkpointing policy applied."""
    blocks = list(model.blocks)
    plan = checkpointed_blocks(len(blocks), policy, segments=segments, checkpointed=checkpointed)
    extra = {} if context_fn is None else {"context_fn": context_fn}
    B, T = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
    if policy == "attention":
        for block in blocks:
            x = _block_selective(block, x)
    for s, e, ckpt in ([] if policy == "attention" else plan):
        if ckpt:
            x = checkpoint(_run_blocks, blocks[s:e], x, use_reentrant=False, **extra)  # keeps only x: (B, T, C)
        else:
            x = _run_blocks(blocks[s:e], x)  # (B, T, C), every activation kept
    logits = model.head(model.ln_f(x))  # (B, T, vocab)
    if targets is None:
        return logits
    return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def llama_forward(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                  context_fn: Callable | None = None):
    """TinyLlama's forward (same numbers as `model(idx, targets)`) with every layer its own checkpoint."""
    extra = {} if context_fn is None else {"context_fn": context_fn}
    B, T = idx.shape
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]  # (T, d)
    x = model.embed_tokens(idx)  # (B, T, C)
    for block in model.layers:
        x = checkpoint(block, x, cos, sin, use_reentrant=False, **extra)  # keeps x: (B, T, C)
    logits = model.lm_head(model.norm(x))  # (B, T, vocab)
    if targets is None:
        return logits
    return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
