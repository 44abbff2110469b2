"""The accelerator's own state beside its tensors: its random generators and its allocator's byte counts.

    state = rng_state()            # the CPU generator and, once CUDA is in use, every GPU's
    set_rng_state(state)           # both back: dropout draws the same masks again (lessons 08, 10)
    with fork_rng(): ...           # the same, around a block
    allocated_bytes("cuda"), peak_bytes(lambda: loss.backward(), "cuda")   # None on CPU

Why both generators: on a GPU, dropout and `torch.rand(..., device="cuda")` draw from the GPU's
generator, not `torch.get_rng_state()`'s, so a recompute or a resume that restores only the CPU one
draws other masks there (torch.utils.checkpoint saves both for this reason, `preserve_rng_state`).
Only a process that has initialised CUDA can have drawn on it, and asking
(`torch.cuda.is_initialized()`) initialises nothing: on CPU these are the CPU generator alone.
Why the allocator: a CPU has no allocator statistics; where a lesson measures bytes on a GPU it reads
the caching allocator (`torch.cuda.memory_allocated`, `max_memory_allocated`), on CPU it counts tensor
bytes exactly (m11_helpers.memory, m11_helpers.live_memory). Lessons 05, 07, 08, 10.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

__all__ = ["rng_state", "set_rng_state", "fork_rng", "allocated_bytes", "peak_bytes"]


def rng_state() -> dict[str, Any]:
    """{"cpu": the CPU generator's state, "cuda": [each GPU's] (empty while CUDA is unused)}."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state()` returned (a checkpoint loaded with weights_only=True holds it as it was)."""
    torch.set_rng_state(state["cpu"])
    if state.get("cuda"):
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def fork_rng() -> Iterator[None]:
    """Run the block, then put every generator back as it was (CPU, and the GPUs once CUDA is in use)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def _cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def allocated_bytes(device: str | torch.device) -> int | None:
    """Bytes the accelerator's allocator holds for tensors now; None on CPU (it keeps no such count)."""
    return torch.cuda.memory_allocated(device) if _cuda(device) else None


def peak_bytes(fn: Callable[[], Any], device: str | torch.device) -> int | None:
    """The allocator's peak while `fn()` runs, above what was allocated before it; None on CPU."""
    if not _cuda(device):
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
