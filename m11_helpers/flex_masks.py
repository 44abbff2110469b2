"""Lesson 09 — FlexAttention: document masks for packed sequences and a score_mod, checked against a dense mask.

    doc = document_ids([100, 90, 66])                        # (T,): which packed document each position is in
    out = flex_document_attention(q, k, v, doc, soft_cap=20)  # torch.nn.attention.flex_attention
    ref = reference_document_attention(q, k, v, doc, soft_cap=20)   # dense (T, T) mask, the textbook way
    block_sparsity(doc, 32)                                  # share of (32 × 32) tiles the block mask skips

Packing several documents into one long sequence wastes no padding, but a token must not attend
across its document's boundary: the mask is causal AND same-document. FlexAttention (Dong et al.,
"Flex Attention: A Programming Model for Generating Optimized Attention Kernels", arXiv:2412.05496,
2024; torch.nn.attention.flex_attention) takes that mask as a `mask_mod(b, h, q_idx, kv_idx)` and a
`score_mod(score, b, h, q_idx, kv_idx)` that edits each score (here Gemma 2's soft-cap
cap·tanh(s/cap), Gemma Team 2024, arXiv:2408.00118, §2), and builds a BlockMask: the list of tiles
that hold any visible pair, so a fused kernel skips the rest. On this CPU torch 2.13 runs
flex_attention eagerly with a UserWarning that the unfused path "materializes the full scores
matrix"; the fused kernel comes from torch.compile (Inductor, CPU or GPU). The eager result is what
we check; the skipped tiles are what the compiled kernel saves.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from m11_helpers.validate import positive_int, positive_real

__all__ = ["document_ids", "document_mask", "flex_document_attention", "reference_document_attention",
           "block_sparsity"]


def document_ids(lengths: list[int]) -> torch.Tensor:
    """(T,) int64: position t belongs to document i when it falls in the i-th run of `lengths`."""
    if not lengths:
        raise ValueError("lengths must list at least one document length")
    for i, n in enumerate(lengths):
        positive_int(f"lengths[{i}]", n)
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (T,)


def _mask_mod(doc: torch.Tensor, causal: bool):
    def mask_mod(b, h, q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return same & (q_idx >= kv_idx) if causal else same
    return mask_mod


def document_mask(doc: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """(T, T) bool, True where query i may attend key j: same document (and j ≤ i when causal)."""
    same = doc[:, None] == doc[None, :]  # (T, T)
    return same & torch.ones_like(same).tril() if causal else same


def _soft_cap(cap: float | None):
    if cap is None:
        return None
    positive_real("soft_cap", cap)
    return lambda score, b, h, q_idx, kv_idx: cap * torch.tanh(score / cap)


def flex_document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc: torch.Tensor,
                            causal: bool = True, soft_cap: float | None = None, block: int = 128) -> torch.Tensor:
    """FlexAttention with a document (and causal) BlockMask and an optional soft-cap score_mod; q, k, v (B, H, T, D)."""
    B, H, T, _ = q.shape
    if doc.shape != (T,):
        raise ValueError(f"doc must be (T,) = ({T},), got {tuple(doc.shape)}")
    positive_int("block", block)
    doc = doc.to(q.device)
    mask = create_block_mask(_mask_mod(doc, causal), B, H, T, T, device=q.device, BLOCK_SIZE=block)
    with warnings.catch_warnings():  # eager (uncompiled) flex_attention says it is unfused; that is known here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        return flex_attention(q, k, v, score_mod=_soft_cap(soft_cap), block_mask=mask)  # (B, H, T, D)


def reference_document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc: torch.Tensor,
                                 causal: bool = True, soft_cap: float | None = None) -> torch.Tensor:
    """softmax(mask(cap·tanh(QKᵀ/√d / cap))) V with the dense (T, T) document mask."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if soft_cap is not None:
        s = positive_real("soft_cap", soft_cap) * torch.tanh(s / soft_cap)
    s = s.masked_fill(~document_mask(doc.to(q.device), causal), float("-inf"))
    return s.softmax(dim=-1) @ v  # (B, H, T, D)


def block_sparsity(doc: torch.Tensor, block: int, causal: bool = True) -> float:
    """Share of (block × block) tiles with no visible pair: the work a block-sparse kernel skips."""
    positive_int("block", block)
    T = doc.shape[0]
    m = document_mask(doc, causal)
    n = math.ceil(T / block)
    pad = torch.zeros(n * block, n * block, dtype=torch.bool)
    pad[:T, :T] = m
    tiles = pad.reshape(n, block, n, block).any(dim=3).any(dim=1)  # (n, n): tile (i, j) has work
    return 1.0 - float(tiles.float().mean())
