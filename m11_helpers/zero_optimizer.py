"""ZeRO-1 from scratch: each rank keeps and updates only its 1/N slice of AdamW's state (lesson 05).

    opt = ShardedAdamW(model.parameters(), lr=1e-3)   # inside a rank started by launch()
    loss.backward(); opt.step(); opt.zero_grad()      # no DDP wrapper: step() syncs the gradients
    torch.save(opt.state_dict(), f"rank{r}.pt")       # each rank its shard; any world size can load them
    opt.load_state_dict([torch.load(f) for f in files])   # m11_helpers.zero_resume reads only the overlapping ones

The parameters are viewed as one flat vector of Ψ elements, padded to N·⌈Ψ/N⌉; rank r owns
elements [r·S, (r+1)·S) with S = ⌈Ψ/N⌉ (Rajbhandari et al. 2020, §5.1 "P_os"). A step is
1. reduce-scatter the flat gradient (sum, then ÷N): rank r receives only the averaged gradient of
   its own slice — Ψ elements moved, half of DDP's all-reduce (§7.2.1);
2. AdamW on that slice, with exp_avg / exp_avg_sq (and an fp32 master copy when the model is
   16-bit) allocated for S elements only: 8S or 12S bytes, the formula's KΨ/N;
3. all-gather the updated slices so every rank again holds all the parameters — another Ψ.
The update arithmetic mirrors `torch.optim.AdamW(foreach=False)` line by line (torch/optim/adamw.py,
`_single_tensor_adam` with decoupled weight decay), which makes it bitwise comparable.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.distributed as dist

from m11_helpers.collectives import backend_all_gather, backend_reduce_scatter
from m11_helpers.compare import max_diff
from m11_helpers.launch.base import rank_device
from m11_helpers.validate import non_negative_real

__all__ = ["ShardedAdamW", "adamw_update", "compare_with_adamw", "zero_redundancy_report",
           "import_zero_redundancy_optimizer"]


def adamw_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """θ ← θ(1-λη) - η·m̂/(√v̂ + ε), in place, as torch.optim.AdamW does it (Loshchilov & Hutter 2019, Alg 2)."""
    param.mul_(1 - lr * weight_decay)  # decoupled weight decay, applied before the Adam step
    exp_avg.lerp_(grad, 1 - beta1)  # m ← β1·m + (1-β1)·g
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v ← β2·v + (1-β2)·g²
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class ShardedAdamW:
    """ZeRO-1 AdamW: state for ⌈Ψ/N⌉ elements per rank; gradients reduce-scattered, parameters all-gathered."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 group: dist.ProcessGroup | None = None):
        non_negative_real("lr", lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params must contain at least one parameter that requires grad")
        self.lr, self.betas, self.eps, self.weight_decay, self.group = lr, betas, eps, weight_decay, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.numel = sum(p.numel() for p in self.params)  # Ψ
        self.shard_size = math.ceil(self.numel / self.world_size)  # S = ⌈Ψ/N⌉, the padded slice every rank owns
        start = self.rank * self.shard_size
        self.dtype = self.params[0].dtype
        flat = self._flat([p.detach() for p in self.params])  # (N·S,)
        # 16-bit model: the slice's fp32 master copy is optimizer state too (the paper's K = 12)
        self.master = flat[start:start + self.shard_size].float().clone() if self.dtype != torch.float32 else None
        self.exp_avg = flat.new_zeros(self.shard_size, dtype=torch.float32)  # (S,) on the parameters' device
        self.exp_avg_sq = flat.new_zeros(self.shard_size, dtype=torch.float32)  # (S,)
        self.step_count = 0

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate and zero-pad to N·S elements, so the vector splits into equal slices."""
        flat = torch.cat([t.reshape(-1) for t in tensors])  # (Ψ,)
        return torch.nn.functional.pad(flat, (0, self.shard_size * self.world_size - self.numel))  # (N·S,)

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (measured from the tensors, not computed)."""
        tensors = [self.exp_avg, self.exp_avg_sq] + ([self.master] if self.master is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def state_dict(self) -> dict:
        """This rank's shard of the state, placed by its offset in the flat vector (each rank saves its own).

        The padding past Ψ is not state; `start` and the hyperparameters let `load_state_dict` cut the
        same vector differently on another world size (resharding: AdamW is element-wise, so any cut works).
        """
        start = self.rank * self.shard_size
        keep = max(0, min(self.shard_size, self.numel - start))  # the last slices end in padding
        tensors = {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        if self.master is not None:
            tensors["master"] = self.master
        return {"step": self.step_count, "numel": self.numel, "start": start, "world_size": self.world_size,
                "lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay,
                "state": {k: t[:keep].detach().clone() for k, t in tensors.items()}}

    def load_state_dict(self, shards: dict | list[dict]) -> None:
        """Restore from one saved shard (same world size) or from saved shards of any world size covering my slice."""
        shards = [shards] if isinstance(shards, dict) else list(shards)
        if not shards:
            raise ValueError("shards must hold at least one state_dict()")
        for sd in shards:
            if sd["numel"] != self.numel:
                raise ValueError(f"shards hold state for {sd['numel']} elements, these parameters have {self.numel}")
        if len({sd["step"] for sd in shards}) != 1:
            raise ValueError(f"shards come from different steps: {sorted({sd['step'] for sd in shards})}")
        if any(("master" in sd["state"]) != (self.master is not None) for sd in shards):
            raise ValueError("shards and optimizer disagree on the fp32 master copy (a 16-bit model has one)")
        lo = self.rank * self.shard_size
        hi = min(lo + self.shard_size, self.numel)  # my slice, without padding
        covered = 0
        for sd in shards:
            a = max(lo, sd["start"])
            b = min(hi, sd["start"] + sd["state"]["exp_avg"].numel())
            if a >= b:
                continue  # a saved slice beside mine
            covered += b - a
            for name, t in sd["state"].items():
                getattr(self, name)[a - lo:b - lo].copy_(t[a - sd["start"]:b - sd["start"]])
        if covered != max(0, hi - lo):
            raise ValueError(f"shards cover {covered} of the {max(0, hi - lo)} elements of rank {self.rank}'s "
                             "slice: pass every saved shard that overlaps it")
        self.step_count = shards[0]["step"]
        self.lr, self.betas, self.eps, self.weight_decay = (shards[0][k] for k in ("lr", "betas", "eps",
                                                                                    "weight_decay"))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        n, s = self.world_size, self.shard_size
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat_grad = self._flat(grads)  # (N·S,) this rank's local gradient, every slice
        grad_shard = flat_grad.new_empty(s)  # (S,) on the gradients' device: NCCL takes no CPU buffer
        backend_reduce_scatter(grad_shard, flat_grad, group=self.group)  # sums; *_single or the older name
        grad_shard = grad_shard.float().div_(n)  # the average, as DDP would have it
        start = self.rank * s
        if self.master is not None:
            param_shard = self.master  # (S,) fp32, updated in place
        else:
            param_shard = self._flat([p.detach() for p in self.params])[start:start + s].clone()  # (S,)
        self.step_count += 1
        b1, b2 = self.betas
        adamw_update(param_shard, grad_shard, self.exp_avg, self.exp_avg_sq, self.step_count,
                     self.lr, b1, b2, self.eps, self.weight_decay)
        full = param_shard.new_empty(n * s, dtype=self.dtype)  # (N·S,)
        backend_all_gather(full, param_shard.to(self.dtype), group=self.group)
        offset = 0
        for p in self.params:  # unflatten: every rank holds the full, updated parameters again
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def compare_with_adamw(steps: int = 3, lr: float = 1e-2, batch: int = 8, seed: int = 0,
                       sizes: tuple[int, ...] | None = None) -> dict:
    """Run on each rank (via `launch`): ShardedAdamW vs torch.optim.AdamW fed the same averaged gradients.

    The reference averages each rank's gradient with all_reduce (what DDP does) and steps a full,
    unsharded AdamW. Model: the tiny GPT, or `mlp(sizes)` when `sizes` is given (to try Ψ % N != 0).
    Returns whether every parameter is bitwise equal, the largest difference, and the state bytes.
    """
    from m11_helpers.models import mlp, tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()

    def build():
        return tiny_gpt(seed) if sizes is None else mlp(sizes, seed=seed)

    dev = rank_device()  # this rank's GPU under NCCL
    model, ref = build().to(dev), build().to(dev)
    opt = ShardedAdamW(model.parameters(), lr=lr)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=1e-2, foreach=False)
    gen = torch.Generator().manual_seed(seed + 1)
    if sizes is None:  # m11: cpu-only - drawn on the CPU generator (the same on every machine), moved to dev below
        data = torch.randint(0, 64, (batch, 32), generator=gen)  # (batch, T)
        loss_fn = lambda m, x: m(x, x)  # noqa: E731 - next-token loss on the tokens themselves
    else:  # m11: cpu-only - as above
        data = torch.randn(batch, sizes[0], generator=gen)  # (batch, d_in)
        loss_fn = lambda m, x: m(x).pow(2).mean()  # noqa: E731
    local = data.chunk(n)[rank].to(dev)  # (batch/N, ...) this rank's share
    for _ in range(steps):
        loss_fn(model, local).backward()
        opt.step()
        opt.zero_grad()
        loss_fn(ref, local).backward()
        grads = [p.grad for p in ref.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])  # (Ψ,) one all-reduce, as DDP's buckets do
        dist.all_reduce(flat)
        for g, avg in zip(grads, flat.div_(n).split([g.numel() for g in grads])):
            g.copy_(avg.view_as(g))
        ref_opt.step()
        ref_opt.zero_grad()
    pairs = list(zip(model.parameters(), ref.parameters()))
    full_state = sum(t.numel() * t.element_size() for s in ref_opt.state.values()
                     for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    # Adam's update barely notices a gradient off by a constant factor (m/√v is scale-free); its momentum does
    ref_m = opt._flat([ref_opt.state[p]["exp_avg"] for p in ref.parameters()])  # (N·S,)
    start = rank * opt.shard_size
    return {"rank": rank, "world_size": n, "num_params": opt.numel, "shard_size": opt.shard_size,
            "exp_avg": opt.exp_avg.clone(), "ref_exp_avg": ref_m[start:start + opt.shard_size].clone(),
            "bitwise_equal": all(torch.equal(a, b) for a, b in pairs),
            "max_abs_diff": max_diff([a for a, _ in pairs], [b for _, b in pairs]),
            "state_bytes": opt.state_bytes(), "adamw_state_bytes": full_state,
            "params": [p.detach().clone() for p in model.parameters()],
            "ref_params": [p.detach().clone() for p in ref.parameters()]}


def import_zero_redundancy_optimizer():
    """`torch.distributed.optim.ZeroRedundancyOptimizer`, imported without torch's own internal warning.

    Importing `torch.distributed.optim` (torch 2.13) runs `@torch.jit.script` on its functional
    optimizers, which warns that `torch.jit.script` is deprecated: torch's internals, not an API
    this course uses, so those warnings (`jit.script`, `jit.interface`) are silenced here; the test
    suite would turn them into errors.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated.*", category=DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer


def zero_redundancy_report(steps: int = 2, lr: float = 1e-2, batch: int = 8, seed: int = 0) -> dict:
    """Run on each rank: torch's ZeroRedundancyOptimizer(AdamW) under DDP vs plain AdamW under DDP."""
    ZeroRedundancyOptimizer = import_zero_redundancy_optimizer()
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.models import tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()
    model, ref = DDP(tiny_gpt(seed)), DDP(tiny_gpt(seed))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr, foreach=False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, foreach=False)
    x = torch.randint(0, 64, (batch, 32), generator=torch.Generator().manual_seed(seed + 1)).chunk(n)[rank]
    for _ in range(steps):
        for m, o in ((model, opt), (ref, ref_opt)):
            m(x, x).backward()
            o.step()
            o.zero_grad()
    state = sum(t.numel() * t.element_size() for s in opt.optim.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    out = {"rank": rank, "state_bytes": state,
           "params_on_rank": sum(p.numel() for g in opt.optim.param_groups for p in g["params"]),
           "bitwise_equal": all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))}
    del model, ref  # live DDP models at exit can abort the process (docs/cpu-distributed-facts.md)
    return out
