"""Where K accumulated micro-batches are NOT the K× larger batch: losses that couple the samples of a batch.

    ∇ Σᵢ ℓ(xᵢ) = Σ_micro-batches ∇ Σ_{i∈m} ℓ(xᵢ)     exact for any loss that is a sum of per-sample terms

Two common layers/losses are not such a sum:
- BatchNorm (Ioffe & Szegedy 2015, §3) normalises each sample with its *micro-batch's* mean and
  variance, so b samples give noisier statistics than K·b, and the running statistics move K times
  per step. LayerNorm / RMSNorm normalise each sample alone: accumulation stays exact.
- In-batch negatives (InfoNCE, van den Oord et al. 2018 §2.3; CLIP, Radford et al. 2021 §2.3) use
  every other sample of the batch as a negative: a micro-batch of b has b−1 negatives, not K·b−1.
  GradCache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
  Setup", §3.2) gets the large batch's gradient back exactly: embed every micro-batch without a graph,
  take the loss and its gradient with respect to all the embeddings, then re-run each micro-batch's
  forward with a graph and backpropagate its slice of that gradient.

Lesson 07: `norm_mlp`, `accumulation_gap` (measured, relative), `info_nce`, `grad_cache_backward`.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from m11_helpers.validate import one_of, positive_int, positive_real

__all__ = ["norm_mlp", "mse_loss", "accumulation_gap", "info_nce", "contrastive_loss", "grad_cache_backward"]


def norm_mlp(norm: str = "batch", seed: int = 0, width: int = 32) -> nn.Sequential:
    """Linear(16, w) → BatchNorm1d or LayerNorm → ReLU → Linear(w, 4), initialised from `seed`."""
    one_of("norm", norm, ("batch", "layer"))
    positive_int("width", width)
    with torch.random.fork_rng():  # nn.Linear draws from the global generator: seed it, leave it as it was
        torch.manual_seed(seed)
        layer = nn.BatchNorm1d(width) if norm == "batch" else nn.LayerNorm(width)
        return nn.Sequential(nn.Linear(16, width), layer, nn.ReLU(), nn.Linear(width, 4))


def mse_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)  # a mean of per-sample terms: splits exactly over micro-batches


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all tensors together."""
    diff = torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b)))
    return (diff / torch.sqrt(sum((y ** 2).sum() for y in b))).item()


def accumulation_gap(make_model: Callable[[], nn.Module], loss_fn: Callable, a: torch.Tensor, b: torch.Tensor,
                     k: int) -> dict[str, float]:
    """Relative gap between K accumulated micro-batches and the large batch: gradients, and buffers (BN stats).

    loss_fn(model, a, b) is the batch's mean loss; each micro-loss is divided by K, as accumulation does.
    """
    positive_int("k", k)
    if a.shape[0] % k:
        raise ValueError(f"k={k} must divide the batch of {a.shape[0]}: equal micro-batches")
    big, acc = make_model(), make_model()
    loss_fn(big, a, b).backward()  # one batch of B
    for am, bm in zip(a.chunk(k), b.chunk(k)):  # K micro-batches of B/K
        (loss_fn(acc, am, bm) / k).backward()
    grads = _rel([p.grad for p in acc.parameters()], [p.grad for p in big.parameters()])
    bufs = [t for t in big.buffers() if t.is_floating_point()]
    buffers = _rel([t for t in acc.buffers() if t.is_floating_point()], bufs) if bufs else 0.0
    return {"grads": grads, "buffers": buffers}


def info_nce(za: torch.Tensor, zb: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """L = −(1/B) Σᵢ log softmax_j(ẑaᵢ·ẑbⱼ / τ)ᵢ: pair i's positive against the B−1 others (CLIP §2.3, one side)."""
    positive_real("temperature", temperature)
    logits = F.normalize(za, dim=-1) @ F.normalize(zb, dim=-1).T / temperature  # (B, B): every pair in the batch
    return F.cross_entropy(logits, torch.arange(za.shape[0]))  # the diagonal holds the positives


def contrastive_loss(model: nn.Module, a: torch.Tensor, b: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    return info_nce(model(a), model(b), temperature)


def grad_cache_backward(model: nn.Module, a: torch.Tensor, b: torch.Tensor, k: int,
                        temperature: float = 0.1) -> torch.Tensor:
    """GradCache (Gao et al. 2021 §3.2): the large batch's InfoNCE gradient, one micro-batch's activations at a time.

    Returns the large batch's loss; .grad holds its gradient (up to float rounding).
    """
    positive_int("k", k)
    with torch.no_grad():  # 1. embeddings of every micro-batch, no graph kept: (B, d) each side
        za = torch.cat([model(m) for m in a.chunk(k)])
        zb = torch.cat([model(m) for m in b.chunk(k)])
    za.requires_grad_(True)
    zb.requires_grad_(True)
    loss = info_nce(za, zb, temperature)  # 2. the loss over ALL pairs: B−1 negatives each
    loss.backward()  # dL/dz for every embedding, cheap: the graph is only the (B, B) similarity
    for am, bm, ga, gb in zip(a.chunk(k), b.chunk(k), za.grad.chunk(k), zb.grad.chunk(k)):
        model(am).backward(ga)  # 3. one micro-batch's graph at a time: vector-Jacobian product with its slice
        model(bm).backward(gb)
    return loss.detach()
