"""Ring collectives written with point-to-point send/recv, and the timing loop that measures them (lesson 02).

Run inside ranks started by `m11_helpers.launch.launch` (torch.distributed already initialised):

    out = ring_all_reduce(grad.clone())          # == dist.all_reduce(grad), summed
    mine = ring_reduce_scatter(grad)             # this rank's 1/n of the sum  (chunk `rank`)
    full = ring_all_gather(mine, numel)          # every rank's chunk, concatenated

The ring (Patarasuk & Yuan 2009; Baidu's "Bringing HPC techniques to deep learning", 2017):
split the flat tensor into n chunks. Reduce-scatter: for n-1 steps each rank sends one chunk to its
right neighbour and adds the chunk arriving from its left into its own copy; afterwards rank r
holds chunk r summed over all ranks. All-gather: n-1 more steps pass the finished chunks around.
Every rank sends 2(n-1)/n of the tensor whatever n is; that is the bandwidth lower bound.

Across nodes, `hierarchical_all_reduce` keeps the big traffic on the fast links: reduce-scatter
inside the node, all-reduce each GPU's 1/g shard across nodes with the GPUs of the same local rank
(its *rail*), all-gather inside the node (Jia et al. 2018, "Highly Scalable Deep Learning Training
System with Mixed-Precision", arXiv:1807.11205, "hierarchical all-reduce"; the shape of HSDP, lesson 12).

Written for gloo (CPU), as the lessons run it. With NCCL, point-to-point calls issued one by one
can serialise on one stream; group them with `dist.batch_isend_irecv` there.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from m11_helpers.validate import non_negative_int, positive_int

__all__ = ["ring_chunks", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce",
           "backend_reduce_scatter", "backend_all_gather", "node_and_rail_groups", "hierarchical_all_reduce",
           "time_collective", "bandwidth_sweep", "IMPLEMENTATIONS"]


# ----------------------------------------------------------------------------------------------
# The backend's own collectives, with the current (non-deprecated) names
# ----------------------------------------------------------------------------------------------

def backend_reduce_scatter(output: torch.Tensor, input: torch.Tensor, *, group=None) -> None:
    """dist.reduce_scatter_single (torch >= 2.13); reduce_scatter_tensor on older torch, where it is not deprecated.

    Sums; `group` is a process group (None: the default one).
    """
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(output, input, group=group)


def backend_all_gather(output: torch.Tensor, input: torch.Tensor, *, group=None) -> None:
    """dist.all_gather_single (torch >= 2.13); all_gather_into_tensor on older torch. `group`: None = default."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, input, group=group)


# ----------------------------------------------------------------------------------------------
# The ring, from point-to-point messages
# ----------------------------------------------------------------------------------------------

def ring_chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n contiguous views of a 1-D tensor; sizes differ by at most one element (torch.tensor_split)."""
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError(f"flat must be a contiguous 1-D tensor, got shape {tuple(flat.shape)}")
    positive_int("n", n)
    return list(torch.tensor_split(flat, n))  # views: writing into a chunk writes into `flat`


def _where() -> tuple[int, int, int, int]:
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: run this inside launch(fn, num_processes=N)")
    rank, n = dist.get_rank(), dist.get_world_size()
    return rank, n, (rank + 1) % n, (rank - 1) % n  # rank, world size, right neighbour, left neighbour


SEGMENT_BYTES = 512 * 2**10  # pipelining granularity: big enough that α per segment stays small


def _segments(t: torch.Tensor, segments: int | None) -> int:
    if segments is None:  # ~512 KiB pieces, at most 16; one piece for small chunks (keeps α low)
        return max(1, min(16, t.numel() * t.element_size() // SEGMENT_BYTES))
    return positive_int("segments (or None for automatic)", segments)


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int,
              add_into: torch.Tensor | None = None, segments: int = 1) -> None:
    """Send `send` to the right, receive `recv` from the left; then add it into `add_into` if given."""
    # Post every send and receive before waiting on any: every rank does the same, so no rank waits
    # for a neighbour that is itself blocked in a send (a blocking send first can deadlock).
    # In segments, so that while piece k is being added, pieces k+1... are still on the wire.
    sends = [dist.isend(piece, right) for piece in send.tensor_split(segments)]
    pieces = recv.tensor_split(segments)
    recvs = [dist.irecv(piece, left) for piece in pieces]
    targets = add_into.tensor_split(segments) if add_into is not None else [None] * segments
    for piece, req, target in zip(pieces, recvs, targets):
        req.wait()
        if target is not None:
            target.add_(piece)  # reduce this piece while the next ones arrive
    for req in sends:
        req.wait()  # `send` may be overwritten later: it must have left first


def _record(trace, phase, step, rank, sent, received, chunks) -> None:
    if trace is not None:
        trace.append({"phase": phase, "step": step, "rank": rank, "sent": sent, "received": received,
                      "bytes_sent": chunks[sent].numel() * chunks[sent].element_size(),
                      "values": [float(c[0]) if c.numel() else 0.0 for c in chunks]})  # each chunk's first value


def _reduce_scatter_(chunks: list[torch.Tensor], trace: list | None, segments: int | None = 1) -> None:
    """In place: afterwards chunks[rank] holds the sum over ranks of chunk `rank`."""
    rank, n, right, left = _where()
    buf = torch.empty_like(chunks[0])  # chunk 0 is the largest (tensor_split puts extras first)
    k = _segments(chunks[0], segments)
    for step in range(n - 1):
        # Offsets chosen so the last chunk to arrive, at step n-2, is chunk `rank` (its owner).
        send_idx, recv_idx = (rank - step - 1) % n, (rank - step - 2) % n
        incoming = buf[: chunks[recv_idx].numel()]
        # the partial sum in chunk recv_idx now holds step+2 ranks' contributions
        _exchange(chunks[send_idx], incoming, right, left, add_into=chunks[recv_idx], segments=k)
        _record(trace, "reduce-scatter", step, rank, send_idx, recv_idx, chunks)


def _all_gather_(chunks: list[torch.Tensor], trace: list | None, segments: int | None = 1) -> None:
    """In place: chunks[rank] is this rank's finished chunk; afterwards every chunk is filled."""
    rank, n, right, left = _where()
    k = _segments(chunks[0], segments)
    for step in range(n - 1):
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n  # pass on what arrived last step
        _exchange(chunks[send_idx], chunks[recv_idx], right, left, segments=k)
        _record(trace, "all-gather", step, rank, send_idx, recv_idx, chunks)


def ring_reduce_scatter(tensor: torch.Tensor, trace: list | None = None, segments: int | None = None) -> torch.Tensor:
    """Return chunk `rank` of Σ_ranks tensor (as dist.reduce_scatter_single); n-1 steps of one chunk each.

    `tensor` is not modified (a flat copy is the working buffer). Sizes need not divide by n:
    chunk r is `torch.tensor_split(tensor.flatten(), n)[r]`. `segments`: pieces per message
    (pipelining; None = about 512 KiB each).
    """
    flat = tensor.detach().flatten().clone()  # (numel,) working copy
    chunks = ring_chunks(flat, dist.get_world_size())
    _reduce_scatter_(chunks, trace, segments)
    return chunks[dist.get_rank()]


def ring_all_gather(chunk: torch.Tensor, numel: int | None = None, trace: list | None = None,
                    segments: int | None = None) -> torch.Tensor:
    """Return the concatenation of every rank's `chunk` (as dist.all_gather_single); n-1 steps.

    `numel` is the total size (default: chunk.numel() · n, i.e. equal chunks); with it, the chunks
    follow torch.tensor_split(range(numel), n), so ring_all_gather(ring_reduce_scatter(x), x.numel())
    is an all-reduce for any size.
    """
    rank, n, _, _ = _where()
    numel = chunk.numel() * n if numel is None else numel
    out = (torch.zeros if trace is not None else torch.empty)(numel, dtype=chunk.dtype, device=chunk.device)  # (numel,)
    chunks = ring_chunks(out, n)
    if chunks[rank].numel() != chunk.numel():
        raise ValueError(f"chunk has {chunk.numel()} elements but chunk {rank} of numel={numel} over {n} "
                         f"ranks has {chunks[rank].numel()}")
    chunks[rank].copy_(chunk.flatten())
    _all_gather_(chunks, trace, segments)
    return out


def ring_all_reduce(tensor: torch.Tensor, trace: list | None = None, segments: int | None = None) -> torch.Tensor:
    """Sum `tensor` over ranks in place (as dist.all_reduce) = ring reduce-scatter + ring all-gather.

    2(n-1) steps; each rank sends 2(n-1)/n · numel elements. Returns `tensor`. Large messages go
    in `segments` pieces (None: ~512 KiB each) so that adding one piece overlaps receiving the next.
    """
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (the ring writes into views of it)")
    chunks = ring_chunks(tensor.view(-1), dist.get_world_size())  # (numel/n,) views into `tensor`
    _reduce_scatter_(chunks, trace, segments)
    _all_gather_(chunks, trace, segments)
    return tensor


# ----------------------------------------------------------------------------------------------
# Two levels: nodes of g GPUs (consecutive ranks), rails across them
# ----------------------------------------------------------------------------------------------

def node_and_rail_groups(gpus_per_node: int):
    """(this rank's node group, its rail group) for nodes of `gpus_per_node` consecutive ranks.

    Node k = ranks k·g … k·g+g-1; rail j = ranks j, g+j, 2g+j, … (local rank j on every node).
    Every rank creates every group, in the same order: dist.new_group is collective.
    """
    g = positive_int("gpus_per_node", gpus_per_node)
    rank, n = dist.get_rank(), dist.get_world_size()
    if n % g:
        raise ValueError(f"gpus_per_node ({g}) must divide the world size ({n})")
    nodes = [dist.new_group(list(range(k * g, (k + 1) * g))) for k in range(n // g)]
    rails = [dist.new_group(list(range(j, n, g))) for j in range(g)]
    return nodes[rank // g], rails[rank % g]


def hierarchical_all_reduce(x: torch.Tensor, node_group, rail_group) -> torch.Tensor:
    """Σ over all ranks of the 1-D `x` (a new tensor; `x` is untouched): reduce-scatter in the node,
    all-reduce the 1/g shard along the rail, all-gather in the node. x.numel() must divide by g.

    Only S/g per GPU crosses nodes (2(nodes-1)/nodes of it on a ring), each GPU on its own rail.
    """
    g = dist.get_world_size(node_group)
    if x.dim() != 1 or x.numel() % g:
        raise ValueError(f"x must be 1-D with numel divisible by the node size {g}, got shape {tuple(x.shape)}")
    shard = torch.empty(x.numel() // g, dtype=x.dtype, device=x.device)  # (S/g,)
    backend_reduce_scatter(shard, x, group=node_group)  # the node's sum of my 1/g, over NVLink
    dist.all_reduce(shard, group=rail_group)  # + every other node's: the only inter-node traffic
    out = torch.empty_like(x)  # (S,)
    backend_all_gather(out, shard, group=node_group)
    return out


# ----------------------------------------------------------------------------------------------
# Measuring: every rank runs the same loop; a collective takes as long as its slowest rank
# ----------------------------------------------------------------------------------------------

def _backend_all_reduce(t: torch.Tensor) -> None:
    dist.all_reduce(t)


# name -> in-place all-reduce of a flat tensor
IMPLEMENTATIONS: dict[str, Callable[[torch.Tensor], object]] = {
    "ring (ours)": ring_all_reduce,
    "backend": _backend_all_reduce,
}


def time_collective(op: Callable[[torch.Tensor], object], tensor: torch.Tensor, iters: int = 5,
                    warmup: int = 1) -> list[float]:
    """Seconds per call of op(tensor), each call the max over ranks (barrier before, MAX-reduce after)."""
    positive_int("iters", iters)
    non_negative_int("warmup", warmup)
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        op(tensor)
        if tensor.is_cuda:
            torch.cuda.synchronize()  # NCCL returns before the GPU has finished
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=tensor.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective ends when the last rank does
        if i >= warmup:
            times.append(float(elapsed))
    return times


def bandwidth_sweep(sizes: list[int], impls: tuple[str, ...] = ("ring (ours)", "backend"),
                    budget_s: float = 0.3, max_iters: int = 20, check: bool = True,
                    device: str = "cpu") -> list[dict]:
    """All-reduce each size (bytes, float32) with each implementation; rows of median seconds.

    Implementations alternate at every size so load from other processes hits both alike. With
    `check`, the first call of each implementation is compared against a single-process sum.
    """
    rank, n, _, _ = _where()
    for name in impls:
        if name not in IMPLEMENTATIONS:
            raise ValueError(f"impls must name entries of {list(IMPLEMENTATIONS)}, got {name!r}")
    rows = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        x = torch.full((numel,), float(rank + 1), device=device)  # (numel,) so the sum is n(n+1)/2 everywhere
        expected = n * (n + 1) / 2
        for name in impls:
            op = IMPLEMENTATIONS[name]
            if check:
                y = x.clone()
                op(y)
                if not bool((y == expected).all()):
                    raise AssertionError(f"{name} all-reduce of {nbytes} B is wrong on rank {rank}")
            first = time_collective(op, x.clone(), iters=1, warmup=0)[0]
            iters = int(max(1, min(max_iters, budget_s / max(first, 1e-6))))
            times = sorted(time_collective(op, x.clone(), iters=iters, warmup=0))
            rows.append({"impl": name, "bytes": numel * 4, "n": n, "seconds": times[len(times) // 2],
                         "iters": iters})
    return rows
