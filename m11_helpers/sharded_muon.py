"""Lesson 05 — why ZeRO's element-wise sharding breaks a matrix optimizer: Muon needs the whole matrix, so a gather.

    newton_schulz(G)                                     # Muon's orthogonalised update of one matrix (one process)
    r = launch(sharded_muon_step, 64, 32, num_processes=4)[0]
    r["local_error"], r["gathered_error"], r["extra_gather_wire_bytes"], r["adamw_extra_bytes"]

AdamW is element-wise: each parameter's update needs only its own gradient and moments, so ZeRO can
cut the flat parameter vector anywhere and each rank updates its slice with no communication
(Rajbhandari et al. 2020, §5). Muon is not: its update is the orthogonalised momentum matrix,
≈ U Vᵀ of M = U Σ Vᵀ, computed by a Newton–Schulz iteration X ← aX + b(XXᵀ)X + c(XXᵀ)²X that mixes every
row with every other (Jordan et al. 2024, "Muon"; coefficients (3.4445, −4.7750, 2.0315); Liu et al. 2025
"Muon is Scalable for LLM Training", §3, the distributed version). A rank holding a slice of M cannot
compute its slice of the update: run on the slice alone it gives a different answer (measured below);
correct sharded Muon first all-gathers M — (N−1)/N · m·n·4 bytes per rank per matrix per step, which
element-wise AdamW never pays — computes the iteration, and keeps its slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from m11_helpers.validate import positive_int

__all__ = ["newton_schulz", "adamw_update", "sharded_muon_step"]

_NS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024, the quintic's coefficients


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """≈ U Vᵀ of g = U Σ Vᵀ: X₀ = g/‖g‖_F, X ← aX + (bA + cA²)X with A = XXᵀ (Jordan et al. 2024)."""
    if g.ndim != 2:
        raise ValueError(f"g must be a matrix (2-D), got {g.ndim}-D: Muon orthogonalises whole matrices")
    a, b, c = _NS
    x = g / (g.norm() + eps)  # (m, n)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # iterate on the wide side: A is the smaller Gram matrix
    for _ in range(positive_int("steps", steps)):
        A = x @ x.T  # (m, m)
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def adamw_update(g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8) -> torch.Tensor:
    """One Adam direction, element by element: m̂/(√v̂ + ε) after one step (Kingma & Ba 2015, Alg. 1)."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return (m / (1 - beta1)) / ((v / (1 - beta2)).sqrt() + eps)


def sharded_muon_step(rows: int = 64, cols: int = 32, seed: int = 0) -> dict:
    """On each rank (via `launch`): one matrix's momentum sharded ZeRO-style (flat, cut in N); three updates compared.

    local:    Newton–Schulz on this rank's rows alone (no communication): wrong.
    gathered: all-gather the matrix, Newton–Schulz, keep this rank's slice: equal to one process.
    AdamW:    element-wise on the slice, no communication: equal to one process.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    positive_int("rows", rows)
    if rows % n:
        raise ValueError(f"rows ({rows}) must be divisible by the number of ranks ({n}) for this row-aligned demo")
    g = torch.Generator().manual_seed(seed)
    from m11_helpers.launch import rank_device

    full = torch.randn(rows, cols, generator=g).to(rank_device())  # (m, n): the momentum, as one process sees it
    want = newton_schulz(full)
    per = rows * cols // n
    mine = full.reshape(-1)[rank * per:(rank + 1) * per].clone()  # (m·n/N,): ZeRO's flat slice
    # 1. The slice alone (here it happens to be whole rows): Newton–Schulz mixes rows, so this is not the slice of the answer.
    local = newton_schulz(mine.view(rows // n, cols)).reshape(-1)
    # 2. Gather the whole matrix first (the extra collective), then orthogonalise and keep the slice.
    gathered = torch.empty(rows * cols, dtype=mine.dtype, device=mine.device)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(gathered, mine)
    wire = (n - 1) / n * gathered.numel() * gathered.element_size()  # ring all-gather, bytes each rank sends
    ours = newton_schulz(gathered.view(rows, cols)).reshape(-1)[rank * per:(rank + 1) * per]
    target = want.reshape(-1)[rank * per:(rank + 1) * per]
    # 3. AdamW on the same slice: no communication, exactly the slice of the full update.
    zeros = torch.zeros_like(full)
    adam_full = adamw_update(full, zeros, zeros).reshape(-1)[rank * per:(rank + 1) * per]
    adam_mine = adamw_update(mine, torch.zeros_like(mine), torch.zeros_like(mine))
    return {"local_error": (local - target).abs().max().item(), "gathered_error": (ours - target).abs().max().item(),
            "extra_gather_wire_bytes": wire, "adamw_error": (adam_mine - adam_full).abs().max().item(),
            "adamw_extra_bytes": 0, "matrix_bytes": full.numel() * full.element_size()}
