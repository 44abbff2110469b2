"""Recorded wrong answers for solutions/12_long_context_moe.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 12.1 | contiguous chunks: rank r holds chunk r of N | expect: 2N chunks
def zigzag_shard(x, rank, world):
    return x.chunk(world, dim=-2)[rank]


def zigzag_unshard(parts):
    halves = [p.chunk(2, dim=-2) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=-2)

# %% 12.1 | every N-th token (striped), not the 2N-chunk zigzag | expect: 2N chunks
def zigzag_shard(x, rank, world):
    return x[..., rank::world, :]


def zigzag_unshard(parts):
    halves = [p.chunk(2, dim=-2) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=-2)

# %% 12.1 | off by one: chunks r and 2N-2-r | expect: exactly one rank
def zigzag_shard(x, rank, world):
    parts = x.chunk(2 * world, dim=-2)
    return torch.cat([parts[rank], parts[2 * world - 2 - rank]], dim=-2)


def zigzag_unshard(parts):
    halves = [p.chunk(2, dim=-2) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=-2)

# %% 12.1 | the two chunks in the wrong order | expect: order matters
def zigzag_shard(x, rank, world):
    parts = x.chunk(2 * world, dim=-2)
    return torch.cat([parts[2 * world - 1 - rank], parts[rank]], dim=-2)


def zigzag_unshard(parts):
    halves = [p.chunk(2, dim=-2) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim=-2)

# %% 12.1 | unshard: the parts concatenated in rank order | expect: keeps the zigzag
def zigzag_shard(x, rank, world):
    parts = x.chunk(2 * world, dim=-2)
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)


def zigzag_unshard(parts):
    return torch.cat(parts, dim=-2)

# %% 12.1 | unshard: second chunks in rank order, not reversed | expect: REVERSE rank order
def zigzag_shard(x, rank, world):
    parts = x.chunk(2 * world, dim=-2)
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)


def zigzag_unshard(parts):
    halves = [p.chunk(2, dim=-2) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=-2)

# %% 12.1 | unshard: reverses the first chunks instead of the second | expect: REVERSE rank order
def zigzag_shard(x, rank, world):
    parts = x.chunk(2 * world, dim=-2)
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)


def zigzag_unshard(parts):
    halves = [p.chunk(2, dim=-2) for p in parts]
    return torch.cat([h[0] for h in reversed(halves)] + [h[1] for h in halves], dim=-2)

# %% 12.1 | unshard through the lesson's context_parallel.unshard_sequence | expect: yourself
def zigzag_shard(x, rank, world):
    parts = x.chunk(2 * world, dim=-2)
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)


def zigzag_unshard(parts):
    from m11_helpers.context_parallel import unshard_sequence
    return unshard_sequence(parts, layout="zigzag")

# %% 12.1 | attention: the gathered keys taken for the sequence in order (their positions 0..T-1) | expect: global positions
def zigzag_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    if x.shape[-2] % (2 * world):  # torch.chunk would hand out unequal chunks (or fewer than 2N)
        raise ValueError(f"the sequence length (x.shape[-2] = {x.shape[-2]}) must be a multiple of 2 * world = "
                         f"{2 * world}")
    parts = x.chunk(2 * world, dim=-2)  # 2N chunks along the sequence
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)  # (B, H, T/N, D)


def zigzag_unshard(parts: list) -> torch.Tensor:
    halves = [p.chunk(2, dim=-2) for p in parts]  # rank r: (chunk r, chunk 2N-1-r)
    first = [h[0] for h in halves]  # chunks 0 .. N-1: rank order
    second = [h[1] for h in reversed(halves)]  # chunks N .. 2N-1: reverse rank order
    return torch.cat(first + second, dim=-2)  # (B, H, T, D)


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    T = world * q.shape[-2]
    pos = torch.arange(T, device=q.device).view(T, 1)  # (T, 1): each token's global position
    q_pos = zigzag_shard(pos, rank, world).view(-1)  # (T/N,): where my queries sit
    k_pos = pos.view(-1)  # (T,): the keys, 0..T-1
    s = q @ torch.cat(ks, dim=-2).transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T/N, T): my queries only
    s = s.masked_fill(k_pos.view(1, -1) > q_pos.view(-1, 1), float("-inf"))  # a key after its query is masked
    return torch.softmax(s, dim=-1) @ torch.cat(vs, dim=-2)  # (B, H, T/N, D)

# %% 12.1 | attention: queries masked as if the rank held one contiguous chunk | expect: global positions
def zigzag_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    if x.shape[-2] % (2 * world):  # torch.chunk would hand out unequal chunks (or fewer than 2N)
        raise ValueError(f"the sequence length (x.shape[-2] = {x.shape[-2]}) must be a multiple of 2 * world = "
                         f"{2 * world}")
    parts = x.chunk(2 * world, dim=-2)  # 2N chunks along the sequence
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)  # (B, H, T/N, D)


def zigzag_unshard(parts: list) -> torch.Tensor:
    halves = [p.chunk(2, dim=-2) for p in parts]  # rank r: (chunk r, chunk 2N-1-r)
    first = [h[0] for h in halves]  # chunks 0 .. N-1: rank order
    second = [h[1] for h in reversed(halves)]  # chunks N .. 2N-1: reverse rank order
    return torch.cat(first + second, dim=-2)  # (B, H, T, D)


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    T = world * q.shape[-2]
    pos = torch.arange(T, device=q.device).view(T, 1)  # (T, 1): each token's global position
    q_pos = rank * q.shape[-2] + torch.arange(q.shape[-2], device=q.device)  # (T/N,): my queries
    k_pos = torch.cat([zigzag_shard(pos, r, world) for r in range(world)]).view(-1)  # (T,): the gathered keys
    s = q @ torch.cat(ks, dim=-2).transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T/N, T): my queries only
    s = s.masked_fill(k_pos.view(1, -1) > q_pos.view(-1, 1), float("-inf"))  # a key after its query is masked
    return torch.softmax(s, dim=-1) @ torch.cat(vs, dim=-2)  # (B, H, T/N, D)

# %% 12.1 | attention: gathers Q too, computes all T rows and keeps its own (right numbers, N times the work) | expect: N times the work
def zigzag_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    if x.shape[-2] % (2 * world):  # torch.chunk would hand out unequal chunks (or fewer than 2N)
        raise ValueError(f"the sequence length (x.shape[-2] = {x.shape[-2]}) must be a multiple of 2 * world = "
                         f"{2 * world}")
    parts = x.chunk(2 * world, dim=-2)  # 2N chunks along the sequence
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)  # (B, H, T/N, D)


def zigzag_unshard(parts: list) -> torch.Tensor:
    halves = [p.chunk(2, dim=-2) for p in parts]  # rank r: (chunk r, chunk 2N-1-r)
    first = [h[0] for h in halves]  # chunks 0 .. N-1: rank order
    second = [h[1] for h in reversed(halves)]  # chunks N .. 2N-1: reverse rank order
    return torch.cat(first + second, dim=-2)  # (B, H, T, D)


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    T = world * q.shape[-2]
    pos = torch.arange(T, device=q.device).view(T, 1)  # (T, 1): each token's global position
    k_pos = torch.cat([zigzag_shard(pos, r, world) for r in range(world)]).view(-1)  # (T,): the gathered keys
    qs = [torch.empty_like(q) for _ in range(world)]
    dist.all_gather(qs, q.contiguous())
    s = torch.cat(qs, dim=-2) @ torch.cat(ks, dim=-2).transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T, T)
    s = s.masked_fill(k_pos.view(1, -1) > k_pos.view(-1, 1), float("-inf"))
    out = torch.softmax(s, dim=-1) @ torch.cat(vs, dim=-2)  # (B, H, T, D): every query
    return out.chunk(world, dim=-2)[rank]  # my rows: rank r gathered its queries r-th

# %% 12.1 | attention for the lesson's 4 ranks (right on 4, wrong on any other number) | expect: 3 ranks
def zigzag_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    if x.shape[-2] % (2 * world):  # torch.chunk would hand out unequal chunks (or fewer than 2N)
        raise ValueError(f"the sequence length (x.shape[-2] = {x.shape[-2]}) must be a multiple of 2 * world = "
                         f"{2 * world}")
    parts = x.chunk(2 * world, dim=-2)  # 2N chunks along the sequence
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)  # (B, H, T/N, D)


def zigzag_unshard(parts: list) -> torch.Tensor:
    halves = [p.chunk(2, dim=-2) for p in parts]  # rank r: (chunk r, chunk 2N-1-r)
    first = [h[0] for h in halves]  # chunks 0 .. N-1: rank order
    second = [h[1] for h in reversed(halves)]  # chunks N .. 2N-1: reverse rank order
    return torch.cat(first + second, dim=-2)  # (B, H, T, D)


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), 4  # the lesson's 4 ranks
    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    T = world * q.shape[-2]
    pos = torch.arange(T, device=q.device).view(T, 1)  # (T, 1): each token's global position
    q_pos = zigzag_shard(pos, rank, world).view(-1)  # (T/N,): where my queries sit
    k_pos = torch.cat([zigzag_shard(pos, r, world) for r in range(world)]).view(-1)  # (T,): the gathered keys
    s = q @ torch.cat(ks, dim=-2).transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T/N, T): my queries only
    s = s.masked_fill(k_pos.view(1, -1) > q_pos.view(-1, 1), float("-inf"))  # a key after its query is masked
    return torch.softmax(s, dim=-1) @ torch.cat(vs, dim=-2)  # (B, H, T/N, D)

# %% 12.1 | no check of the length: torch.chunk hands out unequal chunks | expect: raise ValueError
def zigzag_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    parts = x.chunk(2 * world, dim=-2)  # 2N chunks along the sequence
    return torch.cat([parts[rank], parts[2 * world - 1 - rank]], dim=-2)  # (B, H, T/N, D)


def zigzag_unshard(parts: list) -> torch.Tensor:
    halves = [p.chunk(2, dim=-2) for p in parts]  # rank r: (chunk r, chunk 2N-1-r)
    first = [h[0] for h in halves]  # chunks 0 .. N-1: rank order
    second = [h[1] for h in reversed(halves)]  # chunks N .. 2N-1: reverse rank order
    return torch.cat(first + second, dim=-2)  # (B, H, T, D)


def zigzag_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    T = world * q.shape[-2]
    pos = torch.arange(T, device=q.device).view(T, 1)  # (T, 1): each token's global position
    q_pos = zigzag_shard(pos, rank, world).view(-1)  # (T/N,): where my queries sit
    k_pos = torch.cat([zigzag_shard(pos, r, world) for r in range(world)]).view(-1)  # (T,): the gathered keys
    s = q @ torch.cat(ks, dim=-2).transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T/N, T): my queries only
    s = s.masked_fill(k_pos.view(1, -1) > q_pos.view(-1, 1), float("-inf"))  # a key after its query is masked
    return torch.softmax(s, dim=-1) @ torch.cat(vs, dim=-2)  # (B, H, T/N, D)

# %% 12.2 | g's backward keeps the local chunk of the gradient, without summing over ranks | expect: reduce-scatter
class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = dist.get_world_size()
        flat = x.transpose(0, 1).contiguous()
        out = flat.new_empty((t * flat.shape[0], *flat.shape[1:]))
        backend_all_gather(out, flat)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].clone()


class ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = dist.get_world_size()
        flat = x.transpose(0, 1).contiguous()
        out = flat.new_empty((flat.shape[0] // t, *flat.shape[1:]))
        backend_reduce_scatter(out, flat)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size()
        flat = grad.transpose(0, 1).contiguous()
        out = flat.new_empty((t * flat.shape[0], *flat.shape[1:]))
        backend_all_gather(out, flat)
        return out.transpose(0, 1)

# %% 12.2 | ḡ as an all-reduce then a slice (right numbers, twice the bytes) | expect: twice the bytes
class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = dist.get_world_size()
        flat = x.transpose(0, 1).contiguous()
        out = flat.new_empty((t * flat.shape[0], *flat.shape[1:]))
        backend_all_gather(out, flat)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total)
        return total.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()


class ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        total = x.clone()
        dist.all_reduce(total)
        return total.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size()
        flat = grad.transpose(0, 1).contiguous()
        out = flat.new_empty((t * flat.shape[0], *flat.shape[1:]))
        backend_all_gather(out, flat)
        return out.transpose(0, 1)

# %% 12.2 | gathers along the batch (dim 0), not the sequence | expect: along the sequence
class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((dist.get_world_size() * x.shape[0], *x.shape[1:]))
        backend_all_gather(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(), *grad.shape[1:]))
        backend_reduce_scatter(out, grad.contiguous())
        return out


class ScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        backend_reduce_scatter(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((dist.get_world_size() * grad.shape[0], *grad.shape[1:]))
        backend_all_gather(out, grad.contiguous())
        return out

# %% 12.3 | a step that waits for its message before computing on the block it holds (forward) | expect: in flight while it computes in forward
def _tile(q, k, a, b, scale):
    """Scores of query chunk a against key chunk b (B, H, c, c); None when every key is in the future."""
    if b > a:  # chunk b comes after chunk a: causal attention skips the whole tile
        return None
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c)
    if a == b:  # the diagonal tile: query i sees keys 0..i of the chunk, never j > i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zigzag part (B, H, T/N, D), K/V passed around the ring, and its backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        qs = q.chunk(2, dim=-2)  # my chunks rank and 2N-1-rank, (B, H, c, D) each
        state = [(x.new_full((*x.shape[:-1], 1), float("-inf")), x.new_zeros((*x.shape[:-1], 1)), torch.zeros_like(x))
                 for x in qs]  # running (max, sum, unnormalised output) of each query chunk
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
        for step in range(n):
            src = (rank - step) % n  # whose K/V block this rank holds now
            if step < n - 1:  # post the next hop first: it travels while this block is computed
                nxt = torch.empty_like(kv)
                reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
                for req in reqs:  # wait for the next block first
                    req.wait()
                reqs = []
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is not None:
                        state[i] = online_softmax_update(*state[i], s, vs[j])
            if step < n - 1:
                for req in reqs:
                    req.wait()
                kv = nxt
        out = torch.cat([o / l for _, l, o in state], dim=-2)  # (B, H, T/N, D)
        lse = torch.cat([m + l.log() for m, l, _ in state], dim=-2)  # (B, H, T/N, 1): log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=-2) for t in (q, do.contiguous(), lse, delta))
        dq = [torch.zeros_like(x) for x in qs]
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
        travelling = None  # the gradient of the block held now, as the ranks before me summed it
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:  # K/V travel as in forward, posted before computing
                nxt = torch.empty_like(kv)
                kv_reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            dk, dv = [torch.zeros_like(x) for x in ks], [torch.zeros_like(x) for x in vs]
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is None:
                        continue
                    p = torch.exp(s - lses[i])  # (B, H, c, c): the exact softmax tile, from the saved lse
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * scale
                    dq[i] += ds @ ks[j]
                    dk[j] += ds.transpose(-2, -1) @ qs[i]
                    dv[j] += p.transpose(-2, -1) @ dos[i]
            dkv = torch.cat([torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)], dim=-1)  # my part of block src's grad
            if travelling is not None:  # what the ranks before me added, sent during the last step
                buf, reqs = travelling
                for req in reqs:
                    req.wait()
                dkv += buf
            buf = torch.empty_like(dkv)  # pass it on to the right, where its block goes too
            travelling = buf, [dist.isend(dkv, right, tag=1), dist.irecv(buf, left, tag=1)]
            if step < n - 1:
                for req in kv_reqs:
                    req.wait()
                kv = nxt
        buf, reqs = travelling  # after N hops: my own block's gradient, with every rank's part
        for req in reqs:
            req.wait()
        return torch.cat(dq, dim=-2), buf[..., :D].contiguous(), buf[..., D:].contiguous()

# %% 12.3 | backward: each step waits for the next K/V block before computing | expect: in flight while it computes in backward
def _tile(q, k, a, b, scale):
    """Scores of query chunk a against key chunk b (B, H, c, c); None when every key is in the future."""
    if b > a:  # chunk b comes after chunk a: causal attention skips the whole tile
        return None
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c)
    if a == b:  # the diagonal tile: query i sees keys 0..i of the chunk, never j > i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zigzag part (B, H, T/N, D), K/V passed around the ring, and its backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        qs = q.chunk(2, dim=-2)  # my chunks rank and 2N-1-rank, (B, H, c, D) each
        state = [(x.new_full((*x.shape[:-1], 1), float("-inf")), x.new_zeros((*x.shape[:-1], 1)), torch.zeros_like(x))
                 for x in qs]  # running (max, sum, unnormalised output) of each query chunk
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
        for step in range(n):
            src = (rank - step) % n  # whose K/V block this rank holds now
            if step < n - 1:  # post the next hop first: it travels while this block is computed
                nxt = torch.empty_like(kv)
                reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is not None:
                        state[i] = online_softmax_update(*state[i], s, vs[j])
            if step < n - 1:
                for req in reqs:
                    req.wait()
                kv = nxt
        out = torch.cat([o / l for _, l, o in state], dim=-2)  # (B, H, T/N, D)
        lse = torch.cat([m + l.log() for m, l, _ in state], dim=-2)  # (B, H, T/N, 1): log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=-2) for t in (q, do.contiguous(), lse, delta))
        dq = [torch.zeros_like(x) for x in qs]
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
        travelling = None  # the gradient of the block held now, as the ranks before me summed it
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:  # K/V travel as in forward, posted before computing
                nxt = torch.empty_like(kv)
                kv_reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
                for req in kv_reqs:  # wait for the next block first
                    req.wait()
                kv_reqs = []
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            dk, dv = [torch.zeros_like(x) for x in ks], [torch.zeros_like(x) for x in vs]
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is None:
                        continue
                    p = torch.exp(s - lses[i])  # (B, H, c, c): the exact softmax tile, from the saved lse
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * scale
                    dq[i] += ds @ ks[j]
                    dk[j] += ds.transpose(-2, -1) @ qs[i]
                    dv[j] += p.transpose(-2, -1) @ dos[i]
            dkv = torch.cat([torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)], dim=-1)  # my part of block src's grad
            if travelling is not None:  # what the ranks before me added, sent during the last step
                buf, reqs = travelling
                for req in reqs:
                    req.wait()
                dkv += buf
            buf = torch.empty_like(dkv)  # pass it on to the right, where its block goes too
            travelling = buf, [dist.isend(dkv, right, tag=1), dist.irecv(buf, left, tag=1)]
            if step < n - 1:
                for req in kv_reqs:
                    req.wait()
                kv = nxt
        buf, reqs = travelling  # after N hops: my own block's gradient, with every rank's part
        for req in reqs:
            req.wait()
        return torch.cat(dq, dim=-2), buf[..., :D].contiguous(), buf[..., D:].contiguous()

# %% 12.3 | masks as if rank r held one contiguous chunk r (not the zigzag): the last rank does N times the first's work | expect: equal causal work
def _tile(q, k, a, b, scale):
    """Scores of query chunk a against key chunk b (B, H, c, c); None when every key is in the future."""
    if b > a:  # chunk b comes after chunk a: causal attention skips the whole tile
        return None
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c)
    if a == b:  # the diagonal tile: query i sees keys 0..i of the chunk, never j > i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zigzag part (B, H, T/N, D), K/V passed around the ring, and its backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        qs = q.chunk(2, dim=-2)  # my chunks rank and 2N-1-rank, (B, H, c, D) each
        state = [(x.new_full((*x.shape[:-1], 1), float("-inf")), x.new_zeros((*x.shape[:-1], 1)), torch.zeros_like(x))
                 for x in qs]  # running (max, sum, unnormalised output) of each query chunk
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
        for step in range(n):
            src = (rank - step) % n  # whose K/V block this rank holds now
            if step < n - 1:  # post the next hop first: it travels while this block is computed
                nxt = torch.empty_like(kv)
                reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            for i, a in enumerate((2 * rank, 2 * rank + 1)):
                for j, b in enumerate((2 * src, 2 * src + 1)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is not None:
                        state[i] = online_softmax_update(*state[i], s, vs[j])
            if step < n - 1:
                for req in reqs:
                    req.wait()
                kv = nxt
        out = torch.cat([o / l for _, l, o in state], dim=-2)  # (B, H, T/N, D)
        lse = torch.cat([m + l.log() for m, l, _ in state], dim=-2)  # (B, H, T/N, 1): log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=-2) for t in (q, do.contiguous(), lse, delta))
        dq = [torch.zeros_like(x) for x in qs]
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
        travelling = None  # the gradient of the block held now, as the ranks before me summed it
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:  # K/V travel as in forward, posted before computing
                nxt = torch.empty_like(kv)
                kv_reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            dk, dv = [torch.zeros_like(x) for x in ks], [torch.zeros_like(x) for x in vs]
            for i, a in enumerate((2 * rank, 2 * rank + 1)):
                for j, b in enumerate((2 * src, 2 * src + 1)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is None:
                        continue
                    p = torch.exp(s - lses[i])  # (B, H, c, c): the exact softmax tile, from the saved lse
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * scale
                    dq[i] += ds @ ks[j]
                    dk[j] += ds.transpose(-2, -1) @ qs[i]
                    dv[j] += p.transpose(-2, -1) @ dos[i]
            dkv = torch.cat([torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)], dim=-1)  # my part of block src's grad
            if travelling is not None:  # what the ranks before me added, sent during the last step
                buf, reqs = travelling
                for req in reqs:
                    req.wait()
                dkv += buf
            buf = torch.empty_like(dkv)  # pass it on to the right, where its block goes too
            travelling = buf, [dist.isend(dkv, right, tag=1), dist.irecv(buf, left, tag=1)]
            if step < n - 1:
                for req in kv_reqs:
                    req.wait()
                kv = nxt
        buf, reqs = travelling  # after N hops: my own block's gradient, with every rank's part
        for req in reqs:
            req.wait()
        return torch.cat(dq, dim=-2), buf[..., :D].contiguous(), buf[..., D:].contiguous()

# %% 12.3 | the diagonal tiles mask the diagonal itself (triu(0)): a query does not see its own key | expect: diagonal
def _tile(q, k, a, b, scale):
    """Scores of query chunk a against key chunk b (B, H, c, c); None when every key is in the future."""
    if b > a:  # chunk b comes after chunk a: causal attention skips the whole tile
        return None
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c)
    if a == b:  # the diagonal tile: query i sees keys 0..i of the chunk, never j > i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(0), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zigzag part (B, H, T/N, D), K/V passed around the ring, and its backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        qs = q.chunk(2, dim=-2)  # my chunks rank and 2N-1-rank, (B, H, c, D) each
        state = [(x.new_full((*x.shape[:-1], 1), float("-inf")), x.new_zeros((*x.shape[:-1], 1)), torch.zeros_like(x))
                 for x in qs]  # running (max, sum, unnormalised output) of each query chunk
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
        for step in range(n):
            src = (rank - step) % n  # whose K/V block this rank holds now
            if step < n - 1:  # post the next hop first: it travels while this block is computed
                nxt = torch.empty_like(kv)
                reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is not None:
                        state[i] = online_softmax_update(*state[i], s, vs[j])
            if step < n - 1:
                for req in reqs:
                    req.wait()
                kv = nxt
        out = torch.cat([o / l for _, l, o in state], dim=-2)  # (B, H, T/N, D)
        lse = torch.cat([m + l.log() for m, l, _ in state], dim=-2)  # (B, H, T/N, 1): log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=-2) for t in (q, do.contiguous(), lse, delta))
        dq = [torch.zeros_like(x) for x in qs]
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
        travelling = None  # the gradient of the block held now, as the ranks before me summed it
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:  # K/V travel as in forward, posted before computing
                nxt = torch.empty_like(kv)
                kv_reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            dk, dv = [torch.zeros_like(x) for x in ks], [torch.zeros_like(x) for x in vs]
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is None:
                        continue
                    p = torch.exp(s - lses[i])  # (B, H, c, c): the exact softmax tile, from the saved lse
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * scale
                    dq[i] += ds @ ks[j]
                    dk[j] += ds.transpose(-2, -1) @ qs[i]
                    dv[j] += p.transpose(-2, -1) @ dos[i]
            dkv = torch.cat([torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)], dim=-1)  # my part of block src's grad
            if travelling is not None:  # what the ranks before me added, sent during the last step
                buf, reqs = travelling
                for req in reqs:
                    req.wait()
                dkv += buf
            buf = torch.empty_like(dkv)  # pass it on to the right, where its block goes too
            travelling = buf, [dist.isend(dkv, right, tag=1), dist.irecv(buf, left, tag=1)]
            if step < n - 1:
                for req in kv_reqs:
                    req.wait()
                kv = nxt
        buf, reqs = travelling  # after N hops: my own block's gradient, with every rank's part
        for req in reqs:
            req.wait()
        return torch.cat(dq, dim=-2), buf[..., :D].contiguous(), buf[..., D:].contiguous()

# %% 12.3 | future tiles computed and masked instead of skipped: twice the work | expect: past tiles only
def _tile(q, k, a, b, scale):
    """Scores of query chunk a against key chunk b (B, H, c, c); None when every key is in the future."""
    if b > a:  # a future tile: masked out entirely
        return ((q @ k.transpose(-2, -1)) * scale).masked_fill(torch.ones(1, dtype=torch.bool), float("-inf"))
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c)
    if a == b:  # the diagonal tile: query i sees keys 0..i of the chunk, never j > i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zigzag part (B, H, T/N, D), K/V passed around the ring, and its backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        qs = q.chunk(2, dim=-2)  # my chunks rank and 2N-1-rank, (B, H, c, D) each
        state = [(x.new_full((*x.shape[:-1], 1), float("-inf")), x.new_zeros((*x.shape[:-1], 1)), torch.zeros_like(x))
                 for x in qs]  # running (max, sum, unnormalised output) of each query chunk
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
        for step in range(n):
            src = (rank - step) % n  # whose K/V block this rank holds now
            if step < n - 1:  # post the next hop first: it travels while this block is computed
                nxt = torch.empty_like(kv)
                reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is not None:
                        state[i] = online_softmax_update(*state[i], s, vs[j])
            if step < n - 1:
                for req in reqs:
                    req.wait()
                kv = nxt
        out = torch.cat([o / l for _, l, o in state], dim=-2)  # (B, H, T/N, D)
        lse = torch.cat([m + l.log() for m, l, _ in state], dim=-2)  # (B, H, T/N, 1): log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=-2) for t in (q, do.contiguous(), lse, delta))
        dq = [torch.zeros_like(x) for x in qs]
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
        travelling = None  # the gradient of the block held now, as the ranks before me summed it
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:  # K/V travel as in forward, posted before computing
                nxt = torch.empty_like(kv)
                kv_reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            dk, dv = [torch.zeros_like(x) for x in ks], [torch.zeros_like(x) for x in vs]
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is None:
                        continue
                    p = torch.exp(s - lses[i])  # (B, H, c, c): the exact softmax tile, from the saved lse
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * scale
                    dq[i] += ds @ ks[j]
                    dk[j] += ds.transpose(-2, -1) @ qs[i]
                    dv[j] += p.transpose(-2, -1) @ dos[i]
            dkv = torch.cat([torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)], dim=-1)  # my part of block src's grad
            if travelling is not None:  # what the ranks before me added, sent during the last step
                buf, reqs = travelling
                for req in reqs:
                    req.wait()
                dkv += buf
            buf = torch.empty_like(dkv)  # pass it on to the right, where its block goes too
            travelling = buf, [dist.isend(dkv, right, tag=1), dist.irecv(buf, left, tag=1)]
            if step < n - 1:
                for req in kv_reqs:
                    req.wait()
                kv = nxt
        buf, reqs = travelling  # after N hops: my own block's gradient, with every rank's part
        for req in reqs:
            req.wait()
        return torch.cat(dq, dim=-2), buf[..., :D].contiguous(), buf[..., D:].contiguous()

# %% 12.3 | backward: each rank keeps the dK, dV its own queries give its own block, never collecting the others' parts | expect: every rank's
def _tile(q, k, a, b, scale):
    """Scores of query chunk a against key chunk b (B, H, c, c); None when every key is in the future."""
    if b > a:  # chunk b comes after chunk a: causal attention skips the whole tile
        return None
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c)
    if a == b:  # the diagonal tile: query i sees keys 0..i of the chunk, never j > i
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's zigzag part (B, H, T/N, D), K/V passed around the ring, and its backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        qs = q.chunk(2, dim=-2)  # my chunks rank and 2N-1-rank, (B, H, c, D) each
        state = [(x.new_full((*x.shape[:-1], 1), float("-inf")), x.new_zeros((*x.shape[:-1], 1)), torch.zeros_like(x))
                 for x in qs]  # running (max, sum, unnormalised output) of each query chunk
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
        for step in range(n):
            src = (rank - step) % n  # whose K/V block this rank holds now
            if step < n - 1:  # post the next hop first: it travels while this block is computed
                nxt = torch.empty_like(kv)
                reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is not None:
                        state[i] = online_softmax_update(*state[i], s, vs[j])
            if step < n - 1:
                for req in reqs:
                    req.wait()
                kv = nxt
        out = torch.cat([o / l for _, l, o in state], dim=-2)  # (B, H, T/N, D)
        lse = torch.cat([m + l.log() for m, l, _ in state], dim=-2)  # (B, H, T/N, 1): log-sum-exp of each row
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        D, scale = q.shape[-1], q.shape[-1] ** -0.5
        delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
        qs, dos, lses, deltas = (t.chunk(2, dim=-2) for t in (q, do.contiguous(), lse, delta))
        dq = [torch.zeros_like(x) for x in qs]
        kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
        travelling = None  # the gradient of the block held now, as the ranks before me summed it
        for step in range(n):
            src = (rank - step) % n
            if step < n - 1:  # K/V travel as in forward, posted before computing
                nxt = torch.empty_like(kv)
                kv_reqs = [dist.isend(kv, right, tag=0), dist.irecv(nxt, left, tag=0)]
            ks, vs = kv[..., :D].chunk(2, dim=-2), kv[..., D:].chunk(2, dim=-2)
            dk, dv = [torch.zeros_like(x) for x in ks], [torch.zeros_like(x) for x in vs]
            for i, a in enumerate((rank, 2 * n - 1 - rank)):
                for j, b in enumerate((src, 2 * n - 1 - src)):
                    s = _tile(qs[i], ks[j], a, b, scale)
                    if s is None:
                        continue
                    p = torch.exp(s - lses[i])  # (B, H, c, c): the exact softmax tile, from the saved lse
                    ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i]) * scale
                    dq[i] += ds @ ks[j]
                    dk[j] += ds.transpose(-2, -1) @ qs[i]
                    dv[j] += p.transpose(-2, -1) @ dos[i]
            dkv = torch.cat([torch.cat(dk, dim=-2), torch.cat(dv, dim=-2)], dim=-1)  # my part of block src's grad
            if False:  # what the ranks before me added, sent during the last step
                buf, reqs = travelling
                for req in reqs:
                    req.wait()
                pass
            if step == 0:  # my own block's gradient, from my own queries only
                travelling = dkv, []
            if step < n - 1:
                for req in kv_reqs:
                    req.wait()
                kv = nxt
        buf, reqs = travelling  # after N hops: my own block's gradient, with every rank's part
        for req in reqs:
            req.wait()
        return torch.cat(dq, dim=-2), buf[..., :D].contiguous(), buf[..., D:].contiguous()

# %% 12.4 | an all-to-all whose output carries no gradient (the exchange called outside autograd) | expect: through the all-to-all
class AllToAll(torch.autograd.Function):
    """Rows send[j] of x go to rank j; returns the rows received, recv[j] from rank j. Backward: the reverse."""

    @staticmethod
    def forward(ctx, x, send, recv):
        out = x.new_empty((sum(recv), *x.shape[1:]))  # (Σ recv, h)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        out = grad.new_empty((sum(send), *grad.shape[1:]))  # each row's gradient goes back where the row came from
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=send, input_split_sizes=recv)
        return out, None, None


def moe_layer(x: torch.Tensor, router: torch.nn.Linear, local_experts, capacity_factor: float) -> torch.Tensor:
    n, per = dist.get_world_size(), len(local_experts)
    E, T = n * per, x.shape[0]
    gate, expert = router(x).softmax(dim=-1).max(dim=-1)  # (T,), (T,): top-1 (Switch)
    cap = math.ceil(capacity_factor * T / E)  # this rank's tokens are one capacity group, over all E experts
    onehot = F.one_hot(expert, E)  # (T, E)
    keep = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) <= cap  # (T,): earlier tokens first in each queue
    tok = torch.nonzero(keep).squeeze(1)
    tok = tok[torch.argsort(expert[tok], stable=True)]  # kept tokens, by expert = by destination rank
    counts = torch.bincount(expert[tok], minlength=E)  # (E,) kept tokens for each expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # from each rank: how many tokens for each of my experts
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = AllToAll.forward(None, x[tok], send, recv)  # (Σ recv, h): by source rank, then expert
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)  # local expert of each row
    out = arrived * 0  # in the graph even when no token arrived: every rank must run the backward exchange
    for i, fn in enumerate(local_experts):
        rows = torch.nonzero(which == i).squeeze(1)
        if len(rows):
            out = out.index_copy(0, rows, fn(arrived[rows]))
    back = AllToAll.forward(None, out, recv, send)  # (kept, h): the outputs, in the order the tokens were sent
    return x.index_add(0, tok, gate[tok, None] * back)  # (T, h); a dropped token is x alone: the residual

# %% 12.4 | dropped tokens get 0, not the residual | expect: residual
class AllToAll(torch.autograd.Function):
    """Rows send[j] of x go to rank j; returns the rows received, recv[j] from rank j. Backward: the reverse."""

    @staticmethod
    def forward(ctx, x, send, recv):
        ctx.splits = send, recv
        out = x.new_empty((sum(recv), *x.shape[1:]))  # (Σ recv, h)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        out = grad.new_empty((sum(send), *grad.shape[1:]))  # each row's gradient goes back where the row came from
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=send, input_split_sizes=recv)
        return out, None, None


def moe_layer(x: torch.Tensor, router: torch.nn.Linear, local_experts, capacity_factor: float) -> torch.Tensor:
    n, per = dist.get_world_size(), len(local_experts)
    E, T = n * per, x.shape[0]
    gate, expert = router(x).softmax(dim=-1).max(dim=-1)  # (T,), (T,): top-1 (Switch)
    cap = math.ceil(capacity_factor * T / E)  # this rank's tokens are one capacity group, over all E experts
    onehot = F.one_hot(expert, E)  # (T, E)
    keep = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) <= cap  # (T,): earlier tokens first in each queue
    tok = torch.nonzero(keep).squeeze(1)
    tok = tok[torch.argsort(expert[tok], stable=True)]  # kept tokens, by expert = by destination rank
    counts = torch.bincount(expert[tok], minlength=E)  # (E,) kept tokens for each expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # from each rank: how many tokens for each of my experts
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = AllToAll.apply(x[tok], send, recv)  # (Σ recv, h): by source rank, then expert
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)  # local expert of each row
    out = arrived * 0  # in the graph even when no token arrived: every rank must run the backward exchange
    for i, fn in enumerate(local_experts):
        rows = torch.nonzero(which == i).squeeze(1)
        if len(rows):
            out = out.index_copy(0, rows, fn(arrived[rows]))
    back = AllToAll.apply(out, recv, send)  # (kept, h): the outputs, in the order the tokens were sent
    return torch.zeros_like(x).index_add(0, tok, x[tok] + gate[tok, None] * back)  # (T, h); a dropped token is x alone: the residual

# %% 12.4 | capacity counted over every rank's tokens (N·T), not this rank's | expect: capacity
class AllToAll(torch.autograd.Function):
    """Rows send[j] of x go to rank j; returns the rows received, recv[j] from rank j. Backward: the reverse."""

    @staticmethod
    def forward(ctx, x, send, recv):
        ctx.splits = send, recv
        out = x.new_empty((sum(recv), *x.shape[1:]))  # (Σ recv, h)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        out = grad.new_empty((sum(send), *grad.shape[1:]))  # each row's gradient goes back where the row came from
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=send, input_split_sizes=recv)
        return out, None, None


def moe_layer(x: torch.Tensor, router: torch.nn.Linear, local_experts, capacity_factor: float) -> torch.Tensor:
    n, per = dist.get_world_size(), len(local_experts)
    E, T = n * per, x.shape[0]
    gate, expert = router(x).softmax(dim=-1).max(dim=-1)  # (T,), (T,): top-1 (Switch)
    cap = math.ceil(capacity_factor * n * T / E)  # this rank's tokens are one capacity group, over all E experts
    onehot = F.one_hot(expert, E)  # (T, E)
    keep = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) <= cap  # (T,): earlier tokens first in each queue
    tok = torch.nonzero(keep).squeeze(1)
    tok = tok[torch.argsort(expert[tok], stable=True)]  # kept tokens, by expert = by destination rank
    counts = torch.bincount(expert[tok], minlength=E)  # (E,) kept tokens for each expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # from each rank: how many tokens for each of my experts
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = AllToAll.apply(x[tok], send, recv)  # (Σ recv, h): by source rank, then expert
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)  # local expert of each row
    out = arrived * 0  # in the graph even when no token arrived: every rank must run the backward exchange
    for i, fn in enumerate(local_experts):
        rows = torch.nonzero(which == i).squeeze(1)
        if len(rows):
            out = out.index_copy(0, rows, fn(arrived[rows]))
    back = AllToAll.apply(out, recv, send)  # (kept, h): the outputs, in the order the tokens were sent
    return x.index_add(0, tok, gate[tok, None] * back)  # (T, h); a dropped token is x alone: the residual

# %% 12.4 | the gate detached: the router gets no gradient | expect: router
class AllToAll(torch.autograd.Function):
    """Rows send[j] of x go to rank j; returns the rows received, recv[j] from rank j. Backward: the reverse."""

    @staticmethod
    def forward(ctx, x, send, recv):
        ctx.splits = send, recv
        out = x.new_empty((sum(recv), *x.shape[1:]))  # (Σ recv, h)
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        out = grad.new_empty((sum(send), *grad.shape[1:]))  # each row's gradient goes back where the row came from
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=send, input_split_sizes=recv)
        return out, None, None


def moe_layer(x: torch.Tensor, router: torch.nn.Linear, local_experts, capacity_factor: float) -> torch.Tensor:
    n, per = dist.get_world_size(), len(local_experts)
    E, T = n * per, x.shape[0]
    gate, expert = router(x).softmax(dim=-1).detach().max(dim=-1)  # (T,), (T,): top-1 (Switch)
    cap = math.ceil(capacity_factor * T / E)  # this rank's tokens are one capacity group, over all E experts
    onehot = F.one_hot(expert, E)  # (T, E)
    keep = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) <= cap  # (T,): earlier tokens first in each queue
    tok = torch.nonzero(keep).squeeze(1)
    tok = tok[torch.argsort(expert[tok], stable=True)]  # kept tokens, by expert = by destination rank
    counts = torch.bincount(expert[tok], minlength=E)  # (E,) kept tokens for each expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # from each rank: how many tokens for each of my experts
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = AllToAll.apply(x[tok], send, recv)  # (Σ recv, h): by source rank, then expert
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)  # local expert of each row
    out = arrived * 0  # in the graph even when no token arrived: every rank must run the backward exchange
    for i, fn in enumerate(local_experts):
        rows = torch.nonzero(which == i).squeeze(1)
        if len(rows):
            out = out.index_copy(0, rows, fn(arrived[rows]))
    back = AllToAll.apply(out, recv, send)  # (kept, h): the outputs, in the order the tokens were sent
    return x.index_add(0, tok, gate[tok, None] * back)  # (T, h); a dropped token is x alone: the residual

# %% 12.5 | shard groups across nodes (strided), replicas inside a node | expect: consecutive
def hsdp_groups(replicate: int, shard: int):
    """This rank's (shard group, replicate group) on a (replicate, shard) mesh of replicate·shard ranks."""
    rank = dist.get_rank()
    # every rank creates every group, in the same order (new_group is collective over the whole world)
    shards = [dist.new_group(list(range(i * shard, (i + 1) * shard))) for i in range(replicate)]  # one node each
    replicas = [dist.new_group(list(range(j, replicate * shard, shard))) for j in range(shard)]  # across nodes
    return replicas[rank % shard], shards[rank // shard]


def hsdp_gather(part: torch.Tensor, shard_group) -> torch.Tensor:
    """This rank's parameter shard (P/g,) -> the whole flat parameters (P,), before forward (and backward)."""
    g = dist.get_world_size(shard_group)
    out = part.new_empty(g * part.numel())  # (P,)
    backend_all_gather(out, part, group=shard_group)  # inside the node only
    return out


def hsdp_reduce(grad: torch.Tensor, shard_group, replicate_group) -> torch.Tensor:
    """This rank's whole local gradient (P,) -> its shard (P/g,) of the gradient averaged over every rank."""
    g = dist.get_world_size(shard_group)
    part = grad.new_empty(grad.numel() // g)  # (P/g,)
    backend_reduce_scatter(part, grad.contiguous(), group=shard_group)  # sum over the node, keep my shard
    dist.all_reduce(part, group=replicate_group)  # only the shard crosses the slow links
    return part / dist.get_world_size()

# %% 12.5 | all-reduces the whole gradient across replicas, then reduce-scatters: right numbers, g times the bytes across nodes | expect: only the gradient SHARD
def hsdp_groups(replicate: int, shard: int):
    """This rank's (shard group, replicate group) on a (replicate, shard) mesh of replicate·shard ranks."""
    rank = dist.get_rank()
    # every rank creates every group, in the same order (new_group is collective over the whole world)
    shards = [dist.new_group(list(range(i * shard, (i + 1) * shard))) for i in range(replicate)]  # one node each
    replicas = [dist.new_group(list(range(j, replicate * shard, shard))) for j in range(shard)]  # across nodes
    return shards[rank // shard], replicas[rank % shard]


def hsdp_gather(part: torch.Tensor, shard_group) -> torch.Tensor:
    """This rank's parameter shard (P/g,) -> the whole flat parameters (P,), before forward (and backward)."""
    g = dist.get_world_size(shard_group)
    out = part.new_empty(g * part.numel())  # (P,)
    backend_all_gather(out, part, group=shard_group)  # inside the node only
    return out


def hsdp_reduce(grad: torch.Tensor, shard_group, replicate_group) -> torch.Tensor:
    """This rank's whole local gradient (P,) -> its shard (P/g,) of the gradient averaged over every rank."""
    g = dist.get_world_size(shard_group)
    part = grad.new_empty(grad.numel() // g)  # (P/g,)
    grad = grad.clone()
    dist.all_reduce(grad, group=replicate_group)  # the whole gradient across nodes
    backend_reduce_scatter(part, grad, group=shard_group)
    return part / dist.get_world_size()

# %% 12.5 | averages over the replicas only (divides by the replicate size) | expect: every rank's batch
def hsdp_groups(replicate: int, shard: int):
    """This rank's (shard group, replicate group) on a (replicate, shard) mesh of replicate·shard ranks."""
    rank = dist.get_rank()
    # every rank creates every group, in the same order (new_group is collective over the whole world)
    shards = [dist.new_group(list(range(i * shard, (i + 1) * shard))) for i in range(replicate)]  # one node each
    replicas = [dist.new_group(list(range(j, replicate * shard, shard))) for j in range(shard)]  # across nodes
    return shards[rank // shard], replicas[rank % shard]


def hsdp_gather(part: torch.Tensor, shard_group) -> torch.Tensor:
    """This rank's parameter shard (P/g,) -> the whole flat parameters (P,), before forward (and backward)."""
    g = dist.get_world_size(shard_group)
    out = part.new_empty(g * part.numel())  # (P,)
    backend_all_gather(out, part, group=shard_group)  # inside the node only
    return out


def hsdp_reduce(grad: torch.Tensor, shard_group, replicate_group) -> torch.Tensor:
    """This rank's whole local gradient (P,) -> its shard (P/g,) of the gradient averaged over every rank."""
    g = dist.get_world_size(shard_group)
    part = grad.new_empty(grad.numel() // g)  # (P/g,)
    backend_reduce_scatter(part, grad.contiguous(), group=shard_group)  # sum over the node, keep my shard
    dist.all_reduce(part, group=replicate_group)  # only the shard crosses the slow links
    return part / dist.get_world_size(replicate_group)
