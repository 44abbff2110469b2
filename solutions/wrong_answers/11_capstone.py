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

# %% 11.2 | shards under --bf16 with no mixed-precision policy: computes in fp32 | expect: MixedPrecisionPolicy(param_dtype=torch.bfloat16
def build_run(args, device, world):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT, dropout=args.dropout)
    if args.ac:
        for block in model.blocks[::args.ac_every]:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, device, seed=args.seed)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=True)
    scheduler = warmup_cosine(optimizer, warmup=args.warmup, total=args.steps, floor=args.min_lr_ratio)
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, timeout=args.timeout) if args.ckpt_dir else None
    return model, optimizer, scheduler, ckpt

# %% 11.2 | ignores --ac: no block is recomputed | expect: checkpoint the blocks the flags declare
def build_run(args, device, world):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT, dropout=args.dropout)
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.bf16 else None, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    materialize(model, device, seed=args.seed)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=True)
    scheduler = warmup_cosine(optimizer, warmup=args.warmup, total=args.steps, floor=args.min_lr_ratio)
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, timeout=args.timeout) if args.ckpt_dir else None
    return model, optimizer, scheduler, ckpt

# %% 11.2 | checkpoints every block whatever --ac-every declares | expect: model.blocks[::args.ac_every]
def build_run(args, device, world):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT, dropout=args.dropout)
    if args.ac:
        for block in model.blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.bf16 else None, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    materialize(model, device, seed=args.seed)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=True)
    scheduler = warmup_cosine(optimizer, warmup=args.warmup, total=args.steps, floor=args.min_lr_ratio)
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, timeout=args.timeout) if args.ckpt_dir else None
    return model, optimizer, scheduler, ckpt

# %% 11.2 | one fully_shard for the whole model, none per block | expect: one fully_shard per block
def build_run(args, device, world):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT, dropout=args.dropout)
    if args.ac:
        for block in model.blocks[::args.ac_every]:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.bf16 else None, reduce_dtype=torch.float32)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    materialize(model, device, seed=args.seed)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=True)
    scheduler = warmup_cosine(optimizer, warmup=args.warmup, total=args.steps, floor=args.min_lr_ratio)
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, timeout=args.timeout) if args.ckpt_dir else None
    return model, optimizer, scheduler, ckpt

# %% 11.2 | weight decay on every parameter, biases and norm gains too | expect: weight decay on the matrices only
def build_run(args, device, world):
    with torch.device("meta"):
        model = TinyGPT(TINY_GPT, dropout=args.dropout)
    if args.ac:
        for block in model.blocks[::args.ac_every]:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.bf16 else None, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    materialize(model, device, seed=args.seed)
    params = list(model.parameters())
    groups = [{"params": params, "weight_decay": args.weight_decay}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=True)
    scheduler = warmup_cosine(optimizer, warmup=args.warmup, total=args.steps, floor=args.min_lr_ratio)
    ckpt = Checkpointer(args.ckpt_dir, keep=args.keep, timeout=args.timeout) if args.ckpt_dir else None
    return model, optimizer, scheduler, ckpt

# %% 11.3 | stops without saving (counts on the last periodic checkpoint) | expect: save at that step boundary
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


def capstone_config() -> str:
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU  # torchrun's N processes (on a CPU box ACCELERATE_USE_CPU=1 makes them gloo ranks)
num_machines: 1
num_processes: 4
mixed_precision: 'no'  # the script's --bf16 is the one precision policy: no second autocast
use_cpu: false  # true starts ONE process, whatever num_processes says
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags) -> list:
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]  # my policy: blocks 0 and 2
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]


# %% 11.3 | checkpoints the model and optimizer but not the scheduler | expect: the scheduler is state
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


def capstone_config() -> str:
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU  # torchrun's N processes (on a CPU box ACCELERATE_USE_CPU=1 makes them gloo ranks)
num_machines: 1
num_processes: 4
mixed_precision: 'no'  # the script's --bf16 is the one precision policy: no second autocast
use_cpu: false  # true starts ONE process, whatever num_processes says
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags) -> list:
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]  # my policy: blocks 0 and 2
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]


# %% 11.3 | starts the run on 2 processes, not 4 | expect: num_processes: 4
def train_loop(run, train_step) -> int:
    state = {"scheduler": run.scheduler}  # with the model and optimizer (and the RNG, which ckpt keeps itself)
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0  # checkpoint N holds the state after N steps: N runs next
    while step < run.steps:
        if run.stop_requested():  # agreed: every rank stops at this same boundary
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()  # landed before we return (and the process may exit)
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)  # async: the next step overlaps the write
    run.ckpt.wait()
    return step


def capstone_config():
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_machines: 1
num_processes: 2
mixed_precision: 'no'
use_cpu: false
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags):
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]

# %% 11.3 | --cpu for a CPU box: accelerate then starts ONE process | expect: not --cpu / use_cpu
def train_loop(run, train_step) -> int:
    state = {"scheduler": run.scheduler}  # with the model and optimizer (and the RNG, which ckpt keeps itself)
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0  # checkpoint N holds the state after N steps: N runs next
    while step < run.steps:
        if run.stop_requested():  # agreed: every rank stops at this same boundary
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()  # landed before we return (and the process may exit)
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)  # async: the next step overlaps the write
    run.ckpt.wait()
    return step


def capstone_config():
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
num_machines: 1
num_processes: 4
mixed_precision: 'no'
use_cpu: true
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags):
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]

# %% 11.3 | 4 processes but no multi-process launcher (distributed_type NO) | expect: distributed_type: MULTI_GPU
def train_loop(run, train_step) -> int:
    state = {"scheduler": run.scheduler}  # with the model and optimizer (and the RNG, which ckpt keeps itself)
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0  # checkpoint N holds the state after N steps: N runs next
    while step < run.steps:
        if run.stop_requested():  # agreed: every rank stops at this same boundary
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()  # landed before we return (and the process may exit)
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)  # async: the next step overlaps the write
    run.ckpt.wait()
    return step


def capstone_config():
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
num_machines: 1
num_processes: 4
mixed_precision: 'no'
use_cpu: false
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags):
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]

# %% 11.3 | leaves --bf16 out of the command: the run computes in fp32 | expect: every lever on
def train_loop(run, train_step) -> int:
    state = {"scheduler": run.scheduler}  # with the model and optimizer (and the RNG, which ckpt keeps itself)
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0  # checkpoint N holds the state after N steps: N runs next
    while step < run.steps:
        if run.stop_requested():  # agreed: every rank stops at this same boundary
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()  # landed before we return (and the process may exit)
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)  # async: the next step overlaps the write
    run.ckpt.wait()
    return step


def capstone_config():
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_machines: 1
num_processes: 4
mixed_precision: 'no'
use_cpu: false
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags):
    levers = ["--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]

# %% 11.3 | launches the reference script, not the capstone | expect: script_path('capstone.py')
def train_loop(run, train_step) -> int:
    state = {"scheduler": run.scheduler}  # with the model and optimizer (and the RNG, which ckpt keeps itself)
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0  # checkpoint N holds the state after N steps: N runs next
    while step < run.steps:
        if run.stop_requested():  # agreed: every rank stops at this same boundary
            run.ckpt.save(step, run.model, run.optimizer, **state)
            run.ckpt.wait()  # landed before we return (and the process may exit)
            return step
        train_step(run.model, run.micro_batches(step), run.clip)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % run.ckpt_every == 0 or step == run.steps:
            run.ckpt.save(step, run.model, run.optimizer, **state)  # async: the next step overlaps the write
    run.ckpt.wait()
    return step


def capstone_config():
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_machines: 1
num_processes: 4
mixed_precision: 'no'
use_cpu: false
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags):
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]
    return ["accelerate", "launch", "--config_file", config_file, script_path("train.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]

# %% 11.3 | reseeds every rank after resuming: the restarted steps draw the first step's masks again | expect: do not reseed after a resume
def train_loop(run, train_step):
    state = {"scheduler": run.scheduler}
    resumed = run.ckpt.load(run.model, run.optimizer, **state)
    step = resumed["step"] if resumed else 0
    torch.manual_seed(run.args.seed + run.rank)  # "reproducible": every start draws the same masks
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


def capstone_config() -> str:
    return """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU  # torchrun's N processes (on a CPU box ACCELERATE_USE_CPU=1 makes them gloo ranks)
num_machines: 1
num_processes: 4
mixed_precision: 'no'  # the script's --bf16 is the one precision policy: no second autocast
use_cpu: false  # true starts ONE process, whatever num_processes says
"""


def capstone_command(config_file, run_file, ckpt_dir, run_flags) -> list:
    levers = ["--bf16", "--accum", 2, "--ac", "--ac-every", 2, "--dropout", 0.1]  # my policy: blocks 0 and 2
    return ["accelerate", "launch", "--config_file", config_file, script_path("capstone.py"), "--run", run_file,
            *levers, *run_flags, "--ckpt-dir", ckpt_dir]


# %% 11.4 | fits on the model states alone, forgetting the activations | expect: the activations count too
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % (world_size * flags.accum):
            continue
        micro = batch // (world_size * flags.accum)
        s = rank_model_states(param_shapes(), world_size, flags)
        autocast = flags.bf16 and flags.parallel == "ddp"
        acts = activation_bytes(TINY_GPT, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=autocast,
                                recompute="full" if flags.ac else "none")["total"]
        if flags.bf16 and not autocast:
            acts -= cpu_bf16_norm_stats(TINY_GPT, micro, ac=flags.ac)
        peak = s["parameters"] + s["gradients"] + s["optimizer"]
        key = (flags.levers, comm_elements(flags, world_size)["total"], peak)
        if peak <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, peak), key
    return best

# %% 11.4 | least communication first, then the fewest levers | expect: the fewest levers on first
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % (world_size * flags.accum):
            continue
        micro = batch // (world_size * flags.accum)
        s = rank_model_states(param_shapes(), world_size, flags)
        autocast = flags.bf16 and flags.parallel == "ddp"
        acts = activation_bytes(TINY_GPT, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=autocast,
                                recompute="full" if flags.ac else "none")["total"]
        if flags.bf16 and not autocast:
            acts -= cpu_bf16_norm_stats(TINY_GPT, micro, ac=flags.ac)
        peak = s["parameters"] + s["gradients"] + s["optimizer"] + acts
        key = (comm_elements(flags, world_size)["total"], flags.levers, peak)
        if peak <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, peak), key
    return best

# %% 11.4 | counts the activations of all K micro-batches as alive at once | expect: ONE micro-batch's activations
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % (world_size * flags.accum):
            continue
        micro = batch // (world_size * flags.accum)
        s = rank_model_states(param_shapes(), world_size, flags)
        autocast = flags.bf16 and flags.parallel == "ddp"
        acts = activation_bytes(TINY_GPT, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=autocast,
                                recompute="full" if flags.ac else "none")["total"]
        if flags.bf16 and not autocast:
            acts -= cpu_bf16_norm_stats(TINY_GPT, micro, ac=flags.ac)
        peak = s["parameters"] + s["gradients"] + s["optimizer"] + flags.accum * acts
        key = (flags.levers, comm_elements(flags, world_size)["total"], peak)
        if peak <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, peak), key
    return best

# %% 11.4 | plans as one process: nothing sharded, the whole batch on rank 0 | expect: per rank
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % (world_size * flags.accum):
            continue
        micro = batch // flags.accum
        s = rank_model_states(param_shapes(), 1, flags)
        autocast = flags.bf16 and flags.parallel == "ddp"
        acts = activation_bytes(TINY_GPT, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=autocast,
                                recompute="full" if flags.ac else "none")["total"]
        if flags.bf16 and not autocast:
            acts -= cpu_bf16_norm_stats(TINY_GPT, micro, ac=flags.ac)
        peak = s["parameters"] + s["gradients"] + s["optimizer"] + acts
        key = (flags.levers, comm_elements(flags, world_size)["total"], peak)
        if peak <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, peak), key
    return best

# %% 11.4 | reports the model states as the plan, without the activations | expect: ONE micro-batch's activations
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % (world_size * flags.accum):
            continue
        micro = batch // (world_size * flags.accum)
        s = rank_model_states(param_shapes(), world_size, flags)
        autocast = flags.bf16 and flags.parallel == "ddp"
        acts = activation_bytes(TINY_GPT, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=autocast,
                                recompute="full" if flags.ac else "none")["total"]
        if flags.bf16 and not autocast:
            acts -= cpu_bf16_norm_stats(TINY_GPT, micro, ac=flags.ac)
        peak = s["parameters"] + s["gradients"] + s["optimizer"] + acts
        key = (flags.levers, comm_elements(flags, world_size)["total"], peak)
        if peak <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, peak - acts), key
    return best

# %% 11.4 | plans CUDA's fp32 LayerNorm statistics (the GPU's numbers), not this CPU's bf16 ones | expect: measured
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        if batch % (world_size * flags.accum):
            continue
        micro = batch // (world_size * flags.accum)
        s = rank_model_states(param_shapes(), world_size, flags)
        autocast = flags.bf16 and flags.parallel == "ddp"
        acts = activation_bytes(TINY_GPT, micro, flash=True, dtype_bytes=2 if flags.bf16 else 4, autocast=autocast,
                                recompute="full" if flags.ac else "none")["total"]
        peak = s["parameters"] + s["gradients"] + s["optimizer"] + acts
        key = (flags.levers, comm_elements(flags, world_size)["total"], peak)
        if peak <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, peak), key
    return best

# %% 11.4 | asks the lesson's planner instead of deriving the plan | expect: derive the plan from its pieces
def pick_levers(budget, world_size=2, batch=16):
    best, best_key = (None, None), None
    for flags in FLAG_GRID:
        p = plan_run(flags, world_size, batch)
        key = (flags.levers, p["comm_elements"], p["total"])
        if p["total"] <= budget and (best_key is None or key < best_key):
            best, best_key = (flags, p["total"]), key
    return best
