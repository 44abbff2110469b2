"""Activation (gradient) checkpointing: keep segment boundaries, recompute the inside during backward.

    loss = gpt_forward(model, idx, targets, policy="blocks")       # every block checkpointed
    costs = measure_policies(model, idx, targets)                  # retained / peak bytes, time
    activation_bytes_per_layer(2048, 1, 12288, 96)                 # Korthikanti et al. 2022, GPT-3

Policies on the course's TinyGPT (`m11_helpers.models`), all with `torch.utils.checkpoint`
(`use_reentrant=False`):
  "none"       — autograd keeps every activation;
  "blocks"     — each block is one checkpoint: only block inputs are kept (full recomputation);
  "segments"   — `segments` runs of consecutive blocks, each one checkpoint (Chen et al. 2016, §3);
  "sqrt"       — "segments" with round(√L) segments: memory O(√L) for one extra forward;
  "attention"  — selective: only the core attention (scores, softmax, ·V) is recomputed
                 (Korthikanti et al. 2022, §4.2).
Lesson 08.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from m11_helpers.config import TransformerConfig
from m11_helpers.memory import saved_activation_bytes
from m11_helpers.timing import time_it
from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["POLICIES", "activation_bytes_per_layer", "model_activation_bytes", "sqrt_segments", "segment_bounds",
           "chen_memory", "gpt_forward", "peak_activation_bytes", "measure_policies", "choose_policy"]

POLICIES = ("none", "blocks", "segments", "sqrt", "attention")
RECOMPUTE = ("none", "selective", "full")

# ---------------------------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------------------------


def activation_bytes_per_layer(seq_len: int, batch: int, hidden: int, heads: int, *, ffn_hidden: int | None = None,
                               bytes_per_value: int = 2, dropout: bool = True, flash_attention: bool = False,
                               recompute: str = "none") -> int:
    """sbh(34 + 5as/h) bytes per transformer layer (Korthikanti et al. 2022, §4.1, eq. 1).

    The defaults are the paper's assumptions: 16-bit activations, 1-byte dropout masks, a 4h GELU MLP,
    no tensor/sequence parallelism. Generalised term by term (sbh·p × values + 1-byte masks):
    attention keeps 5 (QKV input, Q, K, V, proj input) + an sbh mask; the MLP 1 + 2·ffn/h (+ mask);
    two LayerNorm inputs; the score matrices as²b·p (softmax out) [+ as²b mask + as²b·p dropout out].
    `flash_attention` drops the s² term (the scores are recomputed in backward, never stored).
    recompute="selective": the s² term is recomputed (§4.2) → sbh·34; "full": only the layer input, 2sbh (§4.3).
    """
    for name, v in (("seq_len", seq_len), ("batch", batch), ("hidden", hidden), ("heads", heads),
                    ("bytes_per_value", bytes_per_value)):
        positive_int(name, v)
    one_of("recompute", recompute, RECOMPUTE)
    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    s, b, h, a, p = seq_len, batch, hidden, heads, bytes_per_value
    if recompute == "full":
        return p * s * b * h  # the layer's input, 2sbh at p = 2
    mask = 1 if dropout else 0
    attn_sbh = 5 * p + mask  # QKV input, Q, K, V, output-projection input; + the output dropout mask
    mlp_sbh = p * (h + 2 * ffn) // h + mask  # fc input, GELU input, GELU output (= proj input); + mask
    norm_sbh = 2 * p
    total = s * b * h * (attn_sbh + mlp_sbh + norm_sbh)
    if recompute == "none" and not flash_attention:
        total += a * s * s * b * (p + (1 + p if dropout else 0))  # softmax out; dropout mask and output
    return total


def model_activation_bytes(cfg: TransformerConfig, batch: int, seq_len: int | None = None, *,
                           recompute: str = "none", flash_attention: bool = False, bytes_per_value: int = 2,
                           dropout: bool = False) -> int:
    """L × activation_bytes_per_layer for a config (a GELU MLP of width cfg.ffn_hidden assumed)."""
    s = cfg.seq_len if seq_len is None else seq_len
    return cfg.layers * activation_bytes_per_layer(s, batch, cfg.hidden, cfg.heads, ffn_hidden=cfg.ffn_hidden,
                                                   bytes_per_value=bytes_per_value, dropout=dropout,
                                                   flash_attention=flash_attention, recompute=recompute)


def sqrt_segments(layers: int) -> int:
    """round(√L), at least 1: Chen et al. 2016's segment count (§3, memory O(√L))."""
    positive_int("layers", layers)
    return max(1, round(math.sqrt(layers)))


def segment_bounds(layers: int, segments: int) -> list[tuple[int, int]]:
    """Split range(layers) into `segments` contiguous runs, sizes differing by at most one."""
    if positive_int("segments", segments) > layers:
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


# ---------------------------------------------------------------------------------------------
# Policies on the tiny GPT
# ---------------------------------------------------------------------------------------------


def _core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, naive: bool) -> torch.Tensor:
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
    y = checkpoint(_core_attention, q, k, v, attn.attention == "naive", use_reentrant=False)  # (B, nh, T, hd)
    x = x + attn.proj(y.transpose(1, 2).reshape(B, T, C))
    return x + block.mlp(block.ln_2(x))


def _run_blocks(blocks, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def gpt_forward(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                policy: str = "none", segments: int | None = None):
    """TinyGPT's forward (same numbers as `model(idx, targets)`) with a checkpointing policy applied."""
    one_of("policy", policy, POLICIES)
    blocks = list(model.blocks)
    B, T = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
    if policy == "none":
        x = _run_blocks(blocks, x)
    elif policy == "attention":
        for block in blocks:
            x = _block_selective(block, x)
    else:
        k = {"blocks": len(blocks), "sqrt": sqrt_segments(len(blocks))}.get(policy, segments)
        if policy == "segments" and segments is None:
            raise ValueError("segments must be given with policy='segments'")
        for s, e in segment_bounds(len(blocks), k):  # every segment checkpointed, the last one too
            x = checkpoint(_run_blocks, blocks[s:e], x, use_reentrant=False)  # keeps only x: (B, T, C)
    logits = model.head(model.ln_f(x))  # (B, T, vocab)
    if targets is None:
        return logits
    return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def peak_activation_bytes(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, *, policy: str = "none",
                          segments: int | None = None) -> dict:
    """Activation bytes for one policy: retained after forward, and the peak while backward recomputes.

    retained: measured exactly (saved tensors, deduplicated, parameters excluded). recompute: the
    largest unit backward re-runs (a segment of blocks, or one core attention), measured the same way
    with its input excluded (it is already among the retained). peak = retained + recompute.
    """
    retained = saved_activation_bytes(lambda: gpt_forward(model, idx, targets, policy=policy, segments=segments),
                                      exclude=[model])
    blocks = list(model.blocks)
    with torch.no_grad():
        x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)
    x.requires_grad_(True)
    if policy == "none":
        recompute = 0
    elif policy == "attention":
        attn, (B, T, C) = blocks[0].attn, x.shape
        q = torch.randn(B, attn.heads, T, C // attn.heads, requires_grad=True)  # (B, nh, T, hd)
        recompute = saved_activation_bytes(_core_attention, q, q.clone(), q.clone(), attn.attention == "naive",
                                           exclude=[q])
        recompute -= 2 * q.untyped_storage().nbytes()  # k and v clones are inputs, kept anyway
    else:
        k = {"blocks": len(blocks), "sqrt": sqrt_segments(len(blocks))}.get(policy, segments)
        longest = max(e - s for s, e in segment_bounds(len(blocks), k))
        recompute = saved_activation_bytes(_run_blocks, blocks[:longest], x, exclude=[model, x])
    return {"policy": policy, "segments": segments, "retained": retained, "recompute": recompute,
            "peak": retained + recompute}


def measure_policies(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, policies=None,
                     repeats: int = 5) -> list[dict]:
    """peak_activation_bytes + forward+backward seconds (median of `repeats`, after one warm-up) for each
    (policy, segments) pair."""
    policies = policies or [("none", None), ("blocks", None), ("sqrt", None), ("attention", None)]
    out = []
    for policy, segments in policies:
        row = peak_activation_bytes(model, idx, targets, policy=policy, segments=segments)
        step = lambda: gpt_forward(model, idx, targets, policy=policy, segments=segments).backward()
        row["seconds"] = time_it(step, repeats=repeats, warmup=1).median
        model.zero_grad(set_to_none=True)
        out.append(row)
    return out


def choose_policy(rows: list[dict], budget_bytes: float) -> dict | None:
    """The fastest row whose peak fits the budget (ties: less memory); None when nothing fits."""
    positive_real("budget_bytes", budget_bytes)
    fits = [r for r in rows if r["peak"] <= budget_bytes]
    return min(fits, key=lambda r: (r.get("seconds", 0.0), r["peak"])) if fits else None
