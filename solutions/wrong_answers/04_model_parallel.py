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

# %% 4.5 | W computed inside B and stashed for later (values right, bubble not filled) | expect: B computed weight gradients
class BWSplit:
    def __init__(self, layer, x):
        self.params = [p for p in layer.parameters() if p.requires_grad]
        self.x = x.detach().requires_grad_(True)
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        gx, *self.stash = torch.autograd.grad(self.y, [self.x, *self.params], grad_out)  # "W now, apply later"
        return gx

    def backward_weight(self):
        for p, g in zip(self.params, self.stash):
            p.grad = g if p.grad is None else p.grad + g

# %% 4.5 | B runs the fused y.backward() and returns x.grad | expect: .grad
class BWSplit:
    def __init__(self, layer, x):
        self.layer = layer
        self.x = x.detach().requires_grad_(True)
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        self.y.backward(grad_out)  # every gradient at once: W is already done
        return self.x.grad

    def backward_weight(self):
        pass  # nothing left to do

# %% 4.5 | B frees the graph (no retain_graph): W cannot walk it | expect: retain_graph
class BWSplit:
    def __init__(self, layer, x):
        self.params = [p for p in layer.parameters() if p.requires_grad]
        self.x = x.detach().requires_grad_(True)
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        self.grad_out = grad_out
        (gx,) = torch.autograd.grad(self.y, self.x, grad_out)
        return gx

    def backward_weight(self):
        grads = torch.autograd.grad(self.y, self.params, self.grad_out)
        for p, g in zip(self.params, grads):
            p.grad = g if p.grad is None else p.grad + g

# %% 4.5 | W re-runs the forward instead of keeping the graph | expect: forward again
class BWSplit:
    def __init__(self, layer, x):
        self.layer, self.params = layer, [p for p in layer.parameters() if p.requires_grad]
        self.x = x.detach().requires_grad_(True)
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        self.grad_out = grad_out
        (gx,) = torch.autograd.grad(self.y, self.x, grad_out)
        return gx

    def backward_weight(self):
        y = self.layer(self.x.detach())  # a fresh graph: "cheaper than keeping the old one"
        grads = torch.autograd.grad(y, self.params, self.grad_out)
        for p, g in zip(self.params, grads):
            p.grad = g if p.grad is None else p.grad + g

# %% 4.5 | W overwrites p.grad: the micro-batches do not add up | expect: accumulate
class BWSplit:
    def __init__(self, layer, x):
        self.params = [p for p in layer.parameters() if p.requires_grad]
        self.x = x.detach().requires_grad_(True)
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        self.grad_out = grad_out
        (gx,) = torch.autograd.grad(self.y, self.x, grad_out, retain_graph=True)
        return gx

    def backward_weight(self):
        grads = torch.autograd.grad(self.y, self.params, self.grad_out)
        for p, g in zip(self.params, grads):
            p.grad = g

# %% 4.5 | the received input detached but not made to require grad | expect: leaf that requires grad
class BWSplit:
    def __init__(self, layer, x):
        self.params = [p for p in layer.parameters() if p.requires_grad]
        self.x = x.detach()  # cut from the previous stage... and from the gradient B must return
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        self.grad_out = grad_out
        (gx,) = torch.autograd.grad(self.y, self.x, grad_out, retain_graph=True)
        return gx

    def backward_weight(self):
        grads = torch.autograd.grad(self.y, self.params, self.grad_out)
        for p, g in zip(self.params, grads):
            p.grad = g if p.grad is None else p.grad + g

# %% 4.5 | W runs the whole backward again (y.backward): recomputes ∂x | expect: recomputed ∂x
class BWSplit:
    def __init__(self, layer, x):
        self.x = x.detach().requires_grad_(True)
        self.y = layer(self.x)

    def backward_input(self, grad_out):
        self.grad_out = grad_out
        (gx,) = torch.autograd.grad(self.y, self.x, grad_out, retain_graph=True)
        return gx

    def backward_weight(self):
        self.y.backward(self.grad_out)  # fills (and adds to) every .grad, the input's too

# %% 4.5 | delegates to the course's SplitBackward | expect: split the backward yourself
from m11_helpers.backward_split import SplitBackward


class BWSplit:
    def __init__(self, layer, x):
        self.split, self.layer = SplitBackward(layer, x), layer

    def backward_input(self, grad_out):
        return self.split.backward_input(grad_out)

    def backward_weight(self):
        for n, g in self.split.backward_weight().items():
            p = self.layer.get_parameter(n)
            p.grad = g if p.grad is None else p.grad + g

# %% 4.6 | 1F1B's order with the backward split: W right after each B | expect: holds back too few
def zb_h1(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s, m)
        seq, fwd, bwd = ["F"] * warm, warm, 0
        while fwd < m:
            seq, fwd, bwd = seq + ["B", "W", "F"], fwd + 1, bwd + 1
        seq += ["B", "W"] * (m - bwd)
        count, order = {"F": 0, "B": 0, "W": 0}, []
        for k in seq:
            order.append((k, count[k]))
            count[k] += 1
        orders.append(order)
    return _asap(orders, p)


def _asap(orders, p):
    done, free, pos, table = {}, [0] * p, [0] * p, {}
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = {"F": ("F", s - 1, i) if s else None, "W": ("B", s, i),
                   "B": ("B", s + 1, i) if s < p - 1 else ("F", s, i)}[kind]
            if dep is not None and dep not in done:
                continue
            tick = max(free[s], done[dep] if dep else 0)
            table[(tick, s)] = f"{kind}{i}"
            done[(kind, s, i)] = free[s] = tick + 1
            pos[s] += 1
    return table

# %% 4.6 | every W deferred to the end of the step | expect: holds back too many
def zb_h1(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s, m)
        seq, fwd, bwd = ["F"] * warm, warm, 0
        while fwd < m:
            seq, fwd, bwd = seq + ["B", "F"], fwd + 1, bwd + 1
        seq += ["B"] * (m - bwd) + ["W"] * m  # "W has no consumer: put them all last"
        count, order = {"F": 0, "B": 0, "W": 0}, []
        for k in seq:
            order.append((k, count[k]))
            count[k] += 1
        orders.append(order)
    return _asap(orders, p)


def _asap(orders, p):
    done, free, pos, table = {}, [0] * p, [0] * p, {}
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = {"F": ("F", s - 1, i) if s else None, "W": ("B", s, i),
                   "B": ("B", s + 1, i) if s < p - 1 else ("F", s, i)}[kind]
            if dep is not None and dep not in done:
                continue
            tick = max(free[s], done[dep] if dep else 0)
            table[(tick, s)] = f"{kind}{i}"
            done[(kind, s, i)] = free[s] = tick + 1
            pos[s] += 1
    return table

# %% 4.6 | 1F1B's warm-up (p − s − 1 forwards) | expect: warm-up
def zb_h1(p, m):
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        seq, fwd, bwd = ["F"] * warm, warm, 0
        for _ in range(s):
            if bwd < fwd:
                seq, bwd = seq + ["B"], bwd + 1
            if fwd < m:
                seq, fwd = seq + ["F"], fwd + 1
        while fwd < m:
            seq, fwd, bwd = seq + ["B", "W", "F"], fwd + 1, bwd + 1
        seq += ["B", "W"] * (m - bwd)
        seq += ["W"] * (m - seq.count("W"))
        count, order = {"F": 0, "B": 0, "W": 0}, []
        for k in seq:
            order.append((k, count[k]))
            count[k] += 1
        orders.append(order)
    return _asap(orders, p)


def _asap(orders, p):
    done, free, pos, table = {}, [0] * p, [0] * p, {}
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = {"F": ("F", s - 1, i) if s else None, "W": ("B", s, i),
                   "B": ("B", s + 1, i) if s < p - 1 else ("F", s, i)}[kind]
            if dep is not None and dep not in done:
                continue
            tick = max(free[s], done[dep] if dep else 0)
            table[(tick, s)] = f"{kind}{i}"
            done[(kind, s, i)] = free[s] = tick + 1
            pos[s] += 1
    return table

# %% 4.6 | right order, each op one tick after the previous one on its device (no waiting for inputs) | expect: after its input
def zb_h1(p, m):
    table = {}
    for s in range(p):
        warm = min(p - s, m)
        seq, fwd, bwd = ["F"] * warm, warm, 0
        for _ in range(s):
            if bwd < fwd:
                seq, bwd = seq + ["B"], bwd + 1
            if fwd < m:
                seq, fwd = seq + ["F"], fwd + 1
        while fwd < m:
            seq, fwd, bwd = seq + ["B", "W", "F"], fwd + 1, bwd + 1
        seq += ["B", "W"] * (m - bwd)
        seq += ["W"] * (m - seq.count("W"))
        count = {"F": 0, "B": 0, "W": 0}
        for t, k in enumerate(seq):
            table[(t, s)] = f"{k}{count[k]}"
            count[k] += 1
    return table

# %% 4.6 | delegates to the course's zb_h1_order and replay | expect: write the schedule yourself
def zb_h1(p, m):
    from m11_helpers.pipeline_ticks import replay, zb_h1_order

    return {(o.start, o.device): f"{o.kind}{o.micro}" for o in replay(zb_h1_order(p, m), 1)}
