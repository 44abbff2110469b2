"""Recorded wrong answers for solutions/08_activation_checkpointing.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 8.1 | checkpoints the last blocks: the rebuilt block adds to everything kept | expect: checkpoint the first blocks
def fewest_checkpointed(layers, boundary_bytes, block_bytes, budget_bytes):
    L, b, B = layers, boundary_bytes, block_bytes
    for n in range(L + 1):
        kept = n * b + (L - n) * B
        if (kept if n == 0 else kept + B - b) <= budget_bytes:
            return n
    return None

# %% 8.1 | forgets the block rebuilt during backward | expect: backward rebuilds one block
def fewest_checkpointed(layers, boundary_bytes, block_bytes, budget_bytes):
    L, b, B = layers, boundary_bytes, block_bytes
    for n in range(L + 1):
        if n * b + (L - n) * B <= budget_bytes:
            return n
    return None

# %% 8.1 | closed form rounded down | expect: round up
def fewest_checkpointed(layers, boundary_bytes, block_bytes, budget_bytes):
    L, b, B = layers, boundary_bytes, block_bytes
    if (L - 1) * b + B > budget_bytes:
        return None
    return max(0, int((L * B - budget_bytes) // (B - b)))

# %% 8.1 | a plan fits only strictly under the budget | expect: fits means peak <= budget
def fewest_checkpointed(layers, boundary_bytes, block_bytes, budget_bytes):
    L, b, B = layers, boundary_bytes, block_bytes
    for n in range(L + 1):
        kept = n * b + (L - n) * B
        if (kept if n == 0 else max(kept, (n - 1) * b + B)) < budget_bytes:
            return n
    return None

# %% 8.1 | delegates to the course's fewest_checkpointed | expect: yourself
def fewest_checkpointed(layers, boundary_bytes, block_bytes, budget_bytes):
    return ac.fewest_checkpointed(layers, boundary_bytes, block_bytes, budget_bytes)

# %% 8.2 | compares op with torch.mm (never an ATen overload): nothing kept | expect: ATen overload
def every_other_matmul():
    count = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in (torch.mm, torch.addmm):
            count[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if count[ctx.is_recompute] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

# %% 8.2 | counts aten.mm only: nn.Linear with a bias runs addmm | expect: addmm
def every_other_matmul():
    count = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op == aten.mm.default:
            count[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if count[ctx.is_recompute] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

# %% 8.2 | one count for the whole model, made once outside context_fn | expect: fresh count for every checkpointed block
_COUNT = {False: 0, True: 0}


def _policy(ctx, op, *args, **kwargs):
    if op in (aten.mm.default, aten.addmm.default):
        _COUNT[ctx.is_recompute] += 1
        return CheckpointPolicy.MUST_SAVE if _COUNT[ctx.is_recompute] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.PREFER_RECOMPUTE


def every_other_matmul():
    return create_selective_checkpoint_contexts(_policy)

# %% 8.2 | keeps the 2nd, 4th, … matmuls (counts from 0) | expect: 1st, 3rd, 5th
def every_other_matmul():
    count = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in (aten.mm.default, aten.addmm.default):
            count[ctx.is_recompute] += 1
            return CheckpointPolicy.MUST_SAVE if count[ctx.is_recompute] % 2 == 0 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

# %% 8.2 | keeps every matmul (the lesson's policy) | expect: recompute every second one
def every_other_matmul():
    def policy(ctx, op, *args, **kwargs):
        if op in (aten.mm.default, aten.addmm.default):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

# %% 8.3 | skips nn.Parameter instances only: copies the weight.t() views a Linear saves | expect: compare storages
def offload_hooks(model):
    def pack(t):
        if isinstance(t, nn.Parameter):
            return None, t
        return t.device, t.to("cpu", copy=True)

    def unpack(packed):
        device, t = packed
        return t if device is None else t.to(device)

    return pack, unpack

# %% 8.3 | delegates to save_on_cpu, which copies every saved tensor | expect: leave parameters and buffers uncopied
from m11_helpers.activation_offload import save_on_cpu_hooks


def offload_hooks(model):
    return save_on_cpu_hooks(pin_memory=True)

# %% 8.3 | t.cpu(): on a CPU that is t itself, nothing is copied | expect: nothing leaves the device
def offload_hooks(model):
    resident = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}

    def pack(t):
        if t.untyped_storage().data_ptr() in resident:
            return None, t
        return t.device, t.cpu()

    def unpack(packed):
        device, t = packed
        return t if device is None else t.to(device)

    return pack, unpack

# %% 8.3 | leaves everything that requires grad, activations included | expect: requires_grad
def offload_hooks(model):
    def pack(t):
        if t.requires_grad:
            return None, t
        return t.device, t.to("cpu", copy=True)

    def unpack(packed):
        device, t = packed
        return t if device is None else t.to(device)

    return pack, unpack

# %% 8.3 | keeps its own store of the copies: host memory leaks every step | expect: keep nothing alive yourself
_HOST = {}


def offload_hooks(model):
    resident = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}

    def pack(t):
        if t.untyped_storage().data_ptr() in resident:
            return None, t
        key = len(_HOST)
        _HOST[key] = (t.device, t.to("cpu", copy=True))
        return key

    def unpack(packed):
        if packed is None or isinstance(packed, tuple):
            return packed[1]
        device, t = _HOST[packed]
        return t.to(device)

    return pack, unpack

# %% 8.3 | delegates to the course's activation_offload.offload_hooks | expect: write the hooks yourself
from m11_helpers.activation_offload import offload_hooks as _course_offload_hooks


def offload_hooks(model):
    return _course_offload_hooks(model)

# %% 8.4 | recomputes without restoring the RNG state: other dropout masks | expect: RNG state
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            y = ctx.block(x)
        torch.autograd.backward(y, grad_y)
        return x.grad, None

# %% 8.4 | recomputes from the saved input without detaching it | expect: detach the saved input
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        ctx.rng = rng_state(python_numpy=False)
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        x.retain_grad()
        with fork_rng(), torch.enable_grad():
            set_rng_state(ctx.rng)
            y = ctx.block(x)
        torch.autograd.backward(y, grad_y)
        return x.grad, None

# %% 8.4 | keeps the block's graph from forward: nothing recomputed, nothing saved | expect: keep only the input
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            ctx.y = block(ctx.x)
        return ctx.y.detach()

    @staticmethod
    def backward(ctx, grad_y):
        torch.autograd.backward(ctx.y, grad_y)
        return ctx.x.grad, None

# %% 8.4 | returns None for the input's gradient: earlier blocks get none | expect: input's gradient
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        ctx.rng = rng_state(python_numpy=False)
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        with fork_rng(), torch.enable_grad():
            set_rng_state(ctx.rng)
            y = ctx.block(x.detach())
        torch.autograd.backward(y, grad_y)
        return None, None

# %% 8.4 | keeps each rebuilt block's graph on ctx until backward ends: every block's activations at once | expect: free each block's rebuilt activations
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        ctx.rng = rng_state(python_numpy=False)
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with fork_rng(), torch.enable_grad():
            set_rng_state(ctx.rng)
            ctx.y = ctx.block(x)  # kept "in case": ctx lives until the whole backward is done
        torch.autograd.backward(ctx.y, grad_y, retain_graph=True)
        return x.grad, None

# %% 8.4 | delegates to torch.utils.checkpoint | expect: yourself
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        ctx.save_for_backward(x)
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            ctx.y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            ctx.x = x
        return ctx.y.detach()

    @staticmethod
    def backward(ctx, grad_y):
        torch.autograd.backward(ctx.y, grad_y)
        return ctx.x.grad, None
