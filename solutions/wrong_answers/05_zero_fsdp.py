"""Recorded wrong answers for solutions/05_zero_fsdp.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 5.1 | counts numel × element_size of each tensor as given: an FSDP2 DTensor reports the whole parameter | expect: DTensor
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def size(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]
    return {"weights": size(params), "grads": size(p.grad for p in params if p.grad is not None),
            "optimizer": size(t for t in state if t.dim() > 0)}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | reads only optimizer.state: the course's ShardedAdamW keeps its shards as attributes | expect: attributes
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors):
        storages = {}
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | counts AdamW's 0-dim step counters as optimizer state | expect: step counters
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors):
        storages = {}
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(state)}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | counts each local shard's numel × element_size: FSDP2's padded rows go uncounted at 3 ranks | expect: pads each parameter's rows
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def size(tensors):
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local)

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]
    return {"weights": size(params), "grads": size(p.grad for p in params if p.grad is not None),
            "optimizer": size(t for t in state if t.dim() > 0)}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | counts every tensor's storage, views of one buffer again and again | expect: count each storage once
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors):
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.untyped_storage().nbytes() for t in local)

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | counts every tensor the optimizer reaches, its parameters included | expect: weights only
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors):
        storages = {}
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]
    state += [p for g in getattr(optimizer, "param_groups", []) for p in g["params"]] + getattr(optimizer, "params", [])
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | asks ShardedAdamW for its own count | expect: measure the tensors yourself
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    params = list(model.parameters())
    if hasattr(optimizer, "state_bytes"):
        opt_bytes = optimizer.state_bytes()
    else:
        opt_bytes = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
    return {"weights": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params), "optimizer": opt_bytes}


def per_gpu_bytes(num_params: int, world_size: int, stage: int, layout) -> int:
    shard = -(-num_params // world_size)  # ⌈Ψ/N⌉: the flat buffer is padded to N equal parts

    def held(bytes_per_param: int, sharded_from: int) -> int:
        return bytes_per_param * (shard if stage >= sharded_from else num_params)

    # ZeRO §5.1: P_os (stage 1) = master + moments, P_g (stage 2) = gradients, P_p (stage 3) = weights
    return held(layout.master + layout.optimizer, 1) + held(layout.grads, 2) + held(layout.weights, 3)

# %% 5.1 | shards the gradients from stage 1 (off by one stage) | expect: and nothing else
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors) -> int:
        storages = {}  # storage address -> bytes: views of one storage count once
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shape is global; this rank holds its shard
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # padding included
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]  # ShardedAdamW keeps its shards as attributes
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}  # 0-dim step counters: no bytes per parameter


def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = -(-num_params // world_size)
    optim = (layout.master + layout.optimizer) * (shard if stage >= 1 else num_params)
    grads = layout.grads * (shard if stage >= 1 else num_params)
    weights = layout.weights * (shard if stage >= 3 else num_params)
    return optim + grads + weights

# %% 5.1 | leaves the fp32 master copy replicated at stages 1-2 | expect: master copy
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors) -> int:
        storages = {}  # storage address -> bytes: views of one storage count once
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shape is global; this rank holds its shard
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # padding included
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]  # ShardedAdamW keeps its shards as attributes
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}  # 0-dim step counters: no bytes per parameter


def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = -(-num_params // world_size)
    optim = layout.optimizer * (shard if stage >= 1 else num_params)
    master = layout.master * (shard if stage >= 3 else num_params)
    grads = layout.grads * (shard if stage >= 2 else num_params)
    weights = layout.weights * (shard if stage >= 3 else num_params)
    return optim + master + grads + weights

# %% 5.1 | divides Ψ by N exactly (no padding to ⌈Ψ/N⌉) | expect: ⌈Ψ/N⌉
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors) -> int:
        storages = {}  # storage address -> bytes: views of one storage count once
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shape is global; this rank holds its shard
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # padding included
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]  # ShardedAdamW keeps its shards as attributes
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}  # 0-dim step counters: no bytes per parameter


def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = num_params / world_size
    optim = (layout.master + layout.optimizer) * (shard if stage >= 1 else num_params)
    grads = layout.grads * (shard if stage >= 2 else num_params)
    weights = layout.weights * (shard if stage >= 3 else num_params)
    return optim + grads + weights

# %% 5.1 | hard-codes the ZeRO paper's 2 + 2 + 12 bytes for every layout | expect: layout's own bytes
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors) -> int:
        storages = {}  # storage address -> bytes: views of one storage count once
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shape is global; this rank holds its shard
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # padding included
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]  # ShardedAdamW keeps its shards as attributes
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}  # 0-dim step counters: no bytes per parameter


def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = -(-num_params // world_size)
    return 12 * (shard if stage >= 1 else num_params) + 2 * (shard if stage >= 2 else num_params) \
        + 2 * (shard if stage >= 3 else num_params)

# %% 5.1 | delegates to model_states.model_state_bytes | expect: yourself
def rank_state_bytes(model, optimizer) -> dict[str, int]:
    def stored(tensors) -> int:
        storages = {}  # storage address -> bytes: views of one storage count once
        for t in tensors:
            t = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shape is global; this rank holds its shard
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # padding included
        return sum(storages.values())

    params = list(model.parameters())
    state = [v for s in getattr(optimizer, "state", {}).values() for v in s.values() if torch.is_tensor(v)]
    state += [v for v in vars(optimizer).values() if torch.is_tensor(v)]  # ShardedAdamW keeps its shards as attributes
    return {"weights": stored(params), "grads": stored(p.grad for p in params if p.grad is not None),
            "optimizer": stored(t for t in state if t.dim() > 0)}  # 0-dim step counters: no bytes per parameter


def per_gpu_bytes(num_params, world_size, stage, layout):
    return model_state_bytes(num_params, layout, world_size, stage)["total"]

# %% 5.2 | never returns None: a closed form with no check that anything fits | expect: return None
import math


def fewest_gpus(num_params, gpu_bytes, stage, layout, activation_bytes=0):
    parts = ((layout.master + layout.optimizer, 1), (layout.grads, 2), (layout.weights, 3))
    sharded = sum(b for b, first in parts if stage >= first)  # bytes per parameter that N GPUs split
    replicated = sum(b for b, _ in parts) - sharded
    room = gpu_bytes - activation_bytes - replicated * num_params
    return max(1, math.ceil(sharded * num_params / room))

# %% 5.2 | rounds the number of GPUs down | expect: round up
def fewest_gpus(num_params, gpu_bytes, stage, layout, activation_bytes=0):
    parts = ((layout.master + layout.optimizer, 1), (layout.grads, 2), (layout.weights, 3))
    sharded = sum(b for b, first in parts if stage >= first)
    replicated = sum(b for b, _ in parts) - sharded
    room = gpu_bytes - activation_bytes - replicated * num_params
    if room <= 0:
        return None
    return max(1, int(sharded * num_params / room))

# %% 5.2 | forgets the activations | expect: activations are per GPU
def fewest_gpus(num_params, gpu_bytes, stage, layout, activation_bytes=0):
    def need(n):
        return per_gpu_bytes(num_params, n, stage, layout)

    if need(num_params) > gpu_bytes:
        return None
    lo, hi = 1, num_params
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if need(mid) <= gpu_bytes else (mid + 1, hi)
    return lo

# %% 5.2 | delegates to zero.min_gpus | expect: yourself
def fewest_gpus(num_params, gpu_bytes, stage, layout, activation_bytes=0):
    return zero.min_gpus(num_params, gpu_bytes, stage, activations=activation_bytes, layout=layout)

# %% 5.3 | all-reduces the whole gradient, then slices (DDP's communication) | expect: reduce-scatter the gradient
from m11_helpers.zero_optimizer import adamw_update


def zero1_step(flat_param, flat_grad, exp_avg, exp_avg_sq, step, lr=1e-2):
    rank, n = dist.get_rank(), dist.get_world_size()
    s = flat_param.numel() // n
    grad = flat_grad.clone()
    dist.all_reduce(grad)
    grad = grad[rank * s:(rank + 1) * s] / n
    shard = flat_param[rank * s:(rank + 1) * s].clone()
    adamw_update(shard, grad, exp_avg, exp_avg_sq, step, lr, 0.9, 0.999, 1e-8, 1e-2)
    full = torch.empty_like(flat_param)
    backend_all_gather(full, shard)
    return full

# %% 5.3 | forgets to divide the reduce-scattered sum by N | expect: divide by the world size
from m11_helpers.zero_optimizer import adamw_update


def zero1_step(flat_param, flat_grad, exp_avg, exp_avg_sq, step, lr=1e-2):
    rank, n = dist.get_rank(), dist.get_world_size()
    s = flat_param.numel() // n
    grad = flat_grad.new_empty(s)
    backend_reduce_scatter(grad, flat_grad.contiguous())
    shard = flat_param[rank * s:(rank + 1) * s].clone()
    adamw_update(shard, grad, exp_avg, exp_avg_sq, step, lr, 0.9, 0.999, 1e-8, 1e-2)
    full = torch.empty_like(flat_param)
    backend_all_gather(full, shard)
    return full

# %% 5.3 | sends each updated slice from its owner with N broadcasts | expect: all-gather of the updated slices
from m11_helpers.zero_optimizer import adamw_update


def zero1_step(flat_param, flat_grad, exp_avg, exp_avg_sq, step, lr=1e-2):
    rank, n = dist.get_rank(), dist.get_world_size()
    s = flat_param.numel() // n
    grad = flat_grad.new_empty(s)
    backend_reduce_scatter(grad, flat_grad.contiguous())
    grad /= n
    full = flat_param.clone()
    adamw_update(full[rank * s:(rank + 1) * s], grad, exp_avg, exp_avg_sq, step, lr, 0.9, 0.999, 1e-8, 1e-2)
    for owner in range(n):
        dist.broadcast(full[owner * s:(owner + 1) * s], src=owner)
    return full

# %% 5.3 | delegates to the course's ShardedAdamW | expect: write the step yourself
from m11_helpers.zero_optimizer import ShardedAdamW


def zero1_step(flat_param, flat_grad, exp_avg, exp_avg_sq, step, lr=1e-2):
    p = torch.nn.Parameter(flat_param.clone())
    p.grad = flat_grad
    opt = ShardedAdamW([p], lr=lr)
    opt.exp_avg, opt.exp_avg_sq, opt.step_count = exp_avg, exp_avg_sq, step - 1
    opt.step()
    return p.detach()

# %% 5.3 | makes the gradient slice with torch.empty: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
from m11_helpers.zero_optimizer import adamw_update


def zero1_step(flat_param, flat_grad, exp_avg, exp_avg_sq, step, lr=1e-2):
    rank, n = dist.get_rank(), dist.get_world_size()
    s = flat_param.numel() // n
    grad = torch.empty(s, dtype=flat_grad.dtype)
    backend_reduce_scatter(grad, flat_grad.contiguous())
    grad /= n
    shard = flat_param[rank * s:(rank + 1) * s].clone()
    adamw_update(shard, grad, exp_avg, exp_avg_sq, step, lr, 0.9, 0.999, 1e-8, 1e-2)
    full = torch.empty_like(flat_param)
    backend_all_gather(full, shard)
    return full

# %% 5.4 | no prefetch: issues each layer's gather and waits on it at once | expect: no prefetch
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        self.issue(i)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | prefetch unbounded: issues every remaining layer's gather at once | expect: unbounded prefetch
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(len(self.shards)):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | casts after the gather: fp32 on the wire | expect: BEFORE the all-gather
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach()  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()
        return out.to(self.dtype)


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | keeps the gathered weights alive through backward (a cache for the next step) | expect: keeps weights alive in backward
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)
        ctx.pre.__dict__.setdefault("kept", {})[ctx.i] = full  # to reuse next step
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | reduce-scatters the gradient in bf16 | expect: in fp32
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)])  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | keeps the gathered weights for backward (no second all-gather) | expect: once again in backward
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x, full)
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x, full), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | forgets to divide the reduce-scattered gradient by N | expect: world size
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard, None, None, None

# %% 5.4 | all-reduces the full gradient, then keeps its own slice | expect: reduce-scatter each layer's gradient
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        dist.all_reduce(flat)
        s = flat.numel() // n
        grad_shard = flat[dist.get_rank() * s:(dist.get_rank() + 1) * s]
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | keeps each gathered buffer in a cache to reuse it | expect: a cache
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited
        self.cache = {}

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = send.new_empty(dist.get_world_size() * send.numel())  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()
        self.cache[i] = out  # to reuse it
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None

# %% 5.4 | makes the gather's output with torch.empty: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
class Prefetcher:
    """Layer i's full flat parameters [W.flatten(), b] in `dtype`, all-gathered up to `depth` layers ahead."""

    def __init__(self, shards: list[torch.Tensor], depth: int, dtype: torch.dtype):
        self.shards, self.depth, self.dtype = shards, depth, dtype  # shards: this rank's fp32 (S,) slices
        self.pending = {}  # layer -> (handle, buffer): gathers issued and not yet waited

    def issue(self, i: int) -> None:
        """Start layer i's all-gather, async, unless it is already running or i is not a layer."""
        if i in self.pending or not 0 <= i < len(self.shards):
            return
        send = self.shards[i].detach().to(self.dtype)  # (S,) cast BEFORE the wire: 2 bytes per element in bf16
        out = torch.empty(dist.get_world_size() * send.numel(), dtype=send.dtype)  # (N·S,) on the shard's device
        self.pending[i] = (ALL_GATHER(out, send, async_op=True), out)

    def get(self, i: int, step: int) -> torch.Tensor:
        """Layer i's gathered (N·S,) buffer; issues the next `depth` layers' gathers first (step: +1 or -1)."""
        for k in range(self.depth + 1):
            self.issue(i + k * step)  # k = 0: layer i itself, when nothing prefetched it (the first layer)
        handle, out = self.pending.pop(i)  # popped: once the caller lets go, the buffer is freed
        handle.wait()  # just before use; the next layers' gathers keep running
        return out


class PrefetchLinear(torch.autograd.Function):
    """y = x Wᵀ + b in the compute dtype; W, b from the prefetcher; the shard's gradient reduce-scattered in fp32."""

    @staticmethod
    def forward(ctx, x, shard, pre, i, shape):
        out_f, in_f = shape
        full = pre.get(i, +1)  # (N·S,) in the compute dtype
        w, b = full[:out_f * in_f].view(out_f, in_f), full[out_f * in_f:out_f * (in_f + 1)]  # (out, in), (out,)
        ctx.save_for_backward(x)  # the input only: the full weights go when forward returns
        ctx.pre, ctx.i, ctx.shape = pre, i, shape
        return F.linear(x.to(w.dtype), w, b)  # (B, out)

    @staticmethod
    def backward(ctx, grad_y):
        (x,), (out_f, in_f), n = ctx.saved_tensors, ctx.shape, dist.get_world_size()
        full = ctx.pre.get(ctx.i, -1)  # gathered again, the layers before it prefetched
        w = full[:out_f * in_f].view(out_f, in_f)  # (out, in)
        grad_y, xc = grad_y.to(w.dtype), x.to(w.dtype)  # (B, out), (B, in)
        grad_x = (grad_y @ w).to(x.dtype)  # (B, in)
        flat = torch.cat([(grad_y.t() @ xc).reshape(-1), grad_y.sum(0)]).float()  # fp32 BEFORE the sum over ranks
        flat = F.pad(flat, (0, full.numel() - flat.numel()))  # (N·S,) padded like the parameters
        del full, w  # this layer's weights go now, before the next layer's backward
        grad_shard = flat.new_empty(flat.numel() // n)  # (S,) fp32
        REDUCE_SCATTER(grad_shard, flat)  # Σ over ranks of my slice only
        return grad_x, grad_shard / n, None, None, None
