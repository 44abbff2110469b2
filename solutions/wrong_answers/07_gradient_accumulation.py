"""Recorded wrong answers for solutions/07_gradient_accumulation.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 7.1 | takes the largest micro-batch that fits and rounds K up | expect: exactly
def plan_accumulation(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    per_rank = global_batch // world_size
    return max_micro_batch, -(-per_rank // max_micro_batch)

# %% 7.1 | forgets the world size | expect: world_size
def plan_accumulation(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    micro = max(b for b in range(1, max_micro_batch + 1) if global_batch % b == 0)
    return micro, global_batch // micro

# %% 7.1 | always a micro-batch of 1: exact, but the most micro-steps | expect: fewest micro-steps
def plan_accumulation(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} is not a multiple of world_size={world_size}")
    return 1, global_batch // world_size

# %% 7.1 | floors the per-rank share instead of refusing an impossible batch | expect: ValueError
def plan_accumulation(global_batch: int, world_size: int, max_micro_batch: int) -> tuple[int, int]:
    per_rank = global_batch // world_size
    micro = max(b for b in range(1, min(max_micro_batch, per_rank) + 1) if per_rank % b == 0)
    return micro, per_rank // micro

# %% 7.2 | the common loop: steps only when (i + 1) % K == 0, the tail never steps | expect: incomplete window
def train_with_accumulation(model, optimizer, batches, K: int) -> int:
    steps = 0
    optimizer.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(batches):
        (F.mse_loss(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    return steps

# %% 7.2 | steps the short last window but divides it by K, not by its size | expect: size of its window
def train_with_accumulation(model, optimizer, batches, K: int) -> int:
    steps = 0
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(batches), K):
        for x, y in batches[start:start + K]:
            (F.mse_loss(model(x), y) / K).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
    return steps

# %% 7.2 | zeroes only after each step: leftovers in .grad join the first step | expect: leftovers
def train_with_accumulation(model, optimizer, batches, K: int) -> int:
    steps = 0
    for start in range(0, len(batches), K):
        window = batches[start:start + K]
        for x, y in window:
            (F.mse_loss(model(x), y) / len(window)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
    return steps

# %% 7.2 | delegates to the lesson's helper | expect: write the loop yourself
def train_with_accumulation(model, optimizer, batches, K: int) -> int:
    return len(course_loop.train_with_accumulation(model, optimizer, batches, K))

# %% 7.2 | concatenates each window into one batch: one backward, no accumulation (K× the activations) | expect: one forward and backward per micro-batch
def train_with_accumulation(model, optimizer, batches, K: int) -> int:
    steps = 0
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(batches), K):
        window = batches[start:start + K]
        x, y = torch.cat([b[0] for b in window]), torch.cat([b[1] for b in window])
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
    return steps

# %% 7.3 | divides by this rank's own token count (the mistake one level up) | expect: token count alone
def token_weighted_window(ddp_model, micro_batches) -> None:
    count = sum(m.sum() for _, _, m in micro_batches)
    for x, y, mask in micro_batches:
        per_token = F.mse_loss(ddp_model(x), y, reduction="none").mean(-1)
        ((per_token * mask).sum() / count).backward()

# %% 7.3 | mean of each micro-batch's token mean, divided by K | expect: token count alone
def token_weighted_window(ddp_model, micro_batches) -> None:
    for x, y, mask in micro_batches:
        per_token = F.mse_loss(ddp_model(x), y, reduction="none").mean(-1)
        ((per_token * mask).sum() / mask.sum() / len(micro_batches)).backward()

# %% 7.3 | the global count, but forgets that DDP averages the ranks' gradients | expect: multiply each rank's loss by the world size
def token_weighted_window(ddp_model, micro_batches) -> None:
    count = sum(m.sum() for _, _, m in micro_batches)
    dist.all_reduce(count)
    for x, y, mask in micro_batches:
        per_token = F.mse_loss(ddp_model(x), y, reduction="none").mean(-1)
        ((per_token * mask).sum() / count).backward()

# %% 7.3 | counts every position, padding included | expect: padding counts for nothing
def token_weighted_window(ddp_model, micro_batches) -> None:
    count = sum(torch.ones_like(m).sum() for _, _, m in micro_batches)  # every position
    dist.all_reduce(count)
    for x, y, mask in micro_batches:
        per_token = F.mse_loss(ddp_model(x), y, reduction="none").mean(-1)
        ((per_token * mask).sum() / count * dist.get_world_size()).backward()

# %% 7.3 | all-reduces the count once per micro-batch | expect: once
def token_weighted_window(ddp_model, micro_batches) -> None:
    counts = []
    for _, _, m in micro_batches:
        c = m.sum()
        dist.all_reduce(c)
        counts.append(c)
    count = sum(counts)
    for x, y, mask in micro_batches:
        per_token = F.mse_loss(ddp_model(x), y, reduction="none").mean(-1)
        ((per_token * mask).sum() / count * dist.get_world_size()).backward()

# %% 7.3 | builds the count with torch.tensor(...): a CPU tensor, which NCCL rejects on a GPU | expect: No backend type associated with device type cpu
def token_weighted_window(ddp_model, micro_batches) -> None:
    count = torch.tensor(float(sum(m.sum().item() for _, _, m in micro_batches)))
    dist.all_reduce(count)
    for x, y, mask in micro_batches:
        per_token = F.mse_loss(ddp_model(x), y, reduction="none").mean(-1)
        ((per_token * mask).sum() / count * dist.get_world_size()).backward()

# %% 7.3 | delegates to the lesson's helper, with the local count | expect: normalise the window yourself
def token_weighted_window(ddp_model, micro_batches) -> None:
    from m11_helpers.gradient_accumulation import token_weighted_losses
    outs = [F.mse_loss(ddp_model(x), y, reduction="none").mean(-1) for x, y, _ in micro_batches]
    for loss in token_weighted_losses(outs, [m for _, _, m in micro_batches]):
        (loss * dist.get_world_size()).backward()

# %% 7.4 | all-reduces each micro-batch's gradient as it comes: right gradients, K× the traffic | expect: not one per micro-batch
def accumulate_and_sync(model, micro_batches) -> None:
    K, world = len(micro_batches), dist.get_world_size()
    params = list(model.parameters())
    for x, y in micro_batches:
        grads = torch.autograd.grad(F.mse_loss(model(x), y) / K, params)
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # every micro-batch pays the whole model's message
        for p, part in zip(params, flat.split([p.numel() for p in params])):
            p.grad = part.view_as(p) / world if p.grad is None else p.grad + part.view_as(p) / world

# %% 7.4 | one all-reduce per parameter: the sum is right, the latency paid once per tensor | expect: not one per parameter
def accumulate_and_sync(model, micro_batches) -> None:
    K = len(micro_batches)
    for x, y in micro_batches:
        (F.mse_loss(model(x), y) / K).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

# %% 7.4 | sums over the ranks, never divides by the world size | expect: divide by dist.get_world_size()
def accumulate_and_sync(model, micro_batches) -> None:
    K = len(micro_batches)
    for x, y in micro_batches:
        (F.mse_loss(model(x), y) / K).backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))

# %% 7.4 | forgets to divide each micro-loss by K | expect: divide each micro-loss by K
def accumulate_and_sync(model, micro_batches) -> None:
    for x, y in micro_batches:
        F.mse_loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))

# %% 7.4 | dist.reduce to rank 0: only one rank gets the global gradient | expect: every rank
def accumulate_and_sync(model, micro_batches) -> None:
    K = len(micro_batches)
    for x, y in micro_batches:
        (F.mse_loss(model(x), y) / K).backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.reduce(flat, dst=0)
    flat /= dist.get_world_size()
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))

# %% 7.4 | concatenates the K micro-batches into one backward: one all-reduce, K× the activations | expect: one forward and backward per micro-batch
def accumulate_and_sync(model, micro_batches) -> None:
    x, y = torch.cat([b[0] for b in micro_batches]), torch.cat([b[1] for b in micro_batches])
    F.mse_loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))

# %% 7.5 | forgets ÷K | expect: divide each micro-loss by K
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        with (contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | clips after every micro-batch's backward | expect: clip once
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        with (contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            (loss / K).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | steps the scheduler after every micro-batch | expect: scheduler once per optimizer step
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        with (contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            (loss / K).backward()
        scheduler.step()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | DDP only: calls no_sync() on an FSDP2 module too | expect: set_requires_gradient_sync
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            (loss / K).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | turns FSDP2's sync off but never back on for the last micro-batch | expect: True before the last
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            if not last:
                model.set_requires_gradient_sync(False)
        with (contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            (loss / K).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | no sync control: DDP all-reduces and FSDP2 reduce-scatters every micro-batch | expect: once per optimizer step
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for x, y in micro_batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        (loss / K).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | autocasts the loss only, not the forward | expect: autocast
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        with (contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()):
            out = model(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(out, y)
            (loss / K).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.5 | never clears the gradients: the next window adds to this one | expect: zero the gradients
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        last = k == K - 1
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
        with (contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            (loss / K).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    return norm

# %% 7.5 | delegates to the lesson's step | expect: compose the step yourself
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    return course_step.accumulation_step(model, optimizer, scheduler, micro_batches, max_norm=max_norm)

# %% 7.5 | one backward on the concatenated window: one sync, but K× the activations | expect: one forward and backward per micro-batch
def composed_step(model, optimizer, scheduler, micro_batches, max_norm: float):
    x, y = torch.cat([b[0] for b in micro_batches]), torch.cat([b[1] for b in micro_batches])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.mse_loss(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm

# %% 7.6 | no no_sync: DDP all-reduces after every micro-batch (same weights, K× the traffic) | expect: once per optimizer step
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for x, y in micro_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss / K).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stepped

# %% 7.6 | steps the scheduler every time, skipped or not | expect: do not step the scheduler
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss / K).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return scaler.get_scale() >= before

# %% 7.6 | clips the scaled gradient: no unscale_ before clipping | expect: unscale_ once
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss / K).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stepped

# %% 7.6 | unscales, then optimizer.step() itself: the inf window updates the weights | expect: scaler.step(optimizer)
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss / K).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    optimizer.step()
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stepped

# %% 7.6 | forgets scaler.update(): the scale never halves | expect: scaler.update()
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss / K).backward()
    scaler.unscale_(optimizer)
    found_inf = not all(torch.isfinite(p.grad).all() for p in model.parameters())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    if not found_inf:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return not found_inf

# %% 7.6 | reports every step as taken | expect: return False when the scaler skipped
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss / K).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    if scaler.get_scale() >= before:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return True

# %% 7.6 | forgets ÷K (hidden when clipping is active) | expect: scale each micro-loss ÷ K
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stepped

# %% 7.6 | one scaled backward on the concatenated window: K× the activations | expect: one forward and backward per micro-batch
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    x, y = torch.cat([b[0] for b in micro_batches]), torch.cat([b[1] for b in micro_batches])
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stepped

# %% 7.6 | keeps 7.5's bf16 autocast under the fp16 scaler | expect: float16
def scaled_step(model, optimizer, scheduler, scaler, micro_batches, max_norm: float) -> bool:
    K = len(micro_batches)
    for k, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if k < K - 1 else contextlib.nullcontext()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss / K).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = scaler.get_scale() >= before
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stepped
