"""Attention three ways — naive, tiled with online softmax, FlashAttention-style — and the byte sums (lesson 09).

    naive_attention(q, k, v, causal=True)                # materialises the (T, T) scores
    tiled_attention(q, k, v, block_q=16, block_k=16)     # online softmax, one (Bq, Bk) tile at a time
    flash_attention(q, k, v, block_q=16, block_k=16)     # the same forward, saves only O and logsumexp,
                                                         # recomputes the tiles in backward
    attention_matrix_bytes(b, h, s, 2); flash_hbm_elements(N, d, A100_SRAM_BYTES // 2); standard_hbm_elements(N, d)

Shapes: q, k, v are (B, H, T, D). Sources: Dao et al., "FlashAttention: Fast and Memory-Efficient
Exact Attention with IO-Awareness", NeurIPS 2022 (arXiv:2205.14135) — Algorithm 0 (standard),
Algorithm 1 (forward), Theorem 2 (HBM accesses); Dao, "FlashAttention-2", 2023 (arXiv:2307.08691) —
the backward pass with the log-sum-exp. Online softmax: Milakov & Gimelshein 2018 (arXiv:1805.02867).
Memory is measured with the kit's `m11_helpers.memory.saved_activation_bytes` (lesson 08 teaches it);
the s² bytes come from the kit's one activation model (`m11_helpers.activations`, its "attention
scores" term). `sdpa_kernels` names the kernel PyTorch's SDPA picks on this build, through the op
tracer that also watches exercise 9.2 (`m11_helpers.op_trace`). `step_memory` measures a whole
forward + backward, every tensor either creates, with the allocation tracker of `m11_helpers.flash_backward`.
"""

from __future__ import annotations

import math
import time

import torch

from m11_helpers.activations import activation_bytes
from m11_helpers.config import TransformerConfig
from m11_helpers.flash_backward import allocation_profile, flash_backward
from m11_helpers.memory import saved_activation_bytes
from m11_helpers.op_trace import trace_dispatch
from m11_helpers.timing import synchronize
from m11_helpers.validate import positive_int, positive_real

__all__ = ["A100_SRAM_BYTES", "A100_SHARED_MEMORY_BYTES", "naive_attention", "online_softmax_update", "tiled_attention", "flash_attention",
           "attention_matrix_bytes", "max_seq_len_for_budget", "qkvo_bytes", "standard_hbm_elements",
           "flash_hbm_elements", "flash_block_sizes", "saved_bytes_by_method", "sdpa_kernels", "step_memory"]

# On-chip SRAM of one A100 streaming multiprocessor as the paper counts it: "192KB per each of 108 streaming
# multiprocessors" (Dao et al. 2022, §2.1). FlashAttention's M counts elements: A100_SRAM_BYTES // 2 in fp16/bf16.
A100_SRAM_BYTES = 192 * 1024
# 192 KB is the combined L1 + shared memory; a kernel can use at most 164 KB of it as shared memory ("The NVIDIA
# A100 GPU supports shared memory capacity of 0, 8, 16, 32, 64, 100, 132 or 164 KB per SM": NVIDIA, Tuning CUDA
# Applications for the NVIDIA Ampere GPU Architecture, §1.4.2.3, read 2026-12).
A100_SHARED_MEMORY_BYTES = 164 * 1024


def _check_qkv(q, k, v, block_q=1, block_k=1):
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, D) of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    positive_int("block_q", block_q)
    positive_int("block_k", block_k)


def _causal_mask(i0: int, rows: int, j0: int, cols: int, device) -> torch.Tensor:
    """True where query i0+r may attend key j0+c (c ≤ r), for one (rows, cols) tile."""
    qi = torch.arange(i0, i0 + rows, device=device)[:, None]  # (rows, 1)
    kj = torch.arange(j0, j0 + cols, device=device)[None, :]  # (1, cols)
    return kj <= qi  # (rows, cols)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(QKᵀ/√d) V, the full (T, T) matrix in memory (Dao et al. 2022, Algorithm 0)."""
    _check_qkv(q, k, v)
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T): the s² matrix
    if causal:
        s = s.masked_fill(~_causal_mask(0, T, 0, T, q.device), float("-inf"))
    return s.softmax(dim=-1) @ v  # (B, H, T, D)


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, o: torch.Tensor, s: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key block into running (max m, sum l, unnormalised output o); Dao et al. 2022, Alg. 1 l. 10–12.

    m, l: (..., Bq, 1); o: (..., Bq, D); s: this block's scores (..., Bq, Bk), -inf where masked;
    v: (..., Bk, D). m' = max(m, rowmax s); l' = e^(m−m') l + Σ e^(s−m'); o' = e^(m−m') o + e^(s−m') v.
    The final output is o / l. Rows that have seen only -inf keep m = -inf, l = 0, o = 0.
    """
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., Bq, 1)
    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a fully masked row: no NaN
    alpha = torch.exp(m - safe)  # (..., Bq, 1): rescales what was accumulated under the old max
    p = torch.exp(s - safe)  # (..., Bq, Bk)
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * o + p @ v


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int = 16, block_k: int = 16,
                    causal: bool = False, return_lse: bool = False):
    """Exact attention one (block_q × block_k) tile at a time; never holds more than one score tile.

    Outer loop over query blocks, inner over key blocks (the FlashAttention-2 order, §3.1); causal
    tiles entirely above the diagonal are skipped. Returns O (B, H, T, D) [, logsumexp (B, H, T, 1)].
    """
    _check_qkv(q, k, v, block_q, block_k)
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    outs, lses = [], []
    for i0 in range(0, T, block_q):
        qi = q[..., i0:i0 + block_q, :] * scale  # (B, H, Bq, D)
        rows = qi.shape[-2]
        m = qi.new_full((*qi.shape[:-1], 1), float("-inf"))  # (B, H, Bq, 1)
        l = qi.new_zeros((*qi.shape[:-1], 1))  # (B, H, Bq, 1)
        o = torch.zeros_like(qi)  # (B, H, Bq, D)
        for j0 in range(0, T, block_k):
            if causal and j0 > i0 + rows - 1:
                break  # every key of this and later blocks is in the future of every query here
            kj, vj = k[..., j0:j0 + block_k, :], v[..., j0:j0 + block_k, :]  # (B, H, Bk, D)
            s = qi @ kj.transpose(-2, -1)  # (B, H, Bq, Bk): the only score tile alive
            if causal:
                s = s.masked_fill(~_causal_mask(i0, rows, j0, kj.shape[-2], q.device), float("-inf"))
            m, l, o = online_softmax_update(m, l, o, s, vj)
        outs.append(o / l)
        lses.append(m + torch.log(l))
    out = torch.cat(outs, dim=-2)  # (B, H, T, D)
    return (out, torch.cat(lses, dim=-2)) if return_lse else out


class _FlashAttention(torch.autograd.Function):
    """Forward: tiled_attention; saves q, k, v, O and logsumexp only — O(T) beyond the inputs.
    Backward: recomputes each score tile from q, k and the logsumexp (FlashAttention-2, Algorithm 2)."""

    @staticmethod
    def forward(ctx, q, k, v, block_q, block_k, causal):
        with torch.no_grad():
            o, lse = tiled_attention(q, k, v, block_q, block_k, causal, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cfg = (block_q, block_k, causal)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        block_q, block_k, causal = ctx.cfg
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, block_q, block_k, causal)  # Algorithm 2, tile by tile
        return dq, dk, dv, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int = 16, block_k: int = 16,
                    causal: bool = False) -> torch.Tensor:
    """Tiled attention with a recomputing backward: what FlashAttention saves for backward, in PyTorch."""
    _check_qkv(q, k, v, block_q, block_k)
    return _FlashAttention.apply(q, k, v, block_q, block_k, causal)


# ---------------------------------------------------------------- the byte sums

def attention_matrix_bytes(batch: int, heads: int, seq_len: int, dtype_bytes: int = 2) -> int:
    """b·h·s²·bytes: one (s × s) softmax output per head, per layer (Dao et al. 2022, §1).

    Not a second formula: the "attention scores" term of the kit's activation model (Korthikanti et
    al. 2022, §4: the a·s²·b of sbh(34 + 5as/h)), for one layer of `heads` heads at `seq_len`.
    """
    one = TransformerConfig("one attention layer", vocab_size=1, hidden=positive_int("heads", heads), layers=1,
                            heads=heads, ffn_hidden=1, seq_len=positive_int("seq_len", seq_len), dropout=False)
    return activation_bytes(one, batch, dtype_bytes=dtype_bytes)["breakdown"]["attention scores"]


def qkvo_bytes(batch: int, heads: int, seq_len: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """4·b·h·s·d·bytes: Q, K, V and O, what FlashAttention keeps instead of the matrix (plus b·h·s lse)."""
    for name, x in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim),
                    ("dtype_bytes", dtype_bytes)):
        positive_real(name, x)
    return 4 * batch * heads * seq_len * head_dim * dtype_bytes


def max_seq_len_for_budget(budget_bytes: float, batch: int, heads: int, dtype_bytes: int = 2) -> int:
    """Largest s with b·h·s²·bytes ≤ budget: s = ⌊√(budget / (b·h·bytes))⌋, checked against attention_matrix_bytes."""
    for name, x in (("budget_bytes", budget_bytes), ("batch", batch), ("heads", heads), ("dtype_bytes", dtype_bytes)):
        positive_real(name, x)
    s = math.isqrt(int(budget_bytes // (batch * heads * dtype_bytes)))  # 0: not even s = 1 fits
    while s > 0 and attention_matrix_bytes(batch, heads, s, dtype_bytes) > budget_bytes:  # guard float rounding
        s -= 1
    while attention_matrix_bytes(batch, heads, s + 1, dtype_bytes) <= budget_bytes:
        s += 1
    return s


def standard_hbm_elements(N: int, d: int) -> int:
    """4Nd + 4N² elements read/written by Algorithm 0 (Dao et al. 2022, §2.2; Θ(Nd + N²), Theorem 2).

    Read Q, K (2Nd), write S (N²); read S, write P (2N²); read P, V (N² + Nd), write O (Nd).
    """
    for name, x in (("N", N), ("d", d)):
        positive_real(name, x)
    return 4 * N * d + 4 * N * N


def flash_block_sizes(d: int, M: int) -> tuple[int, int]:
    """(B_r, B_c) = (min(⌈M/4d⌉, d), ⌈M/4d⌉) for SRAM of M elements (Dao et al. 2022, Algorithm 1, line 1)."""
    for name, x in (("d", d), ("M", M)):
        positive_real(name, x)
    if M < d:
        raise ValueError(f"M (SRAM in elements) must be >= d={d}, got {M}")
    bc = math.ceil(M / (4 * d))
    return min(bc, d), bc


def flash_hbm_elements(N: int, d: int, M: int) -> int:
    """Elements read/written by Algorithm 1 (Dao et al. 2022): 3Nd + 2N + T_c·(3Nd + 4N) = Θ(N²d²/M) (Theorem 2).

    Line 2 initialises O, ℓ, m in HBM (Nd + 2N written); the outer loop reads each of the T_c = ⌈N/B_c⌉
    blocks of K, V once (2Nd in all); per outer step the inner loop over the query blocks reads Q_i,
    O_i, ℓ_i, m_i and writes O_i, ℓ_i, m_i (3Nd + 4N over all of them). The proof of Theorem 2
    (Appendix C) counts the dominant part, Θ(Nd + T_c·Nd).
    """
    for name, x in (("N", N), ("d", d), ("M", M)):
        positive_real(name, x)
    _, bc = flash_block_sizes(d, M)
    tc = math.ceil(N / bc)
    init = N * d + 2 * N  # line 2: O = 0, ℓ = 0, m = -inf written to HBM
    per_pass = 3 * N * d + 4 * N  # read Q, O, ℓ, m; write O, ℓ, m — over all T_r query blocks
    return init + 2 * N * d + tc * per_pass


def saved_bytes_by_method(seq_len: int, batch: int = 1, heads: int = 4, head_dim: int = 16,
                          causal: bool = True, block: int = 64) -> dict[str, int]:
    """Bytes autograd saves for backward (measured, lesson 08's tracker) for naive, flash (ours) and SDPA.

    q, k, v require grad and are counted for every method alike (the inputs the backward needs).
    """
    for name, x in (("seq_len", seq_len), ("batch", batch), ("heads", heads), ("head_dim", head_dim),
                    ("block", block)):
        positive_int(name, x)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=g).requires_grad_() for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return {
        "naive": saved_activation_bytes(naive_attention, q, k, v, causal=causal),
        "flash (ours)": saved_activation_bytes(flash_attention, q, k, v, block_q=block, block_k=block,
                                               causal=causal),
        "sdpa": saved_activation_bytes(sdpa, q, k, v, is_causal=causal),
    }


def sdpa_kernels(seq_len: int = 64, heads: int = 4, head_dim: int = 16, causal: bool = True) -> frozenset:
    """The ATen attention kernels `F.scaled_dot_product_attention` runs here on fp32 CPU inputs that require
    grad, as `saved_bytes_by_method` calls it: e.g. {"_scaled_dot_product_flash_attention_for_cpu"}.

    SDPA picks its backend at run time (flash, memory-efficient, math) from the build and the inputs,
    and what it saves for backward follows the backend: a lesson compares with it only where it knows which ran.
    """
    for name, x in (("seq_len", seq_len), ("heads", heads), ("head_dim", head_dim)):
        positive_int(name, x)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq_len, head_dim, generator=g).requires_grad_() for _ in range(3))
    ops = trace_dispatch(torch.nn.functional.scaled_dot_product_attention, q, k, v, is_causal=causal,
                         no_grad=False).ops
    return frozenset(op for op in ops if "attention" in op)


def step_memory(seq_len: int, head_dim: int = 64, block: int = 128, causal: bool = True) -> dict[str, dict]:
    """Forward + backward of one head through autograd: naive (saves P) vs flash_attention (recomputes it).

    Each value is `allocation_profile`'s dict (bytes of the largest tensor created, the peak of those alive
    at once, how many) plus "seconds" (one run, fp32); q, k, v and dO are made outside and not counted.
    """
    for name, x in (("seq_len", seq_len), ("head_dim", head_dim), ("block", block)):
        positive_int(name, x)
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, seq_len, head_dim, generator=g) for _ in range(4))  # (B, H, T, D)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    runs = {"naive (autograd)": lambda: naive_attention(*leaves, causal=causal),
            "flash (recompute)": lambda: flash_attention(*leaves, block, block, causal)}
    out = {}
    for name, forward in runs.items():
        synchronize()
        t0 = time.perf_counter()
        out[name] = allocation_profile(lambda f=forward: torch.autograd.grad(f(), leaves, do))
        synchronize()  # a GPU returns before its kernels end: read the clock once they have
        out[name]["seconds"] = time.perf_counter() - t0
    return out

