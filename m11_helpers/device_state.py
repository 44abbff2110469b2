"""The accelerator's own state beside its tensors: its random generators and its allocator's byte counts.

    state = rng_state()            # the CPU generator, every GPU's once CUDA is in use, Python's, NumPy's
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
import random
from typing import Any, Callable, Iterator

import torch

__all__ = ["rng_state", "set_rng_state", "fork_rng", "allocated_bytes", "peak_bytes"]


def rng_state(python_numpy: bool = True) -> dict[str, Any]:
    """This process's RNG states as weights_only-loadable values: torch's CPU generator ("torch"), every GPU's
    once CUDA is in use ("cuda", else []) and, with `python_numpy`, Python's and NumPy's (lesson 10's
    checkpoints hold them all; a recompute needs torch's alone, what torch.utils.checkpoint keeps: 8.4)."""
    state = {"torch": torch.get_rng_state(),  # uint8 tensor
             "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []}
    if not python_numpy:
        return state
    py = random.getstate()  # (version, tuple of 625 ints, gauss_next)
    state["python"] = [py[0], torch.tensor(py[1], dtype=torch.int64), py[2]]
    try:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(gauss)]
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state()` captured (a checkpoint loaded with weights_only=True holds it as it was)."""
    torch.set_rng_state(state["torch"])
    if "python" in state:
        version, keys, gauss = state["python"]
        random.setstate((version, tuple(int(k) for k in keys.tolist()), gauss))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, g = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, g))
    if state.get("cuda") and torch.cuda.is_available():
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
