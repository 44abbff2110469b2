"""Recorded wrong answers for solutions/00_welcome.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 0.1 | forgets to divide by the world size | expect: divide by
def average(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

# %% 0.1 | all-reduces the caller's tensors in place, one by one | expect: changed the caller's tensors
def average(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    for t in tensors:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return tensors

# %% 0.1 | one all-reduce per tensor (right numbers, one latency per parameter) | expect: one all_reduce per tensor
def average(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    out = [t.clone() for t in tensors]
    for t in out:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return out

# %% 0.1 | divides by the check's 3 ranks instead of the world size | expect: not a number written in
def average(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= 3
    return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

# %% 0.1 | packs in float32 whatever the dtype (float64 gradients come back float32) | expect: float64
def average(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

# %% 0.1 | averages its own tensors without communicating | expect: no collective
def average(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t / dist.get_world_size() for t in tensors]

# %% 0.2 | contiguous blocks of n // world_size: drops the remainder | expect: missing
def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    per = n // world_size
    return list(range(rank * per, (rank + 1) * per))

# %% 0.2 | the last rank takes the whole remainder | expect: differ by more than one
def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    per = n // world_size
    end = n if rank == world_size - 1 else (rank + 1) * per
    return list(range(rank * per, end))

# %% 0.2 | blocks of ceil(n / world_size): the last shards come up short | expect: differ by more than one
def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    per = -(-n // world_size)
    return list(range(rank * per, min(n, (rank + 1) * per)))

# %% 0.2 | pads like DistributedSampler: repeats the first indices | expect: more than once
def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    order = list(range(n))
    total = -(-n // world_size) * world_size
    while n and len(order) < total:
        order += order[: total - len(order)]
    return order[rank::world_size]

# %% 0.3 | plain average of the ranks' mean-loss gradients (divides by N) | expect: weighs every shard equally
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = shard_indices(len(x), rank, world)
    model.zero_grad()
    if idx:
        F.mse_loss(model(x[idx]), y[idx]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    else:
        g = torch.cat([torch.zeros_like(p).reshape(-1) for p in model.parameters()])
    dist.all_reduce(g)
    return g / world

# %% 0.3 | sums the ranks' mean-loss gradients without weighting them | expect: summed
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = shard_indices(len(x), rank, world)
    model.zero_grad()
    if idx:
        F.mse_loss(model(x[idx]), y[idx]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    else:
        g = torch.cat([torch.zeros_like(p).reshape(-1) for p in model.parameters()])
    dist.all_reduce(g)
    return g

# %% 0.3 | forgets to zero the gradients the model still holds from the previous call | expect: zero_grad
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = shard_indices(len(x), rank, world)
    if idx:
        (F.mse_loss(model(x[idx]), y[idx]) * (len(idx) / len(x))).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    else:
        g = torch.cat([torch.zeros_like(p).reshape(-1) for p in model.parameters()])
    dist.all_reduce(g)
    return g

# %% 0.3 | weights by n_i / n, then also divides by the world size out of habit | expect: divided by the world size
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = shard_indices(len(x), rank, world)
    model.zero_grad()
    if idx:
        (F.mse_loss(model(x[idx]), y[idx]) * (len(idx) / len(x))).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    else:
        g = torch.cat([torch.zeros_like(p).reshape(-1) for p in model.parameters()])
    dist.all_reduce(g)
    return g / world

# %% 0.3 | every rank takes the gradient of the whole batch itself: no shards, no communication | expect: only its own shard
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

# %% 0.3 | the whole batch on every rank, then an all-reduce ÷ N (right numbers, N times the work) | expect: only its own shard
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(g)
    return g / dist.get_world_size()

# %% 0.3 | takes the lesson's 4 ranks for the world size (right on 4 ranks, wrong on any other) | expect: never the lesson's 4
def dp_gradient(x: torch.Tensor, y: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    rank, world = dist.get_rank(), 4  # the lesson's world size
    idx = shard_indices(len(x), rank, world)
    model.zero_grad()
    if idx:
        (F.mse_loss(model(x[idx]), y[idx]) * (len(idx) / len(x))).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    else:
        g = torch.cat([torch.zeros_like(p).reshape(-1) for p in model.parameters()])
    dist.all_reduce(g)
    return g
