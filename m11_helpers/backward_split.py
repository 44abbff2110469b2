"""Lesson 04 — a layer's backward split in two: B (the input's gradient, now) and W (the weights', later).

    split = SplitBackward(layer, x)            # forward, graph kept
    gx = split.backward_input(grad_out)        # B: torch.autograd.grad w.r.t. the input, retain_graph=True
    ...                                        # send gx upstream; the previous stage can start its B at once
    grads = split.backward_weight()            # W: w.r.t. the parameters, from the same graph, then freed
    fused_backward(layer, x, grad_out)         # the ordinary backward, for the comparison
    compare_split(layer, x, grad_out)          # max |difference| of input and weight gradients: 0

Why: the next stage up the pipeline waits only for B; W has no consumer until the optimizer step, so a
schedule may put it anywhere after B — into the bubble (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", §2, Fig. 1). For y = x Wᵀ + b with upstream gradient g: B is ∂x = g W, W is ∂W = gᵀ x
and ∂b = Σ g — each a matmul the size of the forward's, so T_F ≈ T_B ≈ T_W (Qi et al. Table 1). W
needs the layer's input x (and g), so the activations stay until W has run: splitting costs memory
for as long as W waits. `torch.distributed.pipelining` does the same with `stage_backward_input`
and `stage_backward_weight` (torch/distributed/pipelining/_backward.py).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SplitBackward", "fused_backward", "compare_split", "linear_input_grad", "linear_weight_grad"]


class SplitBackward:
    """One forward of `layer` on `x`, whose backward runs as B (input) now and W (weights) later."""

    def __init__(self, layer: nn.Module, x: torch.Tensor):
        if not isinstance(layer, nn.Module):
            raise ValueError(f"layer must be an nn.Module, got {type(layer).__name__}")
        named = [(n, p) for n, p in layer.named_parameters() if p.requires_grad]
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        if not self.params:
            raise ValueError("layer must have parameters that require grad (W has nothing to compute otherwise)")
        self.x = x.detach().requires_grad_(True)  # a leaf: the stage boundary
        self.y = layer(self.x)  # the graph stays until W
        self.grad_out: torch.Tensor | None = None
        self.done = False

    def backward_input(self, grad_out: torch.Tensor) -> torch.Tensor:
        """B: ∂loss/∂x only; the graph is kept (retain_graph) because W walks it again."""
        if self.grad_out is not None:
            raise RuntimeError("backward_input already ran for this forward")
        if grad_out.shape != self.y.shape:
            raise ValueError(f"grad_out must have the output's shape {tuple(self.y.shape)}, got {tuple(grad_out.shape)}")
        self.grad_out = grad_out
        (gx,) = torch.autograd.grad(self.y, self.x, grad_out, retain_graph=True)
        return gx

    def backward_weight(self) -> dict[str, torch.Tensor]:
        """W: ∂loss/∂θ for every parameter, from the graph B kept; the graph is freed after it."""
        if self.grad_out is None:
            raise RuntimeError("backward_weight needs backward_input first (W uses the gradient B received)")
        if self.done:
            raise RuntimeError("backward_weight already ran: the graph is freed")
        grads = torch.autograd.grad(self.y, self.params, self.grad_out)
        self.done = True
        self.y = None  # drop the graph: the activations W needed go now
        return dict(zip(self.names, grads))


def fused_backward(layer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The ordinary backward: one `y.backward(grad_out)` fills x.grad and every parameter's .grad."""
    params = [p for p in layer.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    x = x.detach().requires_grad_(True)
    layer(x).backward(grad_out)
    grads = [p.grad for p in params]
    for p, g in zip(params, saved):  # leave the layer as it was
        p.grad = g
    return x.grad, grads


def compare_split(layer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> dict[str, float]:
    """Max |split − fused| for the input gradient and for all weight gradients (both 0 up to rounding)."""
    split = SplitBackward(layer, x)
    gx = split.backward_input(grad_out)
    gw = list(split.backward_weight().values())
    fx, fw = fused_backward(layer, x, grad_out)
    return {"input": (gx - fx).abs().max().item(),
            "weights": max((a - b).abs().max().item() for a, b in zip(gw, fw))}


def linear_input_grad(grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """B of y = x Wᵀ + b: ∂x = g W (Qi et al. 2024, §2)."""
    return grad_out @ weight  # (N, out) @ (out, in) -> (N, in)


def linear_weight_grad(grad_out: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W of y = x Wᵀ + b: ∂W = gᵀ x, ∂b = Σ_rows g (Qi et al. 2024, §2)."""
    g = grad_out.reshape(-1, grad_out.shape[-1])  # (N, out)
    return g.T @ x.reshape(-1, x.shape[-1]), g.sum(0)  # (out, in), (out,)
