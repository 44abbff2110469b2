"""What one rank of the reference script really holds and sends: counters beside the script, not in it.

    out = launch(sweep, [flags.argv() + ["--steps", 3] for flags in configs], num_processes=2)
    out[0][i]["parameters"], ["gradients"], ["optimizer"], ["activations"], ["comm_elements"], ["losses"]
    compare(plan_run(flags, 2), out[0][i])          # planned vs measured, per quantity

`Counters` is an observer for `reference_run.run_train` (the script calls its `on_build`, `on_step` and
`on_end`): parameters are the local bytes of `model.parameters()` (a DTensor's shard); gradients and
AdamW's state are read by optimizer step hooks (registered for the run, removed after it) just before
and after each step; activations are the unique storages autograd saves from the first micro-batch's
forward through its loss (parameters and views of them excluded), stopped when backward reaches the
logits; communication is counted per step by FSDP2's collective hooks (`fsdp.TrafficCounter`) or a
DDP comm hook (one bucket all-reduce = its elements); `block_forwards` counts each block's forwards in the
first step (K micro-batches: K, or 2K where backward recomputes it: the recomputation policy that ran). Replaces the lesson's old measurement harness.
Lesson 11.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from m11_helpers.memory import SavedTensors
from m11_helpers.models import Block

__all__ = ["local_bytes", "Counters", "sweep", "compare", "QUANTITIES"]

QUANTITIES = ("parameters", "gradients", "optimizer", "activations", "comm_elements")


def local_bytes(tensors) -> int:
    """Bytes this rank stores: a DTensor's local shard, a plain tensor whole (numel × element size)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]
    return sum(t.numel() * t.element_size() for t in local)


class Counters:
    """An observer for `run_train(..., observer=Counters())`: bytes per rank and elements moved per step."""

    def __init__(self):
        self.values = {k: 0 for k in QUANTITIES}
        self.per_step: list[int] = []
        self._tracker = SavedTensors()
        self._recording, self._done, self._handles, self._counted = False, False, [], 0

    # -- the script's calls ------------------------------------------------------------------------
    def on_build(self, model: nn.Module) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.values["parameters"] = local_bytes(model.parameters())
        self._traffic = self._count_traffic(model)
        blocks = [m for m in model.modules() if isinstance(m, Block)]  # TinyGPT's, in order (FSDP2 subclasses them)
        self.values["block_forwards"] = forwards = [0] * len(blocks)
        for i, block in enumerate(blocks):  # its first layer runs once per forward, again when backward recomputes it
            self._handles.append(block.ln_1.register_forward_pre_hook(
                lambda m, a, i=i: forwards.__setitem__(i, forwards[i] + (not self.per_step))))
        # Pushed for the whole run (balanced in on_end): a no-op except while one micro-batch is recorded.
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        self._handles += [
            model.register_forward_pre_hook(self._start), model.register_forward_hook(self._until_backward),
            register_optimizer_step_pre_hook(
                lambda opt, *_: self.values.update(gradients=local_bytes(p.grad for g in opt.param_groups
                                                                         for p in g["params"]))),
            register_optimizer_step_post_hook(
                lambda opt, *_: self.values.update(optimizer=local_bytes(
                    t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)))),
        ]

    def on_step(self, record: dict) -> None:
        total = self._traffic()
        self.per_step.append(total - self._counted)  # elements this step moved
        self._counted = total
        self.values["comm_elements"] = self.per_step[-1]

    def on_end(self, model: nn.Module) -> None:
        self.close()

    def close(self) -> None:
        """Remove every hook (also after a failed run)."""
        if self._handles:
            self._hooks.__exit__(None, None, None)
            for h in self._handles:
                h.remove()
            self._handles = []
        self.values["activations"] = self._tracker.bytes
        self._tracker.release()

    # -- activations of one micro-batch ------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self._recording and not isinstance(t._base if t._base is not None else t, nn.Parameter):
            self._tracker._pack(t)  # unique storages, counted once, whole
        return t

    def _start(self, module, args) -> None:
        self._recording = not self._done

    def _until_backward(self, module, args, out) -> None:
        if self._recording and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(self._stop)  # the logits' gradient: backward has begun, the loss is saved

    def _stop(self, grad):
        self._recording, self._done = False, True
        return grad

    # -- communication -----------------------------------------------------------------------------
    @staticmethod
    def _count_traffic(model: nn.Module):
        from torch.distributed.fsdp import FSDPModule

        if any(isinstance(m, FSDPModule) for m in model.modules()):
            from m11_helpers.fsdp import TrafficCounter

            counter = TrafficCounter().attach(model)
            return counter.elements
        if isinstance(model, nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            seen = [0]

            def hook(state, bucket):  # DDP's own all-reduce (sum, then ÷N), counted
                seen[0] += bucket.buffer().numel()
                return default_hooks.allreduce_hook(state, bucket)

            model.register_comm_hook(None, hook)
            return lambda: seen[0]
        return lambda: 0


def sweep(configs: list[list]) -> list[dict]:
    """On each rank (through `launch`): the reference script once per argv, counted; one result per run."""
    from m11_helpers.reference_run import run_train

    out = []
    for argv in configs:
        counters = Counters()
        try:
            r = run_train(*argv, observer=counters)
        finally:
            counters.close()
        steady = [h["seconds"] for h in r["history"][1:]] or [h["seconds"] for h in r["history"]]
        out.append({"argv": [str(a) for a in argv], **counters.values, "comm_per_step": counters.per_step,
                    "losses": r["losses"], "checksum": r["checksum"], "step_s": statistics.median(steady)})
    return out


def compare(planned: dict, measured: dict, keys=QUANTITIES) -> list[dict]:
    """Planned vs measured per quantity, with measured / planned − 1."""
    rows = []
    for k in keys:
        p, m = planned[k], measured[k]
        rows.append({"what": k, "planned": p, "measured": m, "error": (m / p - 1) if p else float(m != 0)})
    return rows
