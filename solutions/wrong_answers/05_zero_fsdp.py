"""Recorded wrong answers for solutions/05_zero_fsdp.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 5.1 | shards the gradients from stage 1 (off by one stage) | expect: and nothing else
def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = -(-num_params // world_size)
    optim = (layout.master + layout.optimizer) * (shard if stage >= 1 else num_params)
    grads = layout.grads * (shard if stage >= 1 else num_params)
    weights = layout.weights * (shard if stage >= 3 else num_params)
    return optim + grads + weights

# %% 5.1 | leaves the fp32 master copy replicated at stages 1-2 | expect: master copy
def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = -(-num_params // world_size)
    optim = layout.optimizer * (shard if stage >= 1 else num_params)
    master = layout.master * (shard if stage >= 3 else num_params)
    grads = layout.grads * (shard if stage >= 2 else num_params)
    weights = layout.weights * (shard if stage >= 3 else num_params)
    return optim + master + grads + weights

# %% 5.1 | divides Ψ by N exactly (no padding to ⌈Ψ/N⌉) | expect: ⌈Ψ/N⌉
def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = num_params / world_size
    optim = (layout.master + layout.optimizer) * (shard if stage >= 1 else num_params)
    grads = layout.grads * (shard if stage >= 2 else num_params)
    weights = layout.weights * (shard if stage >= 3 else num_params)
    return optim + grads + weights

# %% 5.1 | hard-codes the ZeRO paper's 2 + 2 + 12 bytes for every layout | expect: layout's own bytes
def per_gpu_bytes(num_params, world_size, stage, layout):
    shard = -(-num_params // world_size)
    return 12 * (shard if stage >= 1 else num_params) + 2 * (shard if stage >= 2 else num_params) \
        + 2 * (shard if stage >= 3 else num_params)

# %% 5.1 | delegates to model_states.model_state_bytes | expect: yourself
def per_gpu_bytes(num_params, world_size, stage, layout):
    return model_state_bytes(num_params, layout, world_size, stage)["total"]

# %% 5.2 | never returns None: a closed form with no check that anything fits | expect: return None
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

# %% 5.4 | keeps the gathered weights for backward (no second all-gather) | expect: gather them again in backward
def gather_layer(shard, out_features, in_features):
    full = shard.new_empty(dist.get_world_size() * shard.numel())
    backend_all_gather(full, shard)
    return full[:out_features * in_features].view(out_features, in_features), \
        full[out_features * in_features:out_features * (in_features + 1)]


class ZeRO3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        w, b = gather_layer(shard, out_features, in_features)
        ctx.save_for_backward(x, shard, w)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, grad_y):
        x, shard, w = ctx.saved_tensors
        n = dist.get_world_size()
        flat = torch.cat([(grad_y.t() @ x).reshape(-1), grad_y.sum(0)])
        flat = F.pad(flat, (0, n * shard.numel() - flat.numel()))
        grad_shard = torch.empty_like(shard)
        backend_reduce_scatter(grad_shard, flat)
        return grad_y @ w, grad_shard / n, None, None

# %% 5.4 | forgets to divide the reduce-scattered gradient by N | expect: divide by the world size
def gather_layer(shard, out_features, in_features):
    full = shard.new_empty(dist.get_world_size() * shard.numel())
    backend_all_gather(full, shard)
    return full[:out_features * in_features].view(out_features, in_features), \
        full[out_features * in_features:out_features * (in_features + 1)]


class ZeRO3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        w, b = gather_layer(shard, out_features, in_features)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        w, _ = gather_layer(shard, *ctx.shape)
        n = dist.get_world_size()
        flat = torch.cat([(grad_y.t() @ x).reshape(-1), grad_y.sum(0)])
        flat = F.pad(flat, (0, n * shard.numel() - flat.numel()))
        grad_shard = torch.empty_like(shard)
        backend_reduce_scatter(grad_shard, flat)
        return grad_y @ w, grad_shard, None, None

# %% 5.4 | all-reduces the full gradient, then keeps its own slice | expect: reduce-scatter the parameters' gradient
def gather_layer(shard, out_features, in_features):
    full = shard.new_empty(dist.get_world_size() * shard.numel())
    backend_all_gather(full, shard)
    return full[:out_features * in_features].view(out_features, in_features), \
        full[out_features * in_features:out_features * (in_features + 1)]


class ZeRO3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        w, b = gather_layer(shard, out_features, in_features)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        w, _ = gather_layer(shard, *ctx.shape)
        rank, n, s = dist.get_rank(), dist.get_world_size(), shard.numel()
        flat = torch.cat([(grad_y.t() @ x).reshape(-1), grad_y.sum(0)])
        flat = F.pad(flat, (0, n * s - flat.numel()))
        dist.all_reduce(flat)
        return grad_y @ w, flat[rank * s:(rank + 1) * s] / n, None, None

# %% 5.4 | keeps one gather buffer per layer alive to reuse it (a cache) | expect: free each layer's gathered parameters
_buffers = {}


def gather_layer(shard, out_features, in_features):
    key = shard.data_ptr()  # one buffer per layer, allocated once, reused in backward and in the next step
    if key not in _buffers:
        _buffers[key] = shard.new_empty(dist.get_world_size() * shard.numel())
    full = _buffers[key]
    backend_all_gather(full, shard)
    return full[:out_features * in_features].view(out_features, in_features), \
        full[out_features * in_features:out_features * (in_features + 1)]


class ZeRO3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        w, b = gather_layer(shard, out_features, in_features)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        w, _ = gather_layer(shard, *ctx.shape)
        n = dist.get_world_size()
        flat = torch.cat([(grad_y.t() @ x).reshape(-1), grad_y.sum(0)])
        flat = F.pad(flat, (0, n * shard.numel() - flat.numel()))
        grad_shard = torch.empty_like(shard)
        backend_reduce_scatter(grad_shard, flat)
        return grad_y @ w, grad_shard / n, None, None

# %% 5.4 | gathers into a list of chunks, then torch.cat (the layer held twice) | expect: holds the layer twice
def gather_layer(shard, out_features, in_features):
    chunks = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(chunks, shard)
    full = torch.cat(chunks)  # a second full copy while the chunks are still alive
    return full[:out_features * in_features].view(out_features, in_features), \
        full[out_features * in_features:out_features * (in_features + 1)]


class ZeRO3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        w, b = gather_layer(shard, out_features, in_features)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        w, _ = gather_layer(shard, *ctx.shape)
        n = dist.get_world_size()
        flat = torch.cat([(grad_y.t() @ x).reshape(-1), grad_y.sum(0)])
        flat = F.pad(flat, (0, n * shard.numel() - flat.numel()))
        grad_shard = torch.empty_like(shard)
        backend_reduce_scatter(grad_shard, flat)
        return grad_y @ w, grad_shard / n, None, None

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

# %% 5.4 | gather_layer makes its output with torch.empty: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
def gather_layer(shard, out_features, in_features):
    full = torch.empty(dist.get_world_size() * shard.numel(), dtype=shard.dtype)
    backend_all_gather(full, shard)
    return full[:out_features * in_features].view(out_features, in_features), \
        full[out_features * in_features:out_features * (in_features + 1)]


class ZeRO3Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        w, b = gather_layer(shard, out_features, in_features)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        w, _ = gather_layer(shard, *ctx.shape)
        n = dist.get_world_size()
        flat = torch.cat([(grad_y.t() @ x).reshape(-1), grad_y.sum(0)])
        flat = F.pad(flat, (0, n * shard.numel() - flat.numel()))
        grad_shard = torch.empty_like(shard)
        backend_reduce_scatter(grad_shard, flat)
        return grad_y @ w, grad_shard / n, None, None
