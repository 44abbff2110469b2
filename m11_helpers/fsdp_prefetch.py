"""Lesson 05 — FSDP built by hand as practitioners run it: layer-wise shards, prefetched all-gathers, cast before the wire.

    net = PrefetchFSDP(layers, prefetch=2, compute_dtype=torch.bfloat16)   # on each rank, after launch
    loss = net(x_local, y_local); loss.backward()                          # grads land on the fp32 shards
    net.log, net.wire_dtypes, net.max_ahead, net.peak_full_layers            # what a check looks at
    reference_grads(layers, x, y, compute_dtype)                             # the one-process answer

Each layer's weight and bias are one flat fp32 vector, padded to a multiple of N and cut in N
shards: rank r keeps shard r (the fp32 master, the only copy of the parameters). Before layer i
computes, its all-gather must have arrived; the all-gathers of layers i+1 … i+prefetch are *issued*
(async) before layer i computes, so the wire works while the layer does, and each is *waited* just
before its layer runs (FSDP2's forward prefetch; Zhao et al. 2023 "PyTorch FSDP" §3.3; CS336 2026
assignment 2). The shard is cast to the compute dtype *before* the all-gather, so the wire carries
2 bytes per parameter, not 4 (FSDP2's MixedPrecisionPolicy(param_dtype) does the same). After its
forward a layer's full parameters are dropped (reshard after forward); backward gathers them again
in reverse order, with the same prefetch, and reduce-scatters each layer's gradient in fp32 (upcast
first: a sum of N bf16 gradients loses bits — MixedPrecisionPolicy(reduce_dtype=torch.float32)),
averaged over ranks, into the shard's .grad. At most 1 + prefetch layers are ever whole at once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from m11_helpers.validate import one_of, positive_int

__all__ = ["PrefetchFSDP", "reference_grads", "shard_numel", "make_layers", "batch", "run_prefetch"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_numel(numel: int, world: int) -> int:
    """Elements per shard: ⌈numel / N⌉ (the flat vector is padded to N shards of equal size)."""
    return -(-positive_int("numel", numel) // positive_int("world", world))


def make_layers(widths: tuple[int, ...] = (16, 32, 32, 32, 8), seed: int = 0) -> list[nn.Linear]:
    """The Linear layers of an MLP (tanh between them), seeded: the model every rank and the reference build."""
    torch.manual_seed(seed)
    return [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]


def _gather_fn():
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 name first


def _scatter_fn():
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _LoggedWork:
    """An async all-gather's handle that logs ("wait", layer, phase) when anyone waits on it: an eager wait shows."""

    def __init__(self, work, log: list, i: int, phase: str):
        self.work, self.log, self.i, self.phase = work, log, i, phase

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self):
        self.log.append(("wait", self.i, self.phase))
        return self.work.wait()


class _Layer(torch.autograd.Function):
    """y = x Wᵀ + b with W, b gathered on demand; backward gathers again and reduce-scatters dW, db."""

    @staticmethod
    def forward(ctx, x, shard, net, i):
        w, b = net._full(i, "forward")  # (out, in), (out,) in the compute dtype
        ctx.save_for_backward(x)  # the activation; the parameters are NOT saved (they are freed now)
        ctx.net, ctx.i = net, i
        y = F.linear(x.to(w.dtype), w, b)  # (B, out)
        net._free(i)
        return y

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        net, i = ctx.net, ctx.i
        w, _ = net._full(i, "backward")
        gy = gy.to(w.dtype)  # (B, out)
        gx = gy @ w  # (B, in)
        gw = gy.T @ x.to(w.dtype)  # (out, in)
        gb = gy.sum(0)  # (out,)
        net._free(i)
        flat = torch.cat([gw.reshape(-1), gb]).float()  # fp32 BEFORE the reduction: N bf16 addends lose bits
        flat = F.pad(flat, (0, net.padded[i] - flat.numel()))
        g_shard = torch.empty(net.shards[i].numel(), dtype=torch.float32, device=flat.device)
        _scatter_fn()(g_shard, flat, group=net.group)
        net.wire_dtypes.append(("reduce_scatter", i, g_shard.dtype))
        net.log.append(("reduce_scatter", i, "backward"))
        return gx.to(x.dtype), g_shard / net.world, None, None


class PrefetchFSDP(nn.Module):
    """An MLP whose Linear layers are sharded over the ranks, gathered `prefetch` layers ahead (1 or 2)."""

    def __init__(self, layers: list[nn.Linear], prefetch: int = 1, compute_dtype: str | torch.dtype = "bfloat16",
                 group=None):
        super().__init__()
        if not layers or not all(isinstance(layer, nn.Linear) and layer.bias is not None for layer in layers):
            raise ValueError("layers must be a non-empty list of nn.Linear with bias")
        self.prefetch = int(one_of("prefetch", prefetch, (0, 1, 2)))
        name = compute_dtype if isinstance(compute_dtype, str) else str(compute_dtype).removeprefix("torch.")
        self.dtype = _DTYPES[one_of("compute_dtype", name, tuple(_DTYPES))]
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.shapes = [(tuple(layer.weight.shape), layer.bias.numel()) for layer in layers]
        self.padded, shards = [], []
        for layer in layers:
            flat = torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()]).float()  # fp32 master
            n = shard_numel(flat.numel(), self.world)
            self.padded.append(n * self.world)
            shards.append(nn.Parameter(F.pad(flat, (0, n * self.world - flat.numel()))[self.rank * n:(self.rank + 1) * n].clone()))
        self.shards = nn.ParameterList(shards)
        self.log: list[tuple[str, int, str]] = []  # (event, layer, phase): issue / wait / compute / free
        self.wire_dtypes: list[tuple[str, int, torch.dtype]] = []
        self.max_ahead = 0  # most all-gathers in flight (issued, not waited) while a layer computes
        self.peak_full_layers = 0  # most layers whole at once
        self.ready_at_wait: list[bool] = []  # per wait: had the gather already arrived (its time hidden)?
        self._pending: dict[int, tuple] = {}
        self._full_now: set[int] = set()

    def _issue(self, i: int, phase: str) -> None:
        if i in self._pending or i in self._full_now or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # cast BEFORE the wire: 2 bytes per element in bf16
        out = torch.empty(self.padded[i], dtype=self.dtype, device=send.device)
        work = _LoggedWork(_gather_fn()(out, send, group=self.group, async_op=True), self.log, i, phase)
        self.wire_dtypes.append(("all_gather", i, send.dtype))
        self.log.append(("issue", i, phase))
        self._pending[i] = (work, out)

    def _full(self, i: int, phase: str) -> tuple[torch.Tensor, torch.Tensor]:
        step = 1 if phase == "forward" else -1
        self._issue(i, phase)  # not prefetched (the first layer, or prefetch=0): issue now
        for k in range(1, self.prefetch + 1):  # issue the next layers' gathers before this one computes
            self._issue(i + step * k, phase)
        work, out = self._pending.pop(i)
        self.ready_at_wait.append(work.is_completed())
        work.wait()  # just before use (logged by the handle)
        self._full_now.add(i)
        self.peak_full_layers = max(self.peak_full_layers, len(self._full_now) + len(self._pending))
        self.max_ahead = max(self.max_ahead, len(self._pending))
        self.log.append(("compute", i, phase))
        (o, n_in), n_b = self.shapes[i]
        return out[:o * n_in].view(o, n_in), out[o * n_in:o * n_in + n_b]

    def _free(self, i: int) -> None:
        self._full_now.discard(i)  # the gathered buffer goes with the last reference: resharded
        self.log.append(("free", i, ""))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean-squared error of the MLP on this rank's batch; backward fills each shard's .grad."""
        h = x  # (B, in)
        for i, shard in enumerate(self.shards):
            h = _Layer.apply(h, shard, self, i)  # (B, width)
            if i < len(self.shards) - 1:
                h = torch.tanh(h)
        return F.mse_loss(h.float(), y)


def reference_grads(layers: list[nn.Linear], x: torch.Tensor, y: torch.Tensor,
                    compute_dtype: torch.dtype = torch.float32) -> tuple[float, list[torch.Tensor]]:
    """One process, the whole batch: the loss and each layer's flat fp32 gradient (weight then bias)."""
    h = x
    params = [(layer.weight.detach().clone().requires_grad_(True), layer.bias.detach().clone().requires_grad_(True))
              for layer in layers]
    for i, (w, b) in enumerate(params):
        h = F.linear(h.to(compute_dtype), w.to(compute_dtype), b.to(compute_dtype))  # (B, out)
        if i < len(params) - 1:
            h = torch.tanh(h)
    loss = F.mse_loss(h.float(), y)
    loss.backward()
    return loss.item(), [torch.cat([w.grad.reshape(-1), b.grad]) for w, b in params]


def batch(n: int = 16, widths: tuple[int, ...] = (16, 32, 32, 32, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch, seeded: (n, in) inputs and (n, out) targets; rank r trains on rows r::N."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, widths[0], generator=g), torch.randn(n, widths[-1], generator=g)  # (n, in), (n, out)


def run_prefetch(configs: list[tuple[int, str]], seed: int = 0) -> list[dict]:
    """On each rank (via `launch`): one step per (prefetch, compute dtype); what a check needs to see.

    Returns per config: the loss (averaged over ranks), every layer's full fp32 gradient (the shards
    all-gathered after the step, outside what is measured), the event log, the dtypes on the wire, the
    prefetch depth reached, the most layers whole at once, and the tensor bytes alive at the peak of
    forward and of backward (`m11_helpers.live_memory`).
    """
    from m11_helpers.gather_watch import watch_gathers
    from m11_helpers.launch import rank_device
    from m11_helpers.live_memory import track_live_bytes

    device = rank_device()
    out = []
    for prefetch, dtype in configs:
        layers = [layer.to(device) for layer in make_layers(seed=seed)]
        net = PrefetchFSDP(layers, prefetch, dtype)
        x, y = batch()
        x, y = x[net.rank::net.world].to(device), y[net.rank::net.world].to(device)  # (n/N, in), (n/N, out): this rank's rows
        with torch.autograd.set_multithreading_enabled(False), watch_gathers(1 + prefetch) as w, \
                track_live_bytes() as mem:  # backward in this thread, where the watch is (a GPU's runs in another)
            loss = net(x, y)
            mem.phase("backward")
            w.phase("backward")
            loss.backward()
        grads = []
        for i, shard in enumerate(net.shards):
            full = torch.empty(net.padded[i], dtype=torch.float32, device=device)
            _gather_fn()(full, shard.grad, group=net.group)
            (o, n_in), n_b = net.shapes[i]
            grads.append(full[:o * n_in + n_b].cpu())
        total = loss.detach().clone()
        dist.all_reduce(total)
        out.append({"prefetch": prefetch, "dtype": dtype, "loss": total.item() / net.world, "grads": grads,
                    "log": list(net.log), "wire": list(net.wire_dtypes), "max_ahead": net.max_ahead,
                    "peak_full_layers": net.peak_full_layers, "ready_at_wait": list(net.ready_at_wait),
                    "forward_peak": mem.peaks["start"],
                    "backward_peak": mem.peaks["backward"],
                    "layer_bytes": [p * net.dtype.itemsize for p in net.padded],
                    "watched": {"ahead": (w.max_in_flight("forward"), w.max_in_flight("backward")),
                                "alive": w.max_alive(), "gathers": w.gathers(), "sync": w.sync_gathers,
                                "unwaited": w.unwaited, "dtypes": (w.dtypes("all_gather"), w.dtypes("reduce_scatter"))}})
    return out
