"""Recorded wrong answers for solutions/11_capstone.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 11.1 | forgets to divide each micro-batch's loss by K | expect: divide each micro-batch's loss by K
def train_step(model, micro_batches, max_norm):
    K = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext()
        else:
            sync = contextlib.nullcontext() if last else model.no_sync()
        with sync:
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
            loss.backward()
        total += loss.detach()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), norm.item()

# %% 11.1 | reduces the gradients after every micro-batch (no set_requires_gradient_sync / no_sync) | expect: only after the last micro-batch
def train_step(model, micro_batches, max_norm):
    K = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for x, y in micro_batches:
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / K
        loss.backward()
        total += loss.detach()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), norm.item()

# %% 11.1 | returns this rank's loss, not the global batch's | expect: all_reduce the summed micro-losses
def train_step(model, micro_batches, max_norm):
    K = len(micro_batches)
    total = 0.0
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext()
        else:
            sync = contextlib.nullcontext() if last else model.no_sync()
        with sync:
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / K
            loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return total, norm.item()

# %% 11.1 | clips with the norm of this rank's own gradient shards | expect: over every rank's shards
def train_step(model, micro_batches, max_norm):
    K = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext()
        else:
            sync = contextlib.nullcontext() if last else model.no_sync()
        with sync:
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / K
            loss.backward()
        total += loss.detach()
    local = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in model.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in local]))
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in local:
        g.mul_(scale)
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), norm.item()

# %% 11.1 | returns the norm after clipping | expect: before clipping
def train_step(model, micro_batches, max_norm):
    K = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext()
        else:
            sync = contextlib.nullcontext() if last else model.no_sync()
        with sync:
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / K
            loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), norm.item()

# %% 11.1 | delegates to the script's own step | expect: write the step yourself
def train_step(model, micro_batches, max_norm):
    return reference_step(model, micro_batches, max_norm)

# %% 11.1 | keeps the loss total in torch.zeros(()): a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
def train_step(model, micro_batches, max_norm: float) -> tuple[float, float]:
    K = len(micro_batches)
    total = torch.zeros(())
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter after the last backward only
            model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext()
        else:  # DDP: all-reduce after the last backward only
            sync = contextlib.nullcontext() if last else model.no_sync()
        with sync:
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / K  # (): a share of the mean
            loss.backward()
        total += loss.detach()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # every rank's shards: the global norm
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2 returns a DTensor
    dist.all_reduce(total)  # the mean over the global batch: the same number on every rank
    return total.item() / dist.get_world_size(), norm.item()

# %% 11.2 | stops without saving (counts on the last periodic checkpoint) | expect: save at that step boundary
def train_loop(run, train_step):
    state = {"scheduler": run.scheduler}
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0
    while step < run.steps:
        if run.stop_requested():
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)
    run.ckpt.wait()
    return step

# %% 11.2 | checkpoints the model and optimizer but not the scheduler | expect: the scheduler is state
def train_loop(run, train_step):
    resumed = run.ckpt.load(run.model, run.optimizer)
    step = resumed["step"] if resumed else 0
    while step < run.steps:
        if run.stop_requested():
            run.ckpt.save(step, run.model, run.optimizer)
            run.ckpt.wait()
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer)
    run.ckpt.wait()
    return step

# %% 11.2 | resumes one step after the checkpoint (off by one) | expect: so step N runs next
def train_loop(run, train_step):
    state = {"scheduler": run.scheduler}
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] + 1 if resumed else 0
    while step < run.steps:
        if run.stop_requested():
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)
    run.ckpt.wait()
    return step

# %% 11.2 | never clears the gradients between steps | expect: zero_grad
def train_loop(run, train_step):
    state = {"scheduler": run.scheduler}
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0
    while step < run.steps:
        if run.stop_requested():
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)
    run.ckpt.wait()
    return step

# %% 11.2 | checkpoints only every ckpt_every steps, not the end of the run | expect: checkpoint the end of the run
def train_loop(run, train_step):
    state = {"scheduler": run.scheduler}
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0
    while step < run.steps:
        if run.stop_requested():
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0:
            run.ckpt.save(step, run.model, run.optimizer, **state)
    run.ckpt.wait()
    return step

# %% 11.2 | delegates to the script's own loop | expect: write the loop yourself
def train_loop(run, train_step):
    return reference_loop(run, train_step)

# %% 11.3 | fits on the model states alone, forgetting the activations | expect: the activations count too
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        p = plan_run(flags, world_size, batch)
        if p["states"] > budget:
            continue
        key = (flags.levers, p["bytes_sent"], p["total"])
        if best_key is None or key < best_key:
            best, best_key = (flags, p["total"]), key
    return best

# %% 11.3 | least communication first, then the fewest levers | expect: the fewest levers on first
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        p = plan_run(flags, world_size, batch)
        if p["total"] > budget:
            continue
        key = (p["bytes_sent"], flags.levers, p["total"])
        if best_key is None or key < best_key:
            best, best_key = (flags, p["total"]), key
    return best

# %% 11.3 | counts the activations of all K micro-batches as alive at once | expect: ONE micro-batch's activations
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        p = plan_run(flags, world_size, batch)
        total = p["states"] + flags.accum * p["activations"]
        if total > budget:
            continue
        key = (flags.levers, p["bytes_sent"], total)
        if best_key is None or key < best_key:
            best, best_key = (flags, total), key
    return best

# %% 11.3 | plans as one process (world_size left at 1): nothing sharded, the whole batch | expect: per rank
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % flags.accum:
            continue
        p = plan_run(flags, 1, batch)
        if p["total"] > budget:
            continue
        key = (flags.levers, p["bytes_sent"], p["total"])
        if best_key is None or key < best_key:
            best, best_key = (flags, p["total"]), key
    return best

# %% 11.3 | reports the model states as the plan, without the activations | expect: ONE micro-batch's activations
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        p = plan_run(flags, world_size, batch)
        if p["total"] > budget:
            continue
        key = (flags.levers, p["bytes_sent"], p["total"])
        if best_key is None or key < best_key:
            best, best_key = (flags, p["states"]), key
    return best
