"""Recorded wrong answers for solutions/04_model_parallel.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 4.1 | g's backward also all-reduces | expect: g's backward
class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):  # "an all-reduce is its own adjoint"
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

# %% 4.1 | f's backward forgets the all-reduce | expect: f's backward
class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad

# %% 4.1 | f and g swapped | expect: swap f and g
class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

# %% 4.1 | g all-reduces the caller's tensor in place | expect: changed the caller's tensor
class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad

# %% 4.1 | delegates to the course's f and g | expect: write f and g yourself
from m11_helpers.tensor_parallel import _CopyToTP, _ReduceFromTP


class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _CopyToTP.apply(x, None)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _ReduceFromTP.apply(x, None)

    @staticmethod
    def backward(ctx, grad):
        return grad

# %% 4.2 | GPipe's order: every forward, then every backward | expect: GPipe
def one_f_one_b(p, m):
    table = {}
    for s in range(p):
        for i in range(m):
            table[(s + i, s)] = f"F{i}"
            table[(m + p - 1 + (p - 1 - s) + i, s)] = f"B{i}"
    return table


def idle_fraction(table, p):
    makespan = 1 + max(t for t, _ in table)
    return 1 - len(table) / (p * makespan)

# %% 4.2 | off-by-one warm-up: p - s forwards, then forward/backward pairs | expect: warm-up
def one_f_one_b(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        orders.append(order + [("B", i) for i in range(m - warm, m)])
    done, free, pos, table = {}, [0] * p, [0] * p, {}
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
            if dep is not None and dep not in done:
                continue
            tick = max(free[s], done[dep] if dep else 0)
            table[(tick, s)] = f"{kind}{i}"
            done[(kind, s, i)] = free[s] = tick + 1
            pos[s] += 1
    return table


def idle_fraction(table, p):
    makespan = 1 + max(t for t, _ in table)
    return 1 - len(table) / (p * makespan)

# %% 4.2 | steps in lockstep: each op waits for a global tick boundary | expect: as soon as
def one_f_one_b(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        orders.append(order + [("B", i) for i in range(m - warm, m)])
    done, pos, table, tick = set(), [0] * p, {}, 0
    while any(pos[s] < len(orders[s]) for s in range(p)):
        ran = []
        for s in range(p):  # a stage runs only when every input was ready at the previous *round*
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
            if dep is None or dep in done:
                table[(tick, s)] = f"{kind}{i}"
                ran.append((kind, s, i))
        for kind, s, i in ran:
            done.add((kind, s, i))
            pos[s] += 1
        tick += 2  # a compute tick, then a communication tick
    return table


def idle_fraction(table, p):
    makespan = 1 + max(t for t, _ in table)
    return 1 - len(table) / (p * makespan)

# %% 4.2 | delegates to the course's simulator | expect: write the schedule yourself
from m11_helpers.pipeline import schedule_table, simulate


def one_f_one_b(p, m):
    return schedule_table(simulate(p, m, "1f1b", t_f=1, t_b=1))


def idle_fraction(table, p):
    makespan = 1 + max(t for t, _ in table)
    return 1 - len(table) / (p * makespan)

# %% 4.2 | idle fraction from the formula, not counted from the table | expect: count from the table
def one_f_one_b(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        orders.append(order + [("B", i) for i in range(m - warm, m)])
    done, free, pos, table = {}, [0] * p, [0] * p, {}
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
            if dep is not None and dep not in done:
                continue
            tick = max(free[s], done[dep] if dep else 0)
            table[(tick, s)] = f"{kind}{i}"
            done[(kind, s, i)] = free[s] = tick + 1
            pos[s] += 1
    return table


def idle_fraction(table, p):
    m = len(table) // (2 * p)
    return (p - 1) / (m + p - 1)

# %% 4.2 | idle over busy stage-ticks (the bubble/ideal ratio) | expect: over ALL p × makespan
def one_f_one_b(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        orders.append(order + [("B", i) for i in range(m - warm, m)])
    done, free, pos, table = {}, [0] * p, [0] * p, {}
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
            if dep is not None and dep not in done:
                continue
            tick = max(free[s], done[dep] if dep else 0)
            table[(tick, s)] = f"{kind}{i}"
            done[(kind, s, i)] = free[s] = tick + 1
            pos[s] += 1
    return table


def idle_fraction(table, p):
    makespan = 1 + max(t for t, _ in table)
    return (p * makespan - len(table)) / len(table)

# %% 4.3 | row-parallel weight split along the wrong dimension (rows) | expect: wrong dimension
class TPMLP(nn.Module):
    def __init__(self, mlp, rank, world):
        super().__init__()
        n = mlp.fc.out_features // world
        mine = slice(rank * n, (rank + 1) * n)
        self.fc_weight = nn.Parameter(mlp.fc.weight.detach()[mine].clone())
        self.fc_bias = nn.Parameter(mlp.fc.bias.detach()[mine].clone())
        k = mlp.proj.out_features // world
        self.proj_weight = nn.Parameter(mlp.proj.weight.detach()[rank * k:(rank + 1) * k].clone())
        self.proj_bias = nn.Parameter(mlp.proj.bias.detach().clone())

    def forward(self, x):
        h = F.gelu(F.linear(CopyToTP.apply(x), self.fc_weight, self.fc_bias))
        return ReduceFromTP.apply(F.linear(h, self.proj_weight.T)) + self.proj_bias

# %% 4.3 | g's backward also all-reduces (its own g) | expect: g's backward
class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class TPMLP(nn.Module):
    def __init__(self, mlp, rank, world):
        super().__init__()
        n = mlp.fc.out_features // world
        mine = slice(rank * n, (rank + 1) * n)
        self.fc_weight = nn.Parameter(mlp.fc.weight.detach()[mine].clone())
        self.fc_bias = nn.Parameter(mlp.fc.bias.detach()[mine].clone())
        self.proj_weight = nn.Parameter(mlp.proj.weight.detach()[:, mine].clone())
        self.proj_bias = nn.Parameter(mlp.proj.bias.detach().clone())

    def forward(self, x):
        h = F.gelu(F.linear(CopyToTP.apply(x), self.fc_weight, self.fc_bias))
        return _G.apply(F.linear(h, self.proj_weight)) + self.proj_bias

# %% 4.3 | no f before the column-parallel layer | expect: f is missing
class TPMLP(nn.Module):
    def __init__(self, mlp, rank, world):
        super().__init__()
        n = mlp.fc.out_features // world
        mine = slice(rank * n, (rank + 1) * n)
        self.fc_weight = nn.Parameter(mlp.fc.weight.detach()[mine].clone())
        self.fc_bias = nn.Parameter(mlp.fc.bias.detach()[mine].clone())
        self.proj_weight = nn.Parameter(mlp.proj.weight.detach()[:, mine].clone())
        self.proj_bias = nn.Parameter(mlp.proj.bias.detach().clone())

    def forward(self, x):
        h = F.gelu(F.linear(x, self.fc_weight, self.fc_bias))
        return ReduceFromTP.apply(F.linear(h, self.proj_weight)) + self.proj_bias

# %% 4.3 | proj's bias added on every rank before g | expect: bias once
class TPMLP(nn.Module):
    def __init__(self, mlp, rank, world):
        super().__init__()
        n = mlp.fc.out_features // world
        mine = slice(rank * n, (rank + 1) * n)
        self.fc_weight = nn.Parameter(mlp.fc.weight.detach()[mine].clone())
        self.fc_bias = nn.Parameter(mlp.fc.bias.detach()[mine].clone())
        self.proj_weight = nn.Parameter(mlp.proj.weight.detach()[:, mine].clone())
        self.proj_bias = nn.Parameter(mlp.proj.bias.detach().clone())

    def forward(self, x):
        h = F.gelu(F.linear(CopyToTP.apply(x), self.fc_weight, self.fc_bias))
        return ReduceFromTP.apply(F.linear(h, self.proj_weight, self.proj_bias))

# %% 4.3 | all-reduces the column-parallel output too | expect: all-gather
class TPMLP(nn.Module):
    def __init__(self, mlp, rank, world):
        super().__init__()
        n = mlp.fc.out_features // world
        mine = slice(rank * n, (rank + 1) * n)
        self.fc_weight = nn.Parameter(mlp.fc.weight.detach()[mine].clone())
        self.fc_bias = nn.Parameter(mlp.fc.bias.detach()[mine].clone())
        self.proj_weight = nn.Parameter(mlp.proj.weight.detach()[:, mine].clone())
        self.proj_bias = nn.Parameter(mlp.proj.bias.detach().clone())

    def forward(self, x):
        h = ReduceFromTP.apply(F.linear(CopyToTP.apply(x), self.fc_weight, self.fc_bias))  # "combine the shards"
        h = F.gelu(h)
        return ReduceFromTP.apply(F.linear(h, self.proj_weight)) + self.proj_bias

# %% 4.3 | delegates to the course's TPMLP | expect: build the MLP from your own f and g
from m11_helpers.tensor_parallel import TPMLP as _CourseTPMLP


class TPMLP(nn.Module):
    def __init__(self, mlp, rank, world):
        super().__init__()
        self.inner = _CourseTPMLP.from_mlp(mlp, rank, world)
        self.fc_weight, self.fc_bias = self.inner.fc.weight, self.inner.fc.bias
        self.proj_weight, self.proj_bias = self.inner.proj.weight, self.inner.proj.bias

    def forward(self, x):
        return self.inner(x)

# %% 4.4 | tensor parallelism across nodes (tp up to every GPU) | expect: inside a node
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, gpus + 1):
        if cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | prefers pipeline over tensor parallelism (smallest tp) | expect: largest tp
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, tp) < best[0]):
                best = ((tp * pp, tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | fills the whole GPU (no 20 % headroom) | expect: 80 %
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | ZeRO-1 that shards all 18 B/param over dp (ZeRO-3's memory) | expect: stay whole
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = 18 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | no ZeRO: 18 B/param on every replica (the lesson's planner) | expect: 2 + 4 + 12/dp
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = 18 * mine  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | stage 0 without the input embedding | expect: input embedding
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        params = -(-cfg.layers // pp) * layer  # ⌈L/p⌉ layers, and nothing else
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | forgets that Megatron splits the parameters over tp | expect: over the tp ranks
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = params  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | judges every candidate at dp = 1, not its own dp | expect: its own dp
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, 1) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | memory in GiB instead of GB | expect: not GiB
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 4) * mine + 12 * -(-mine // dp)  # bf16 weights + fp32 main grads whole; fp32 master + Adam over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 2**30


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | model states from model_states.model_state_bytes (not derived) | expect: derive
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.model_states import model_state_bytes
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = model_state_bytes(mine, "megatron", dp, 1)["total"]  # bf16 weights + grads whole; fp32 master + Adam sharded over dp
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]

# %% 4.4 | the ZeRO paper's 16-bit gradients (2 + 2 whole), not Megatron's fp32 main grads | expect: fp32 main gradients
import dataclasses

from m11_helpers.config import param_count
from m11_helpers.planner import first_stage_activation_bytes


def stage0_gb(cfg, tp: int, pp: int, dp: int) -> float:
    """GB on the first pipeline stage's GPU: its parameters ÷ tp under ZeRO-1 over dp, plus its activations."""
    if pp == 1:
        params = param_count(cfg)
    else:
        layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
        embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
        params = -(-cfg.layers // pp) * layer + embedding  # ⌈L/p⌉ layers + the input embedding
    mine = -(-params // tp)  # Megatron splits every matrix (the vocabulary too) over the tp ranks
    states = (2 + 2) * mine + 12 * -(-mine // dp)  # the ZeRO paper's bf16 weights + bf16 grads whole
    return (states + first_stage_activation_bytes(cfg, tp, pp)) / 1e9


def choose_3d(cfg, cluster, gpus: int, global_batch: int):
    """(dp, tp, pp) with the smallest tp·pp that fits under ZeRO-1, the largest tp among those; None if none fits."""
    best = None
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cfg.heads % tp or gpus % tp:
            continue
        for pp in range(1, cfg.layers + 1):
            if cfg.layers % pp or gpus % (tp * pp) or global_batch % (gpus // (tp * pp)):
                continue
            dp = gpus // (tp * pp)  # each candidate's own dp: ZeRO-1's saving depends on it
            if stage0_gb(cfg, tp, pp, dp) <= 0.8 * cluster.memory_gb and (best is None or (tp * pp, -tp) < best[0]):
                best = ((tp * pp, -tp), (dp, tp, pp))
    return None if best is None else best[1]
    ### END SOLUTION

# %% 4.4 | delegates to the planner's megatron_rule (the rule the lesson prints) | expect: derive
from m11_helpers.planner import megatron_rule


def choose_3d(cfg, cluster, gpus, global_batch):
    p = megatron_rule(cfg, cluster, gpus, global_batch)
    return None if p is None else (p.dp, p.tp, p.pp)
