"""What pipeline stages send each other: activations forward, their gradients back, and the tied weights' sum
(lesson 04).

    send_forward(h, dst=1)                 # stage s -> s+1: the activations of one micro-batch
    h = recv_forward(shape, src=0)         # ... arrive as a leaf that will collect their gradient
    send_backward(h.grad, dst=0)           # stage s+1 -> s: that gradient, once backward reached h
    sum_tied_grad(model.wte.weight, group) # first and last stage add their halves of a shared weight
    p2p_bytes(micro_batch, seq_len, hidden)   # b·s·h·2 bytes per message (Narayanan et al. 2021, §3.2)

Kept apart from the schedules (`m11_helpers.pipeline`) and the runs (`m11_helpers.pipeline_run`), as
picotron keeps its `pp_communications.py`: a schedule decides *when*, these say *what* crosses.
Point-to-point and blocking on purpose: each message is one activation, small next to tensor
parallelism's per-layer all-reduces, which is why pipelines may cross nodes (Narayanan et al. 2021, §3).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from m11_helpers.launch.base import rank_device
from m11_helpers.validate import positive_int

__all__ = ["send_forward", "recv_forward", "send_backward", "recv_backward", "sum_tied_grad", "p2p_bytes"]


def send_forward(activations: torch.Tensor, dst: int) -> None:
    """Send one micro-batch's output activations to the next stage (detached: the graph stays here)."""
    dist.send(activations.detach().contiguous(), dst=dst)


def recv_forward(shape: tuple[int, ...], src: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> torch.Tensor:
    """Receive the previous stage's activations as a leaf tensor whose `.grad` backward will fill."""
    h = torch.empty(shape, dtype=dtype, device=device or rank_device())  # NCCL receives into GPU memory only
    dist.recv(h, src=src)
    return h.requires_grad_(True)


def send_backward(grad: torch.Tensor, dst: int) -> None:
    """Send the gradient of the activations received from `dst` back to it."""
    dist.send(grad.contiguous(), dst=dst)


def recv_backward(shape: tuple[int, ...], src: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> torch.Tensor:
    """Receive the gradient of the activations this stage sent to `src`; the caller waits here (idle)."""
    g = torch.empty(shape, dtype=dtype, device=device or rank_device())  # NCCL receives into GPU memory only
    dist.recv(g, src=src)
    return g


def sum_tied_grad(weight: torch.Tensor, group) -> torch.Tensor:
    """All-reduce a weight's gradient between the stages that share it (embedding on the first, head on the last).

    Each stage back-propagated only its own use of the weight; the true gradient is the sum (Megatron-LM's
    embedding group). A stage that did not use it contributes zeros.
    """
    g = weight.grad if weight.grad is not None else torch.zeros_like(weight)
    dist.all_reduce(g, group=group)
    weight.grad = g
    return g


def p2p_bytes(micro_batch: int, seq_len: int, hidden: int, bytes_per_element: int = 2) -> int:
    """One message between adjacent stages: b·s·h elements, each way per micro-batch (Narayanan et al. 2021, §3.2)."""
    for name, v in (("micro_batch", micro_batch), ("seq_len", seq_len), ("hidden", hidden),
                    ("bytes_per_element", bytes_per_element)):
        positive_int(name, v)
    return micro_batch * seq_len * hidden * bytes_per_element
