"""Recorded wrong answers for solutions/10_cloud_spot.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 10.1 | rounds Young's interval into a count | expect: Young's τ rounded
def best_checkpoint_count(work_seconds, checkpoint_seconds, mtbf_seconds):
    tau = math.sqrt(2 * checkpoint_seconds * mtbf_seconds)
    return max(0, round(work_seconds / tau) - 1)

# %% 10.1 | returns the number of segments, not of checkpoints | expect: number of segments
def best_checkpoint_count(work_seconds, checkpoint_seconds, mtbf_seconds):
    def survive(length):
        return mtbf_seconds * math.expm1(length / mtbf_seconds)

    def wall(segments):
        tau = work_seconds / segments
        return (segments - 1) * survive(tau + checkpoint_seconds) + survive(tau)

    k = 1
    while wall(k + 1) < wall(k):
        k += 1
    return k

# %% 10.1 | checkpoints after the last segment too | expect: no checkpoint after the last segment
def best_checkpoint_count(work_seconds, checkpoint_seconds, mtbf_seconds):
    def wall(n):
        tau = work_seconds / (n + 1)
        return (n + 1) * mtbf_seconds * math.expm1((tau + checkpoint_seconds) / mtbf_seconds)

    n = 0
    while wall(n + 1) < wall(n):
        n += 1
    return n

# %% 10.1 | a checkpoint cannot be interrupted (adds δ outside the exposure) | expect: interrupt a checkpoint too
def best_checkpoint_count(work_seconds, checkpoint_seconds, mtbf_seconds):
    def wall(n):
        tau = work_seconds / (n + 1)
        return (n + 1) * mtbf_seconds * math.expm1(tau / mtbf_seconds) + n * checkpoint_seconds

    n = 0
    while wall(n + 1) < wall(n):
        n += 1
    return n

# %% 10.1 | delegates to cloud.best_checkpoint_count | expect: yourself
def best_checkpoint_count(work_seconds, checkpoint_seconds, mtbf_seconds):
    return cloud.best_checkpoint_count(work_seconds, checkpoint_seconds, mtbf_seconds)

# %% 10.2 | torch.save into a buffer, then writes path in place + fsync (not atomic) | expect: itself for writing
def my_atomic_save(obj, path) -> None:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())

# %% 10.2 | temporary file, then copies it over the checkpoint | expect: itself for writing
def my_atomic_save(obj, path) -> None:
    import shutil

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    shutil.copyfile(tmp, path)
    tmp.unlink()

# %% 10.2 | renames without fsync (the bytes may be only in the page cache) | expect: fsync the temporary file before the rename
def my_atomic_save(obj, path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)

# %% 10.2 | fsyncs after the rename | expect: fsync the temporary file before the rename
def my_atomic_save(obj, path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)

# %% 10.2 | delegates to fault_tolerance.atomic_save | expect: yourself
def my_atomic_save(obj, path) -> None:
    atomic_save(obj, path)

# %% 10.2 | writes the temporary file in the system's temp folder, then renames it into place | expect: same folder
def my_atomic_save(obj, path) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(suffix=".pt")  # the system's temp folder: maybe another filesystem
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

# %% 10.3 | ignores the restart cost | expect: restart
def break_even_preemptions(discount, checkpoint_seconds, restart_seconds):
    def ratio(rate):
        m = 3600 / rate
        tau = cloud.young_interval(checkpoint_seconds, m)
        return (1 - discount) * cloud.expected_wall_time(1.0, tau, checkpoint_seconds, m)

    lo, hi = 1e-6, 1e4
    while hi / lo > 1 + 1e-9:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ratio(mid) > 1 else (mid, hi)
    return math.sqrt(lo * hi)

# %% 10.3 | lets spot take 1 + discount times as long, not 1/(1 − discount) | expect: 1/(1 − discount)
def break_even_preemptions(discount, checkpoint_seconds, restart_seconds):
    def slowdown(rate):
        m = 3600 / rate
        tau = cloud.young_interval(checkpoint_seconds, m)
        return cloud.expected_wall_time(1.0, tau, checkpoint_seconds, m, restart_seconds)

    lo, hi = 1e-6, 1e4
    while hi / lo > 1 + 1e-9:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if slowdown(mid) > 1 + discount else (mid, hi)
    return math.sqrt(lo * hi)

# %% 10.3 | returns preemptions per second | expect: per second
def break_even_preemptions(discount, checkpoint_seconds, restart_seconds):
    def ratio(rate_per_second):
        m = 1 / rate_per_second
        tau = cloud.young_interval(checkpoint_seconds, m)
        return (1 - discount) * cloud.expected_wall_time(1.0, tau, checkpoint_seconds, m, restart_seconds)

    lo, hi = 1e-9, 1.0
    while hi / lo > 1 + 1e-9:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ratio(mid) > 1 else (mid, hi)
    return math.sqrt(lo * hi)

# %% 10.3 | Young's first-order waste instead of the full model | expect: (1 − discount) × its expected wall time
def break_even_preemptions(discount, checkpoint_seconds, restart_seconds):
    # waste at Young's optimum ≈ √(2δ/M) + R/M: (1 − d)(1 + √(2δλ) + Rλ) = 1, a quadratic in √λ (λ per second)
    a, b, c = restart_seconds, math.sqrt(2 * checkpoint_seconds), 1 - 1 / (1 - discount)
    root = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    return root ** 2 * 3600

# %% 10.3 | delegates to cloud.spot_cost | expect: yourself
def break_even_preemptions(discount, checkpoint_seconds, restart_seconds):
    lo, hi = 1e-6, 1e4
    while hi / lo > 1 + 1e-9:
        mid = math.sqrt(lo * hi)
        saving = cloud.spot_cost(1, 1.0, discount, mid, checkpoint_seconds, restart_seconds)["saving"]
        lo, hi = (lo, mid) if saving < 0 else (mid, hi)
    return math.sqrt(lo * hi)

# %% 10.4 | restores the loader by replaying every batch from the seed | expect: replays nothing
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, 0
        self.seed, self.taken = seed, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        self.pos += 1
        self.taken += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"seed": self.seed, "taken": self.taken}

    def load_state_dict(self, sd):
        self.__init__(self.n, self.batch, sd["seed"])
        for _ in range(sd["taken"]):
            next(self)


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "batches": batches.state_dict(),
            "rng": rng_state(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    batches.load_state_dict(state["batches"])
    set_rng_state(state["rng"])
    return state["step"]

# %% 10.4 | reseeds every epoch from seed + epoch (not one generator) | expect: never reseed per epoch
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos, self.seed = None, 0, seed

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.epoch = getattr(self, "epoch", -1) + 1
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            self.perm, self.pos = torch.randperm(self.n, generator=g), 0
        self.pos += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"gen": self.g.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, sd):
        self.g.set_state(sd["gen"])
        self.perm, self.pos = sd["perm"], sd["pos"]


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "batches": batches.state_dict(),
            "rng": rng_state(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    batches.load_state_dict(state["batches"])
    set_rng_state(state["rng"])
    return state["step"]

# %% 10.4 | restores the epoch and position but not the generator | expect: across the next epoch boundary
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        self.pos += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"gen": self.g.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, sd):
        self.perm, self.pos = sd["perm"], sd["pos"]


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "batches": batches.state_dict(),
            "rng": rng_state(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    batches.load_state_dict(state["batches"])
    set_rng_state(state["rng"])
    return state["step"]

# %% 10.4 | leaves the loader out of the checkpoint | expect: the batches after the resume
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        self.pos += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"gen": self.g.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, sd):
        self.g.set_state(sd["gen"])
        self.perm, self.pos = sd["perm"], sd["pos"]


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "rng": rng_state(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    set_rng_state(state["rng"])
    return state["step"]

# %% 10.4 | forgets the RNG state | expect: RNG state
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        self.pos += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"gen": self.g.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, sd):
        self.g.set_state(sd["gen"])
        self.perm, self.pos = sd["perm"], sd["pos"]


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "batches": batches.state_dict(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    batches.load_state_dict(state["batches"])
    return state["step"]

# %% 10.4 | saves the weights only (a fresh AdamW) | expect: AdamW's exp_avg
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        self.pos += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"gen": self.g.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, sd):
        self.g.set_state(sd["gen"])
        self.perm, self.pos = sd["perm"], sd["pos"]


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "batches": batches.state_dict(),
            "rng": rng_state(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    batches.load_state_dict(state["batches"])
    set_rng_state(state["rng"])
    return state["step"]

# %% 10.4 | restore returns the last step done (off by one) | expect: the next step to run
class ShuffledBatches:
    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = None, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.perm is None or self.pos == self.n // self.batch:
            self.perm, self.pos = torch.randperm(self.n, generator=self.g), 0
        self.pos += 1
        return self.perm[(self.pos - 1) * self.batch:self.pos * self.batch]

    def state_dict(self):
        return {"gen": self.g.get_state(), "perm": self.perm, "pos": self.pos}

    def load_state_dict(self, sd):
        self.g.set_state(sd["gen"])
        self.perm, self.pos = sd["perm"], sd["pos"]


def capture(model, opt, batches, step) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "batches": batches.state_dict(),
            "rng": rng_state(), "step": step}


def restore(state, model, opt, batches) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    batches.load_state_dict(state["batches"])
    set_rng_state(state["rng"])
    return state["step"] - 1

# %% 10.5 | each rank stops on its own notice (no agreement) | expect: the ranks hung
def run_until_preempted(train_step, num_steps, save):
    notice = {"received": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: notice.update(received=True))
    for step in range(num_steps):
        if notice["received"]:
            save(step)
            return step
        train_step(step)
    return num_steps

# %% 10.5 | agrees with MIN (stops only when every rank got the notice) | expect: ANY rank
def run_until_preempted(train_step, num_steps, save):
    notice = {"received": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: notice.update(received=True))
    for step in range(num_steps):
        flag = torch.tensor([1.0 if notice["received"] else 0.0], device=rank_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() > 0:
            save(step)
            return step
        train_step(step)
    return num_steps

# %% 10.5 | agrees with SUM and tests the sum == 1 | expect: number of ranks that got it
def run_until_preempted(train_step, num_steps, save):
    notice = {"received": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: notice.update(received=True))
    for step in range(num_steps):
        flag = torch.tensor([1.0 if notice["received"] else 0.0], device=rank_device())
        dist.all_reduce(flag)
        if flag.item() == 1.0:
            save(step)
            return step
        train_step(step)
    return num_steps

# %% 10.5 | the handler saves at once (mid-step), then the ranks agree | expect: the signal handler ran save()
def run_until_preempted(train_step, num_steps, save):
    state = {"received": False, "step": 0}

    def on_sigterm(signum, frame):
        save(state["step"])  # "the notice is short: save right away"
        state["received"] = True

    signal.signal(signal.SIGTERM, on_sigterm)
    for step in range(num_steps):
        state["step"] = step
        flag = torch.tensor([1.0 if state["received"] else 0.0], device=rank_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            save(step)
            return step
        train_step(step)
    return num_steps

# %% 10.5 | checks the notice every 4 steps only | expect: first step boundary after the notice
def run_until_preempted(train_step, num_steps, save):
    notice = {"received": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: notice.update(received=True))
    for step in range(num_steps):
        if step % 4 == 0:
            flag = torch.tensor([1.0 if notice["received"] else 0.0], device=rank_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                save(step)
                return step
        train_step(step)
    return num_steps

# %% 10.5 | delegates to fault_tolerance.PreemptionNotice | expect: write the handler and the agreement
def run_until_preempted(train_step, num_steps, save):
    notice = PreemptionNotice()
    for step in range(num_steps):
        if notice.agreed():
            save(step)
            return step
        train_step(step)
    return num_steps

# %% 10.5 | makes the flag with torch.tensor and no device: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
def run_until_preempted(train_step, num_steps, save):
    notice = {"received": False}

    def on_sigterm(signum, frame):
        notice["received"] = True

    signal.signal(signal.SIGTERM, on_sigterm)
    for step in range(num_steps):
        flag = torch.tensor([1.0 if notice["received"] else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            save(step)
            return step
        train_step(step)
    return num_steps

# %% 10.6 | the pseudo-gradient's sign flipped (θ_i − θ) | expect: pseudo-gradient's sign
def diloco_sync(model, outer, buf, lr=0.7, momentum=0.9):
    world = dist.get_world_size()
    with torch.no_grad():
        delta = [p.detach() - o for o, p in zip(outer, model.parameters())]
        for d in delta:
            dist.all_reduce(d)
            d /= world
        new_buf = [momentum * b + d for b, d in zip(buf, delta)]
        new_outer = [o - lr * (d + momentum * b) for o, d, b in zip(outer, delta, new_buf)]
        for p, o in zip(model.parameters(), new_outer):
            p.copy_(o)
    return new_outer, new_buf

# %% 10.6 | forgets to reset the workers to the new θ (inner state kept) | expect: reset the inner state
def diloco_sync(model, outer, buf, lr=0.7, momentum=0.9):
    world = dist.get_world_size()
    with torch.no_grad():
        delta = [o - p.detach() for o, p in zip(outer, model.parameters())]
        for d in delta:
            dist.all_reduce(d)
            d /= world
        new_buf = [momentum * b + d for b, d in zip(buf, delta)]
        new_outer = [o - lr * (d + momentum * b) for o, d, b in zip(outer, delta, new_buf)]
    return new_outer, new_buf

# %% 10.6 | averages the weights instead of the pseudo-gradients: momentum lost | expect: momentum lost
def diloco_sync(model, outer, buf, lr=0.7, momentum=0.9):
    world = dist.get_world_size()
    with torch.no_grad():
        avg = [p.detach().clone() for p in model.parameters()]
        for a in avg:
            dist.all_reduce(a)
            a /= world
        for p, a in zip(model.parameters(), avg):
            p.copy_(a)
    return avg, buf

# %% 10.6 | sums the pseudo-gradients (forgets the world size) | expect: divide by the world size
def diloco_sync(model, outer, buf, lr=0.7, momentum=0.9):
    with torch.no_grad():
        delta = [o - p.detach() for o, p in zip(outer, model.parameters())]
        for d in delta:
            dist.all_reduce(d)
        new_buf = [momentum * b + d for b, d in zip(buf, delta)]
        new_outer = [o - lr * (d + momentum * b) for o, d, b in zip(outer, delta, new_buf)]
        for p, o in zip(model.parameters(), new_outer):
            p.copy_(o)
    return new_outer, new_buf

# %% 10.6 | delegates to the course's outer step | expect: yourself
def diloco_sync(model, outer, buf, lr=0.7, momentum=0.9):
    world = dist.get_world_size()
    with torch.no_grad():
        avg = [p.detach().clone() for p in model.parameters()]
        for a in avg:
            dist.all_reduce(a)
            a /= world
        return diloco_round_end(model, outer, buf, avg, lr, momentum)

# %% 10.7 | saves synchronously with dcp.save | expect: a synchronous save
def save_async(folder, step, model, opt, group):
    model_sd, optim_sd = get_state_dict(model, opt)
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    dcp.save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=tmp, process_group=group)
    if dist.get_rank() == 0:
        os.replace(tmp, final)
        fsync_dir(folder)
    published = Future()
    published.set_result(step)
    return published


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]

# %% 10.7 | waits on async_save's future right after calling it | expect: save_async waited for the write
def save_async(folder, step, model, opt, group):
    model_sd, optim_sd = get_state_dict(model, opt)
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    dcp.async_save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=tmp,
                   process_group=group).result()
    if dist.get_rank() == 0:
        os.replace(tmp, final)
        fsync_dir(folder)
    published = Future()
    published.set_result(step)
    return published


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]

# %% 10.7 | writes every save over the one checkpoint folder | expect: inside a fresh step_N.tmp/
def save_async(folder, step, model, opt, group):
    model_sd, optim_sd = get_state_dict(model, opt)
    return dcp.async_save({"model": model_sd, "optim": optim_sd, "step": step},
                          checkpoint_id=Path(folder) / "step_latest", process_group=group)


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]

# %% 10.7 | publishes the folder before the write has finished | expect: published only after its write finished
def save_async(folder, step, model, opt, group):
    model_sd, optim_sd = get_state_dict(model, opt)
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    dcp.async_save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=tmp, process_group=group)
    if dist.get_rank() == 0:  # "the save has started: it is as good as done"
        tmp.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)
    published = Future()
    published.set_result(step)
    return published


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]

# %% 10.7 | each rank torch.saves its own shards in a thread (rank-local files) | expect: cannot be resharded
def save_async(folder, step, model, opt, group):
    from concurrent.futures import ThreadPoolExecutor

    rank = dist.get_rank()
    state = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}, "step": step,
             "optim": opt.state_dict()}
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)

    def write():
        torch.save(state, tmp / f"rank{rank}.pt")
        dist.barrier(group=group)
        if rank == 0:
            os.replace(tmp, final)
        return step

    return ThreadPoolExecutor(1).submit(write)


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]

# %% 10.7 | saves the model only, not the optimizer | expect: no optimizer state
def save_async(folder, step, model, opt, group):
    model_sd, _ = get_state_dict(model, opt)
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    written = dcp.async_save({"model": model_sd, "step": step}, checkpoint_id=tmp, process_group=group)
    published = Future()

    def publish(done):
        done.result()
        if dist.get_rank() == 0:
            os.replace(tmp, final)
            fsync_dir(folder)
        published.set_result(step)

    written.add_done_callback(publish)
    return published


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]

# %% 10.7 | gathers the full state onto rank 0 and saves that | expect: gathered onto one rank
def save_async(folder, step, model, opt, group):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    written = dcp.async_save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=tmp,
                             process_group=group)
    published = Future()

    def publish(done):
        done.result()
        if dist.get_rank() == 0:
            os.replace(tmp, final)
            fsync_dir(folder)
        published.set_result(step)

    written.add_done_callback(publish)
    return published


def load_newest(folder, model, opt, group):
    published = sorted(p for p in Path(folder).glob("step_*") if p.suffix != ".tmp" and (p / ".metadata").is_file())
    if not published:
        return None
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=published[-1], process_group=group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["step"]
