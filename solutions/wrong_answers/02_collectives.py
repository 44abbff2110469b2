"""Recorded wrong answers for solutions/02_collectives.ipynb (format: m11_helpers/grading/authoring/wrong_answers.py)."""

# %% 2.1 | direct exchange: sends chunk j straight to rank j (right numbers, same bytes, no ring) | expect: right-hand neighbour
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.chunk(n))
    reqs = [dist.isend(chunks[j].contiguous(), j) for j in range(n) if j != rank]
    mine = chunks[rank].clone()
    buf = torch.empty_like(mine)
    for j in range(n):
        if j != rank:
            dist.recv(buf, j)
            mine += buf
    for req in reqs:
        req.wait()
    return mine

# %% 2.1 | a blocking send before the receive on every rank | expect: deadlock
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.clone().chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty_like(chunks[0])
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step - 1) % n, (rank - step - 2) % n
        dist.send(chunks[send_idx], right)
        dist.recv(buf, left)
        chunks[recv_idx].add_(buf)
    return chunks[rank]

# %% 2.1 | sums into the caller's tensor (no clone) | expect: changed the caller's tensor
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty_like(chunks[0])
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step - 1) % n, (rank - step - 2) % n
        req = dist.isend(chunks[send_idx], right)
        dist.recv(buf, left)
        req.wait()
        chunks[recv_idx].add_(buf)
    return chunks[rank]

# %% 2.1 | chunk offsets off by one: finishes chunk rank+1 | expect: rank r must end with chunk r
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.clone().chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty_like(chunks[0])
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n
        req = dist.isend(chunks[send_idx], right)
        dist.recv(buf, left)
        req.wait()
        chunks[recv_idx].add_(buf)
    return chunks[(rank + 1) % n]

# %% 2.1 | passes whole tensors around the ring, then slices (right numbers, N times the bytes) | expect: S/N bytes
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    total, passing, buf = x.clone(), x.clone(), torch.empty_like(x)
    for _ in range(n - 1):
        req = dist.isend(passing, right)
        dist.recv(buf, left)
        req.wait()
        total += buf
        passing = buf.clone()
    return total.chunk(n)[rank]

# %% 2.1 | delegates to the backend's reduce-scatter | expect: yourself
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.numel() // dist.get_world_size())
    dist.reduce_scatter_single(out, x.clone())
    return out

# %% 2.1 | delegates to the course's ring | expect: yourself
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    return course.ring_reduce_scatter(x)

# %% 2.1 | calls the ring steps the lesson showed (collectives._reduce_scatter_) | expect: yourself
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.clone().chunk(n))
    course._reduce_scatter_(chunks, None)
    return chunks[rank]

# %% 2.2 | direct exchange: sends its chunk straight to every rank | expect: right-hand neighbour
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty(n * chunk.numel())
    parts = list(out.chunk(n))
    parts[rank].copy_(chunk)
    reqs = [dist.isend(parts[rank], j) for j in range(n) if j != rank]
    for j in range(n):
        if j != rank:
            dist.recv(parts[j], j)
    for req in reqs:
        req.wait()
    return out

# %% 2.2 | a blocking send before the receive on every rank | expect: deadlock
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty(n * chunk.numel())
    parts = list(out.chunk(n))
    parts[rank].copy_(chunk)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        dist.send(parts[(rank - step) % n], right)
        dist.recv(parts[(rank - step - 1) % n], left)
    return out

# %% 2.2 | concatenates in arrival order, not rank order | expect: rank order
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    got, passing = [chunk.clone()], chunk.clone()
    for _ in range(n - 1):
        buf = torch.empty_like(chunk)
        req = dist.isend(passing, right)
        dist.recv(buf, left)
        req.wait()
        got.append(buf)
        passing = buf
    return torch.cat(got)

# %% 2.2 | forwards its own chunk at every step instead of the one that arrived | expect: pass on the chunk that arrived
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty(n * chunk.numel())
    parts = list(out.chunk(n))
    parts[rank].copy_(chunk)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        req = dist.isend(parts[rank], right)
        dist.recv(parts[(rank - step - 1) % n], left)
        req.wait()
    return out

# %% 2.2 | delegates to the backend's all-gather | expect: yourself
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    out = chunk.new_empty(dist.get_world_size() * chunk.numel())
    dist.all_gather_single(out, chunk)
    return out

# %% 2.2 | calls the ring steps of the course's module (collectives._all_gather_) | expect: yourself
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty(n * chunk.numel())
    parts = list(out.chunk(n))
    parts[rank].copy_(chunk)
    course._all_gather_(parts, None)
    return out

# %% 2.3 | log2 N without rounding up (fine for powers of two only) | expect: round log2 N up
def crossover(N: int, alpha: float, beta: float) -> float:
    L = math.log2(N)
    latency_gap, bandwidth_gap = (N - 1) - L, L - (N - 1) / N
    return alpha * latency_gap / (beta * bandwidth_gap) if latency_gap > 0 else 0.0


def half_bandwidth(N: int, alpha: float, beta: float) -> float:
    return N * alpha / beta

# %% 2.3 | the ring's bandwidth term as 2S·β, dropping (N-1)/N | expect: keep the (N-1)/N
def crossover(N: int, alpha: float, beta: float) -> float:
    L = math.ceil(math.log2(N))
    latency_gap, bandwidth_gap = (N - 1) - L, L - 1
    return alpha * latency_gap / (beta * bandwidth_gap) if latency_gap > 0 else 0.0


def half_bandwidth(N: int, alpha: float, beta: float) -> float:
    return N * alpha / beta

# %% 2.3 | reuses lesson 01's point-to-point α·B (= α/β) as the ring's half-bandwidth size | expect: the N of S/N stays
def crossover(N: int, alpha: float, beta: float) -> float:
    L = math.ceil(math.log2(N))
    latency_gap, bandwidth_gap = (N - 1) - L, L - (N - 1) / N
    return alpha * latency_gap / (beta * bandwidth_gap) if latency_gap > 0 else 0.0


def half_bandwidth(N: int, alpha: float, beta: float) -> float:
    return alpha / beta

# %% 2.3 | calls the course's helpers instead of deriving | expect: yourself
def crossover(N: int, alpha: float, beta: float) -> float:
    return cm.crossover_bytes(N, alpha, beta)


def half_bandwidth(N: int, alpha: float, beta: float) -> float:
    return cm.half_bandwidth_bytes(N, alpha, beta)

# %% 2.3 | solves T_ring(S) = T_tree(S) numerically with the course's time formulas | expect: yourself
def _solve(f, lo=1e-6, hi=1e18):  # geometric bisection for the sign change of f
    for _ in range(300):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return math.sqrt(lo * hi)


def crossover(N: int, alpha: float, beta: float) -> float:
    gap = lambda S: cm.ring_allreduce_time(S, N, alpha, beta) - cm.tree_allreduce_time(S, N, alpha, beta)
    return _solve(gap) if gap(1e-6) > 0 else 0.0


def half_bandwidth(N: int, alpha: float, beta: float) -> float:
    return _solve(lambda S: 1 / (2 * beta) - cm.busbw("all_reduce", S, cm.ring_allreduce_time(S, N, alpha, beta), N))

# %% 2.4 | one flat all-reduce over every rank (right numbers, the whole tensor crosses nodes) | expect: reduce-scatter inside the node first
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out)
    return out

# %% 2.4 | sums inside the node, then all-reduces the whole tensor along the rail | expect: only the shard crosses nodes
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out, group=node_group)
    dist.all_reduce(out, group=rail_group)
    return out

# %% 2.4 | the groups swapped: reduce-scatter across nodes, all-reduce inside the node | expect: only the shard crosses nodes
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    g = dist.get_world_size(rail_group)
    shard = x.new_empty(x.numel() // g)
    backend_reduce_scatter(shard, x, group=rail_group)
    dist.all_reduce(shard, group=node_group)
    out = torch.empty_like(x)
    backend_all_gather(out, shard, group=rail_group)
    return out

# %% 2.4 | all-reduces the shard inside the node instead of along the rail | expect: over the rail group
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    g = dist.get_world_size(node_group)
    shard = x.new_empty(x.numel() // g)
    backend_reduce_scatter(shard, x, group=node_group)
    dist.all_reduce(shard, group=node_group)
    out = torch.empty_like(x)
    backend_all_gather(out, shard, group=node_group)
    return out

# %% 2.4 | gathers the result into the caller's x | expect: changed the caller's tensor
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    g = dist.get_world_size(node_group)
    shard = x.new_empty(x.numel() // g)
    backend_reduce_scatter(shard, x, group=node_group)
    dist.all_reduce(shard, group=rail_group)
    backend_all_gather(x, shard, group=node_group)
    return x

# %% 2.4 | calls the course's hierarchical_all_reduce | expect: yourself
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    return course.hierarchical_all_reduce(x, node_group, rail_group)

# %% 2.2 | makes the output with torch.empty: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = torch.empty(n * chunk.numel(), dtype=chunk.dtype)
    parts = list(out.chunk(n))
    parts[rank].copy_(chunk)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n
        req = dist.isend(parts[send_idx], right)
        dist.recv(parts[recv_idx], left)
        req.wait()
    return out

# %% 2.4 | makes the shard with torch.empty: a CPU buffer, which NCCL rejects on GPUs | expect: No backend type associated with device type cpu
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    g = dist.get_world_size(node_group)
    shard = torch.empty(x.numel() // g, dtype=x.dtype)
    backend_reduce_scatter(shard, x, group=node_group)
    dist.all_reduce(shard, group=rail_group)
    out = torch.empty_like(x)
    backend_all_gather(out, shard, group=node_group)
    return out

# %% 2.1 | a serialized ring: every rank but 0 waits for its receive before it sends (right numbers and bytes, N× the time) | expect: steps run one after another
def my_ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.clone().chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty_like(chunks[0])
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step - 1) % n, (rank - step - 2) % n
        if rank == 0:  # rank 0 starts each step; every other rank passes it on once its message is in
            req = dist.isend(chunks[send_idx], right)
            dist.recv(buf, left)
            req.wait()
        else:
            work = dist.irecv(buf, left)
            work.wait()
            dist.send(chunks[send_idx], right)
        chunks[recv_idx].add_(buf)
    return chunks[rank]

# %% 2.2 | a serialized ring: each rank forwards a step's chunk only after its own arrived (bucket brigade) | expect: steps run one after another
def my_ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty(n * chunk.numel())
    parts = list(out.chunk(n))
    parts[rank].copy_(chunk)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n
        if rank == 0:
            req = dist.isend(parts[send_idx], right)
            dist.recv(parts[recv_idx], left)
            req.wait()
        else:
            dist.recv(parts[recv_idx], left)
            dist.send(parts[send_idx], right)
    return out

# %% 2.4 | all-reduces the whole x inside the node, then only its shard across (right numbers, 1/g across nodes, 1.5× the node's traffic) | expect: links inside its node
def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    g, local = dist.get_world_size(node_group), dist.get_group_rank(node_group, dist.get_rank())
    node_sum = x.clone()
    dist.all_reduce(node_sum, group=node_group)  # every GPU of the node holds the node's whole sum
    shard = node_sum.chunk(g)[local].clone()  # (S/g,) its part of it
    dist.all_reduce(shard, group=rail_group)
    out = torch.empty_like(x)
    backend_all_gather(out, shard, group=node_group)
    return out
