"""Context parallelism: ring attention over a sequence split across ranks, and the zigzag layout (lesson 12).

    q_l, k_l, v_l = (shard_sequence(t, rank, world, "zigzag") for t in (q, k, v))   # (B, H, T/N, D) each
    out_l = ring_attention(q_l, k_l, v_l, causal=True, layout="zigzag")             # this rank's output chunk
    out = unshard_sequence([out_0, out_1, ...], "zigzag")                           # == attention(q, k, v)

Every rank keeps its queries; the key/value blocks travel once around the ring (N − 1 hops), each
step's transfer started (`isend`/`irecv`) *before* the block that has just arrived is computed, so
the link works while the cores do. Blocks are folded in with lesson 09's online softmax
(`m11_helpers.attention.online_softmax_update`), so the result is exact. Backward runs the ring
again: K/V travel as in forward, and each block's gradient dK, dV travels with it, collecting every
rank's contribution, and is handed back to its owner after the last hop.

Causal masks make contiguous chunks unfair: rank r's queries see r + 1 blocks, rank N − 1 does N
times rank 0's work. The zigzag layout splits the sequence into 2N chunks and gives rank r chunks r
and 2N − 1 − r: every rank then computes the same number of score tiles.

Sources: Liu, Zaharia & Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
ICLR 2024 (arXiv:2310.01889), §3 and Algorithm 1; the 2N-chunk layout: Dubey et al., "The Llama 3 Herd
of Models", 2024 (arXiv:2407.21783), §3.3.2 ("the i-th CP rank receives both the i-th and the
(2 × CP − 1 − i)-th chunks"); the backward with lse: Dao, "FlashAttention-2", 2023, Algorithm 2.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from m11_helpers.attention import online_softmax_update
from m11_helpers.validate import non_negative_int, one_of, positive_int

__all__ = ["LAYOUTS", "chunk_ids", "shard_sequence", "unshard_sequence", "ring_attention", "score_tiles",
           "critical_path_tiles", "ring_bytes_per_rank"]

LAYOUTS = ("contiguous", "zigzag")
_KV, _DKV = 0, 1  # message tags: the K/V block and its travelling gradient never get confused


def chunk_ids(rank: int, world: int, layout: str = "contiguous") -> list[int]:
    """Which of the sequence's chunks rank holds: [rank] of N chunks, or [rank, 2N−1−rank] of 2N (zigzag)."""
    positive_int("world", world)
    non_negative_int("rank", rank)
    one_of("layout", layout, LAYOUTS)
    if rank >= world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
    return [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]


def _pieces(length: int, world: int, layout: str) -> int:
    n = world * (1 if layout == "contiguous" else 2)
    if length % n:
        raise ValueError(f"the sequence length ({length}) must be divisible by {n} for the {layout} layout "
                         f"on {world} ranks")
    return n


def shard_sequence(x: torch.Tensor, rank: int, world: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """Rank's part of x along `dim` (the sequence): its chunks of chunk_ids(rank, world, layout), in order."""
    ids = chunk_ids(rank, world, layout)
    parts = x.chunk(_pieces(x.shape[dim], world, layout), dim=dim)
    return torch.cat([parts[i] for i in ids], dim=dim)


def unshard_sequence(shards: list[torch.Tensor], layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The inverse of shard_sequence: every rank's part (in rank order) back into one sequence."""
    world = len(shards)
    positive_int("len(shards)", world)
    order: dict[int, torch.Tensor] = {}
    for rank, shard in enumerate(shards):
        ids = chunk_ids(rank, world, layout)
        for i, part in zip(ids, shard.chunk(len(ids), dim=dim)):
            order[i] = part
    return torch.cat([order[i] for i in sorted(order)], dim=dim)


def _relation(a: int, b: int, causal: bool) -> str:
    """Query chunk a against key chunk b: 'full' (all in the past), 'diag' (the same chunk) or 'skip' (future)."""
    if not causal or b < a:
        return "full"
    return "diag" if a == b else "skip"


def _tiles(rank: int, src: int, world: int, layout: str, causal: bool):
    """(i, j, relation) for each pair of rank's query sub-chunk i and src's key sub-chunk j worth computing."""
    mine, theirs = chunk_ids(rank, world, layout), chunk_ids(src, world, layout)
    if not causal:  # no mask: one tile for the whole local block
        return [(None, None, "full")]
    out = [(i, j, _relation(a, b, causal)) for i, a in enumerate(mine) for j, b in enumerate(theirs)]
    return [t for t in out if t[2] != "skip"]


def _sub(x: torch.Tensor, i, parts: int) -> torch.Tensor:
    return x if i is None else x.chunk(parts, dim=-2)[i]


def _scores(q: torch.Tensor, k: torch.Tensor, rel: str, scale: float) -> torch.Tensor:
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, c, c): one score tile, never the (T, T) matrix
    if rel == "diag":
        c = s.shape[-1]
        s = s.masked_fill(torch.ones(c, c, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _neighbours(group) -> tuple[int, int, int, int]:
    """(rank in group, group size, right and left neighbours as global ranks)."""
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: run ring_attention inside launch(fn, ...)")
    r, n = dist.get_rank(group), dist.get_world_size(group)
    glob = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    return r, n, glob((r + 1) % n), glob((r - 1) % n)


def _exchange(t: torch.Tensor, right: int, left: int, tag: int, group, stats, key: str = "bytes_sent"):
    """Post the send of t to the right and the receive of the same shape from the left; return (buffer, requests)."""
    buf = torch.empty_like(t)
    reqs = [dist.isend(t, right, group=group, tag=tag), dist.irecv(buf, left, group=group, tag=tag)]
    if stats is not None:
        stats[key] = stats.get(key, 0) + t.numel() * t.element_size()
    return buf, reqs


def _count(stats, tile: torch.Tensor) -> None:
    if stats is not None:  # score entries per (batch, head): the work one rank does
        stats["score_entries"] = stats.get("score_entries", 0) + tile.shape[-2] * tile.shape[-1]
        stats["tiles"] = stats.get("tiles", 0) + 1
        stats["largest_tile"] = max(stats.get("largest_tile", 0), tile.shape[-2] * tile.shape[-1])


def _ring_forward(q, k, v, causal, layout, group, stats):
    rank, n, right, left = _neighbours(group)
    D, parts = q.shape[-1], len(chunk_ids(rank, n, layout))
    scale = 1.0 / math.sqrt(D)
    subs = [None] if not causal else list(range(parts))
    state = {i: (q.new_full((*_sub(q, i, parts).shape[:-1], 1), float("-inf")),  # running max (B, H, c, 1)
                 q.new_zeros((*_sub(q, i, parts).shape[:-1], 1)),  # running sum (B, H, c, 1)
                 torch.zeros_like(_sub(q, i, parts))) for i in subs}  # unnormalised output (B, H, c, D)
    kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D): one message per hop
    for step in range(n):
        src = (rank - step) % n  # whose K/V block this rank holds now
        if step < n - 1:  # start the next hop first: it travels while this block is computed
            nxt, reqs = _exchange(kv, right, left, _KV, group, stats)
        kb, vb = kv[..., :D], kv[..., D:]
        for i, j, rel in _tiles(rank, src, n, layout, causal):
            s = _scores(_sub(q, i, parts), _sub(kb, j, parts), rel, scale)
            _count(stats, s)
            state[i] = online_softmax_update(*state[i], s, _sub(vb, j, parts))
        if step < n - 1:
            for r in reqs:
                r.wait()
            kv = nxt
    outs = [o / l for (_, l, o) in (state[i] for i in subs)]
    lses = [m + torch.log(l) for (m, l, _) in (state[i] for i in subs)]
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)  # (B, H, T/N, D), (B, H, T/N, 1)


def _ring_backward(do, q, k, v, out, lse, causal, layout, group, stats):
    rank, n, right, left = _neighbours(group)
    D, parts = q.shape[-1], len(chunk_ids(rank, n, layout))
    scale = 1.0 / math.sqrt(D)
    delta = (do * out).sum(dim=-1, keepdim=True)  # (B, H, T/N, 1): rowsum(dO ∘ O)
    dq = torch.zeros_like(q)
    kv = torch.cat([k, v], dim=-1).contiguous()  # (B, H, T/N, 2D)
    incoming = None  # the gradient of the block now held, as accumulated by the ranks before this one
    for step in range(n):
        src = (rank - step) % n
        if step < n - 1:
            nxt, kv_reqs = _exchange(kv, right, left, _KV, group, stats, "bytes_sent_backward")
        kb, vb = kv[..., :D], kv[..., D:]
        dkv = torch.zeros_like(kv)  # this rank's contribution to block src's dK, dV
        for i, j, rel in _tiles(rank, src, n, layout, causal):
            qi, doi = _sub(q, i, parts), _sub(do, i, parts)
            p = torch.exp(_scores(qi, _sub(kb, j, parts), rel, scale) - _sub(lse, i, parts))  # exact softmax tile
            dp = doi @ _sub(vb, j, parts).transpose(-2, -1)  # (B, H, c, c)
            ds = p * (dp - _sub(delta, i, parts)) * scale
            _sub(dq, i, parts).add_(ds @ _sub(kb, j, parts))
            _sub(dkv[..., :D], j, parts).add_(ds.transpose(-2, -1) @ qi)  # dK of block src
            _sub(dkv[..., D:], j, parts).add_(p.transpose(-2, -1) @ doi)  # dV of block src
        if n == 1:
            return dq, dkv[..., :D].contiguous(), dkv[..., D:].contiguous()
        if incoming is not None:  # the travelling gradient left its sender during the previous step
            buf, reqs = incoming
            for r in reqs:
                r.wait()
            dkv += buf
        # pass it on to the right, where its block goes too
        incoming = _exchange(dkv, right, left, _DKV, group, stats, "bytes_sent_backward")
        if step < n - 1:
            for r in kv_reqs:
                r.wait()
            kv = nxt
    buf, reqs = incoming  # after N hops: my own block's gradient, with every rank's contribution
    for r in reqs:
        r.wait()
    return dq, buf[..., :D].contiguous(), buf[..., D:].contiguous()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, stats):
        with torch.no_grad():
            out, lse = _ring_forward(q, k, v, causal, layout, group, stats)
        ctx.save_for_backward(q, k, v, out, lse)  # O(T/N) per rank: no score matrix is kept
        ctx.cfg = (causal, layout, group, stats)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(do.contiguous(), q, k, v, out, lse, *ctx.cfg)
        return dq, dk, dv, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *,
                   layout: str = "contiguous", group=None, stats: dict | None = None) -> torch.Tensor:
    """softmax(QKᵀ/√d)V for this rank's query chunk against the whole sequence, K/V passed around a ring.

    Called on every rank of `group` with its chunk (B, H, T/N, D) of q, k, v — laid out by
    `shard_sequence(x, rank, N, layout)` — returns its chunk of the output; differentiable (the ring
    runs again in backward). `stats`, if given, collects this rank's work and traffic: score_entries
    (per batch·head), tiles, largest_tile, bytes_sent (forward), bytes_sent_backward.
    """
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must be (B, H, T/N, D) chunks of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    one_of("layout", layout, LAYOUTS)
    if causal and layout == "zigzag" and q.shape[-2] % 2:
        raise ValueError(f"a zigzag chunk holds two sub-chunks: its length must be even, got {q.shape[-2]}")
    return _RingAttention.apply(q, k, v, bool(causal), layout, group, stats)


def score_tiles(world: int, layout: str = "contiguous", causal: bool = True) -> list[int]:
    """Score entries each rank computes, in units of (T/2N)² per batch·head: the per-rank work of the ring.

    Contiguous, causal: rank r computes r + 1 blocks of (T/N)² = 4(r + 1) units. Zigzag: 2N + 1 units
    on every rank (3 on its own block, 2 on each other's). Non-causal: 4N units everywhere.
    """
    positive_int("world", world)
    one_of("layout", layout, LAYOUTS)
    per = 4 if layout == "contiguous" else 1  # a contiguous chunk is two zigzag sub-chunks long
    return [sum(4 if i is None else per for src in range(world) for i, _, _ in _tiles(rank, src, world, layout, causal))
            for rank in range(world)]


def critical_path_tiles(world: int, layout: str = "contiguous", causal: bool = True) -> int:
    """Σ over the N ring steps of the busiest rank's tiles that step, in (T/2N)² units: what the ring's time follows.

    Every step waits for its slowest rank. Contiguous, causal: each step someone computes a whole (T/N)²
    block, 4N units in all (vs a mean of 2(N + 1)); zigzag: 3 + 2(N − 1) = 2N + 1 — 4N/(2N + 1) = 1.78× at N = 4.
    """
    positive_int("world", world)
    one_of("layout", layout, LAYOUTS)
    per = 4 if layout == "contiguous" else 1
    return sum(max(sum(4 if i is None else per for i, _, _ in _tiles(rank, (rank - step) % world, world, layout,
                                                                        causal)) for rank in range(world))
               for step in range(world))


def ring_bytes_per_rank(seq_len: int, world: int, kv_hidden: int, dtype_bytes: int = 2, batch: int = 1) -> dict:
    """Bytes one rank sends per layer: forward (N−1)·2·(T/N)·h_kv·bytes (K and V), backward that again plus N·the same for dK, dV.

    h_kv = kv_heads · head_dim (grouped-query attention makes K and V smaller than Q).
    Liu et al. 2023, §3 (each host sends its K/V block N − 1 times).
    """
    for name, x in (("seq_len", seq_len), ("world", world), ("kv_hidden", kv_hidden),
                    ("dtype_bytes", dtype_bytes), ("batch", batch)):
        positive_int(name, x)
    block = 2 * batch * (seq_len / world) * kv_hidden * dtype_bytes  # K and V of one chunk
    return {"forward": (world - 1) * block, "backward": (world - 1) * block + world * block,
            "per_step": block}
