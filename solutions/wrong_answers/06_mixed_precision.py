"""Recorded wrong answers for solutions/06_mixed_precision.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 6.1 | keeps the counter after an overflow | expect: resets the counter to 0
def next_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, growth_tracker
    growth_tracker += 1
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker

# %% 6.1 | grows one clean step too late (compares before counting this step) | expect: not one later
def next_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker + 1

# %% 6.1 | does not restart the counter after growing | expect: restart the counter at 0
def next_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker % growth_interval == 0:
        return scale * growth_factor, growth_tracker
    return scale, growth_tracker

# %% 6.1 | imports the lesson's update_scale under the exercise's name (same signature) | expect: write the update yourself
from m11_helpers.loss_scaling import update_scale as next_scale

# %% 6.1 | delegates to a DynamicLossScaler's update() | expect: write the update yourself
from m11_helpers.loss_scaling import DynamicLossScaler


def next_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    s = DynamicLossScaler(scale, growth_factor, backoff_factor, growth_interval)
    s.growth_tracker, s.found_inf = growth_tracker, found_inf
    s.update()
    return s.get_scale(), s.growth_tracker

# %% 6.1 | calls GradScaler's own kernel, torch._amp_update_scale_ | expect: write the update yourself
def next_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    s, t = torch.tensor([float(scale)]), torch.tensor([growth_tracker], dtype=torch.int32)
    torch._amp_update_scale_(s, t, torch.tensor([float(found_inf)]), growth_factor, backoff_factor, growth_interval)
    return s.item(), int(t.item())

# %% 6.2 | delegates to torch.nn.utils.clip_grad_norm_ | expect: write the clipping yourself
def clip_global_norm_(parameters, max_norm):
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

# %% 6.2 | clips each tensor by its own norm | expect: not one norm per tensor
def clip_global_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    for g in grads:
        g.mul_(torch.clamp(max_norm / (torch.linalg.vector_norm(g) + 1e-6), max=1.0))
    return total

# %% 6.2 | scales small gradients up to max_norm (no min with 1) | expect: never scale a gradient UP
def clip_global_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    for g in grads:
        g.mul_(max_norm / (total + 1e-6))
    return total

# %% 6.2 | iterates the parameters twice (a generator is empty the second time) | expect: generator is used up
def clip_global_norm_(parameters, max_norm):
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters
                                                  if p.grad is not None]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(coef)
    return total

# %% 6.2 | returns the norm after clipping | expect: BEFORE clipping
def clip_global_norm_(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

# %% 6.3 | steps the optimizer itself (opt.step), so the overflowed step is applied | expect: scaler.step(opt) skips
def train_amp(model, batches, lr=0.05, max_norm=1.0, init_scale=2.0**16, growth_interval=2000):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.3 | never calls scaler.update() | expect: update()
def train_amp(model, batches, lr=0.05, max_norm=1.0, init_scale=2.0**16, growth_interval=2000):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.3 | backward through the unscaled loss | expect: scaler.scale(loss
def train_amp(model, batches, lr=0.05, max_norm=1.0, init_scale=2.0**16, growth_interval=2000):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.3 | forgets opt.zero_grad(): gradients pile up | expect: zero the gradients every step
def train_amp(model, batches, lr=0.05, max_norm=1.0, init_scale=2.0**16, growth_interval=2000):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.3 | clips before unscaling (clips the gradient times 65536) | expect: clipping before unscale_
def train_amp(model, batches, lr=0.05, max_norm=1.0, init_scale=2.0**16, growth_interval=2000):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.3 | never clips | expect: clip every step
def train_amp(model, batches, lr=0.05, max_norm=1.0, init_scale=2.0**16, growth_interval=2000):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales

# %% 6.4 | clips with the local shard's norm (no communication) | expect: GLOBAL norm
def sharded_clip_(local_params, max_norm):
    grads = [p.grad for p in local_params if p.grad is not None]
    total = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | all-reduces the local norms, not the sums of squares | expect: not the other way round
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    total = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    dist.all_reduce(total)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | averages the sums of squares over the ranks | expect: not their average
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    sq = torch.stack([g.pow(2).sum() for g in grads]).sum()
    dist.all_reduce(sq)
    total = (sq / dist.get_world_size()).sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | all-gathers every gradient to compute the norm (right numbers, the whole model on the wire) | expect: gathering the gradients
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    sizes = [flat.new_zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, flat.new_tensor([flat.numel()], dtype=torch.long))
    longest = int(max(sizes))
    parts = [flat.new_zeros(longest) for _ in sizes]
    dist.all_gather(parts, F.pad(flat, (0, longest - flat.numel())))  # zero padding leaves the norm alone
    total = torch.linalg.vector_norm(torch.cat(parts))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | one all-reduce per tensor (right numbers, N collectives) | expect: one all-reduce per tensor
def sharded_clip_(local_params, max_norm):
    import torch.distributed as dist
    grads = [p.grad for p in local_params if p.grad is not None]
    sq = grads[0].new_zeros(())
    for g in grads:
        s = g.pow(2).sum()
        dist.all_reduce(s)
        sq += s
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total

# %% 6.4 | delegates to the lesson's sharded_grad_norm | expect: write the sharded clipping yourself
def sharded_clip_(local_params, max_norm):
    local_params = list(local_params)
    total = clipping.sharded_grad_norm(local_params)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in local_params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return total

# %% 6.5 | steps AdamW on the bf16 parameters themselves (no master copy) | expect: separate fp32 copy
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = self.params
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.optimizer.step()

# %% 6.5 | refreshes the master from the bf16 weights every step | expect: ONE master copy
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.copy_(p)  # "keep the master in sync with the model"
            m.grad = p.grad.float()
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            m.grad = None
            p.copy_(m)

# %% 6.5 | never writes the master back into the model | expect: write the updated master back
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.optimizer.step()
        for m in self.master:
            m.grad = None

# %% 6.5 | keeps the fp32 gradient copies between steps (20 B/param) | expect: fp32 gradient copies
class MasterWeightsAdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0):
        self.params = list(params)
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)

# %% 6.5 | delegates to the lesson's MasterWeightsAdamW | expect: build the master copy yourself
class MasterWeightsAdamW(master_weights.MasterWeightsAdamW):
    pass
