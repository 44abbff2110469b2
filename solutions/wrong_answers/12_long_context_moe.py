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

# %% 12.3 | all-gathers K and V, then attends locally (no ring) | expect: no all_gather
def ring_attention_forward(q, k, v):
    n = dist.get_world_size()
    kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
    full = kv.new_empty((n * kv.shape[0], *kv.shape[1:]))
    backend_all_gather(full, kv)  # every rank's block, stacked along dim 0
    full = torch.cat(full.chunk(n, dim=0), dim=-2)  # (B, H, T, 2D)
    D = q.shape[-1]
    s = (q @ full[..., :D].transpose(-2, -1)) / math.sqrt(D)
    return s.softmax(-1) @ full[..., D:]

# %% 12.3 | blocking send, then receive, on every rank | expect: deadlock
def ring_attention_forward(q, k, v):
    rank, n = dist.get_rank(), dist.get_world_size()
    D, scale = q.shape[-1], 1.0 / math.sqrt(q.shape[-1])
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    l = q.new_zeros((*q.shape[:-1], 1))
    o = torch.zeros_like(q)
    kv = torch.cat([k, v], dim=-1).contiguous()
    for step in range(n):
        s = (q @ kv[..., :D].transpose(-2, -1)) * scale
        m, l, o = online_softmax_update(m, l, o, s, kv[..., D:])
        if step < n - 1:
            nxt = torch.empty_like(kv)
            dist.send(kv, (rank + 1) % n)
            dist.recv(nxt, (rank - 1) % n)
            kv = nxt
    return o / l

# %% 12.3 | averages each block's softmax output instead of merging with the running max | expect: online_softmax_update
def ring_attention_forward(q, k, v):
    rank, n = dist.get_rank(), dist.get_world_size()
    D = q.shape[-1]
    total = torch.zeros_like(q)
    kv = torch.cat([k, v], dim=-1).contiguous()
    for step in range(n):
        if step < n - 1:
            nxt = torch.empty_like(kv)
            reqs = [dist.isend(kv, (rank + 1) % n), dist.irecv(nxt, (rank - 1) % n)]
        s = (q @ kv[..., :D].transpose(-2, -1)) / math.sqrt(D)
        total += s.softmax(-1) @ kv[..., D:]
        if step < n - 1:
            for req in reqs:
                req.wait()
            kv = nxt
    return total / n

# %% 12.3 | sends its block to every rank directly (no ring) | expect: one neighbour
def ring_attention_forward(q, k, v):
    rank, n = dist.get_rank(), dist.get_world_size()
    D, scale = q.shape[-1], 1.0 / math.sqrt(q.shape[-1])
    kv = torch.cat([k, v], dim=-1).contiguous()
    blocks = {rank: kv}
    reqs = []
    for other in range(n):
        if other != rank:
            blocks[other] = torch.empty_like(kv)
            reqs += [dist.isend(kv, other), dist.irecv(blocks[other], other)]
    for req in reqs:
        req.wait()
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    l = q.new_zeros((*q.shape[:-1], 1))
    o = torch.zeros_like(q)
    for b in blocks.values():
        m, l, o = online_softmax_update(m, l, o, (q @ b[..., :D].transpose(-2, -1)) * scale, b[..., D:])
    return o / l

# %% 12.4 | every token gathered to every rank, experts applied there, results summed | expect: all_to_all_single
def moe_forward(x, expert, gate, local_experts):
    n, r, per = dist.get_world_size(), dist.get_rank(), len(local_experts)
    xs = x.new_empty((n * x.shape[0], x.shape[1]))
    backend_all_gather(xs, x.contiguous())
    es = expert.new_empty(n * expert.shape[0])
    backend_all_gather(es, expert.contiguous())
    ys = torch.zeros_like(xs)
    for i, fn in enumerate(local_experts):
        rows = es == r * per + i
        ys[rows] = fn(xs[rows])
    dist.all_reduce(ys)
    return ys.chunk(n)[r] * gate[:, None]

# %% 12.4 | forgets to weight the outputs by the gate | expect: gate
def moe_forward(x, expert, gate, local_experts):
    n, per = dist.get_world_size(), len(local_experts)
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=n * per)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(arrived, x[order].contiguous(), output_split_sizes=recv, input_split_sizes=send)
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)
    out = torch.empty_like(arrived)
    for i, fn in enumerate(local_experts):
        out[which == i] = fn(arrived[which == i])
    back = x.new_empty((len(order), x.shape[1]))
    dist.all_to_all_single(back, out, output_split_sizes=send, input_split_sizes=recv)
    y = torch.empty_like(x)
    y[order] = back
    return y

# %% 12.4 | sends to rank = expert id instead of the rank that owns the expert | expect: owns its expert
def moe_forward(x, expert, gate, local_experts):
    n = dist.get_world_size()
    order = torch.argsort(expert, stable=True)
    send_t = torch.bincount(expert, minlength=n)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t)
    send, recv = send_t.tolist(), recv_t.tolist()
    arrived = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(arrived, x[order].contiguous(), output_split_sizes=recv, input_split_sizes=send)
    out = local_experts[0](arrived)
    back = x.new_empty((len(order), x.shape[1]))
    dist.all_to_all_single(back, out, output_split_sizes=send, input_split_sizes=recv)
    y = torch.empty_like(x)
    y[order] = back
    return y * gate[:, None]

# %% 12.4 | leaves the combined outputs in sorted (by expert) order | expect: undo the sort
def moe_forward(x, expert, gate, local_experts):
    n, per = dist.get_world_size(), len(local_experts)
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=n * per)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = x.new_empty((sum(recv), x.shape[1]))
    dist.all_to_all_single(arrived, x[order].contiguous(), output_split_sizes=recv, input_split_sizes=send)
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)
    out = torch.empty_like(arrived)
    for i, fn in enumerate(local_experts):
        out[which == i] = fn(arrived[which == i])
    back = x.new_empty((len(order), x.shape[1]))
    dist.all_to_all_single(back, out, output_split_sizes=send, input_split_sizes=recv)
    return back * gate[:, None]

# %% 12.4 | receives the counts into torch.empty: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
def moe_forward(x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, local_experts) -> torch.Tensor:
    n, per = dist.get_world_size(), len(local_experts)
    order = torch.argsort(expert, stable=True)  # tokens grouped by expert = by the rank that owns it
    counts = torch.bincount(expert, minlength=n * per)  # (E,) tokens this rank sends to each expert
    recv_counts = torch.empty(n * per, dtype=torch.long)
    dist.all_to_all_single(recv_counts, counts)  # from each rank: how many tokens for each of my experts
    send, recv = counts.view(n, per).sum(1).tolist(), recv_counts.view(n, per).sum(1).tolist()
    arrived = x.new_empty((sum(recv), x.shape[1]))  # (rows received, h), by source rank then expert
    dist.all_to_all_single(arrived, x[order].contiguous(), output_split_sizes=recv, input_split_sizes=send)
    which = torch.arange(per, device=x.device).repeat(n).repeat_interleave(recv_counts)  # the local expert of each row
    out = torch.empty_like(arrived)
    for i, fn in enumerate(local_experts):
        out[which == i] = fn(arrived[which == i])
    back = x.new_empty((len(order), x.shape[1]))
    dist.all_to_all_single(back, out, output_split_sizes=send, input_split_sizes=recv)  # the reverse exchange
    y = torch.empty_like(x)
    y[order] = back  # undo the sort: each output at its token's place
    return y * gate[:, None]

# %% 12.3 | blocking send/recv ordered by rank parity, computes before exchanging (no overlap) | expect: before computing
def ring_attention_forward(q, k, v):
    rank, n = dist.get_rank(), dist.get_world_size()
    D, scale = q.shape[-1], 1.0 / math.sqrt(q.shape[-1])
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    l = q.new_zeros((*q.shape[:-1], 1))
    o = torch.zeros_like(q)
    kv = torch.cat([k, v], dim=-1).contiguous()
    for step in range(n):
        s = (q @ kv[..., :D].transpose(-2, -1)) * scale
        m, l, o = online_softmax_update(m, l, o, s, kv[..., D:])
        if step < n - 1:
            nxt = torch.empty_like(kv)
            if rank % 2 == 0:  # even ranks send first, odd ranks receive first: no deadlock
                dist.send(kv, (rank + 1) % n)
                dist.recv(nxt, (rank - 1) % n)
            else:
                dist.recv(nxt, (rank - 1) % n)
                dist.send(kv, (rank + 1) % n)
            kv = nxt
    return o / l

# %% 12.3 | isend/irecv posted only after computing on the block (no overlap) | expect: before computing
def ring_attention_forward(q, k, v):
    rank, n = dist.get_rank(), dist.get_world_size()
    D, scale = q.shape[-1], 1.0 / math.sqrt(q.shape[-1])
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    l = q.new_zeros((*q.shape[:-1], 1))
    o = torch.zeros_like(q)
    kv = torch.cat([k, v], dim=-1).contiguous()
    for step in range(n):
        s = (q @ kv[..., :D].transpose(-2, -1)) * scale  # compute first ...
        m, l, o = online_softmax_update(m, l, o, s, kv[..., D:])
        if step < n - 1:  # ... then exchange: the link idles while the cores work
            nxt = torch.empty_like(kv)
            reqs = [dist.isend(kv, (rank + 1) % n), dist.irecv(nxt, (rank - 1) % n)]
            for req in reqs:
                req.wait()
            kv = nxt
    return o / l
