"""Lesson 09 — FlashAttention's backward: recompute each probability tile from the saved log-sum-exp, never hold P.

    o, lse = tiled_attention(q, k, v, causal=True, return_lse=True)        # m11_helpers.attention: the forward
    dq, dk, dv = flash_backward(q, k, v, o, lse, do, causal=True)          # Algorithm 2, one (Bq, Bk) tile at a time
    largest_allocation(flash_backward, q, k, v, o, lse, do)                # the biggest tensor any op created
    allocation_profile(lambda: ...)                                        # {"largest", "peak_live", …} in bytes

The forward keeps O and L = m + log ℓ (one number per query row). The backward recomputes
S_ij = Q_i K_jᵀ/√d per tile and P_ij = exp(S_ij − L_i) exactly (no running max is needed: L is the
final normaliser), then dV_j += P_ijᵀ dO_i, dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij − D_i),
dQ_i += dS_ij K_j /√d, dK_j += dS_ijᵀ Q_i /√d with D_i = rowsum(dO_i ∘ O_i) (Dao, "FlashAttention-2",
arXiv:2307.08691, 2023, Algorithm 2 and §3.1.2; the loop order — K/V blocks outside, Q blocks inside —
is theirs). Memory: beyond q, k, v, o, do and the gradients, one (Bq, Bk) tile and O(T) row statistics.

The allocation tracker is a TorchDispatchMode: every ATen op the call runs passes through it, and each
output that is not a view or an in-place result (its schema has no alias annotation) is a fresh
allocation, whose bytes it records — what a check needs to prove that no (T, T) tensor ever exists.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from m11_helpers.validate import positive_int

__all__ = ["flash_backward", "AllocationTracker", "allocation_profile", "largest_allocation"]


def _mask_tile(i0: int, rows: int, j0: int, cols: int, device) -> torch.Tensor:
    qi = torch.arange(i0, i0 + rows, device=device)[:, None]  # (rows, 1)
    kj = torch.arange(j0, j0 + cols, device=device)[None, :]  # (1, cols)
    return kj <= qi  # (rows, cols): True where query i may see key j


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   do: torch.Tensor, block_q: int = 16, block_k: int = 16, causal: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of O = softmax(QKᵀ/√d)V from O, L = logsumexp and dO, tile by tile (FlashAttention-2, Alg. 2).

    q, k, v, o, do: (B, H, T, D); lse: (B, H, T, 1) in the units of the scaled scores QKᵀ/√d.
    """
    if q.dim() != 4 or not (q.shape == k.shape == v.shape == o.shape == do.shape):
        raise ValueError(f"q, k, v, o, do must all be (B, H, T, D) of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(o.shape)}, {tuple(do.shape)}")
    if lse.shape != (*q.shape[:-1], 1):
        raise ValueError(f"lse must be (B, H, T, 1) = {(*q.shape[:-1], 1)}, got {tuple(lse.shape)}")
    positive_int("block_q", block_q)
    positive_int("block_k", block_k)
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (do * o).sum(dim=-1, keepdim=True)  # (B, H, T, 1): D_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij
    for j0 in range(0, T, block_k):
        kj, vj = k[..., j0:j0 + block_k, :], v[..., j0:j0 + block_k, :]  # (B, H, Bk, D)
        for i0 in range(0, T, block_q):
            rows = min(block_q, T - i0)
            if causal and j0 > i0 + rows - 1:
                continue  # the whole tile lies above the diagonal: P = 0 there
            sl = slice(i0, i0 + rows)
            s = (q[..., sl, :] @ kj.transpose(-2, -1)) * scale  # (B, H, Bq, Bk), recomputed
            p = torch.exp(s - lse[..., sl, :])  # (B, H, Bq, Bk): the softmax tile, exactly
            if causal:
                p = p.masked_fill(~_mask_tile(i0, rows, j0, kj.shape[-2], q.device), 0.0)
            dv[..., j0:j0 + block_k, :] += p.transpose(-2, -1) @ do[..., sl, :]  # (B, H, Bk, D)
            dp = do[..., sl, :] @ vj.transpose(-2, -1)  # (B, H, Bq, Bk)
            ds = p * (dp - delta[..., sl, :]) * scale  # softmax backward, folded with the 1/√d
            dq[..., sl, :] += ds @ kj  # (B, H, Bq, D)
            dk[..., j0:j0 + block_k, :] += ds.transpose(-2, -1) @ q[..., sl, :]  # (B, H, Bk, D)
    return dq, dk, dv


def _fresh(func) -> bool:
    """True when an op's first result is new memory: no alias annotation (views and in-place ops carry one)."""
    returns = func._schema.returns
    return bool(returns) and returns[0].alias_info is None


class AllocationTracker(TorchDispatchMode):
    """Records every fresh tensor an op creates: the largest (bytes, op, shape) and the peak of those alive at once.

    "Alive" follows the tensor objects (a weak reference each), which is what the allocator frees on
    CPU; inputs made before the mode are not counted, so peak_live is what the call itself added.
    """

    def __init__(self):
        super().__init__()
        self.largest: tuple[int, str, tuple[int, ...]] = (0, "", ())
        self.live = self.peak_live = self.count = 0

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _fresh(func):
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    nbytes = t.numel() * t.element_size()
                    self.count += 1
                    if nbytes > self.largest[0]:
                        self.largest = (nbytes, str(func.overloadpacket.__name__), tuple(t.shape))
                    self.live += nbytes
                    self.peak_live = max(self.peak_live, self.live)
                    weakref.finalize(t, self._release, nbytes)
        return out


def allocation_profile(fn: Callable[[], object]) -> dict:
    """Run fn() under an AllocationTracker: {"largest": bytes, "largest_op", "largest_shape", "peak_live", "tensors"}."""
    with AllocationTracker() as tr:
        result = fn()
    del result  # the outputs count while alive; the profile is taken before they go
    return {"largest": tr.largest[0], "largest_op": tr.largest[1], "largest_shape": tr.largest[2],
            "peak_live": tr.peak_live, "tensors": tr.count}


def largest_allocation(fn: Callable, *args, **kwargs) -> int:
    """Bytes of the largest tensor any ATen op created while fn(*args, **kwargs) ran."""
    return allocation_profile(lambda: fn(*args, **kwargs))["largest"]
