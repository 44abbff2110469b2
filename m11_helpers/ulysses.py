"""Lesson 12 — context parallelism's second family: Ulysses, all-to-all from sequence shards to head shards and back.

    q_l, k_l, v_l = (shard_sequence(t, rank, N) for t in (q, k, v))   # (B, H, T/N, D): this rank's positions
    out_l = ulysses_attention(q_l, k_l, v_l, causal=True, stats=s)      # == its chunk of attention(q, k, v)
    ulysses_bytes_per_rank(T, N, hidden)                                 # vs ring_bytes_per_rank (context_parallel)

Each rank holds T/N positions of every head. One all-to-all per tensor regroups them so that each rank
holds all T positions of H/N heads (rank j receives head group j from everyone); attention is then
ordinary full attention, head by head, with no ring and no online softmax; a last all-to-all sends
the output back to sequence shards. Backward is the same exchanges reversed (an all-to-all's adjoint
is the reverse all-to-all). Per rank each all-to-all sends (N−1)/N of its local tensor, so the forward
sends 4 · (N−1)/N² · B·T·h elements (q, k, v, out) — constant as T and N grow together, where the
ring sends 2(N−1)/N · B·T·h_kv (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509, §3.2).
The limit: a rank must hold at least one whole head, so N ≤ H (and N divides H; with grouped-query
attention, the K/V heads bound it). Past that, combine: Ulysses inside a node, the ring across nodes
(Fang & Zhao 2024, "USP", arXiv:2405.07719). Llama 3 uses neither: it all-gathers K/V inside its CP group,
small with 8 grouped-query K/V heads, and works for any mask (Dubey et al. 2024, §3.3.2).
gloo has no list `all_to_all`; `all_to_all_single` on one contiguous tensor works (as expert_parallel).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from m11_helpers.validate import positive_int

__all__ = ["seq_to_heads", "heads_to_seq", "ulysses_attention", "ulysses_bytes_per_rank", "check_heads", "choose_cp"]


def check_heads(heads: int, world: int) -> None:
    """Ulysses gives each rank H/N whole heads: N must divide H (so N ≤ H)."""
    positive_int("heads", heads)
    positive_int("world", world)
    if heads % world:
        raise ValueError(f"heads ({heads}) must be a multiple of the context-parallel ranks ({world}): Ulysses "
                         f"gives each rank whole heads, so it scales to at most {heads} ranks; beyond that use "
                         "ring attention, or Ulysses inside a group times a ring across groups (USP)")


def _a2a(x: torch.Tensor, group, stats, key: str) -> torch.Tensor:
    """all_to_all_single on dim 0 (N equal blocks); counts the bytes that leave this rank."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    if stats is not None:
        n = dist.get_world_size(group)
        stats[key] = stats.get(key, 0) + (n - 1) / n * x.numel() * x.element_size()
        stats["all_to_alls"] = stats.get("all_to_alls", 0) + 1
    return out


def _to_heads(x, group, stats, key):
    n = dist.get_world_size(group)
    b, h, t, d = x.shape  # (B, H, T/N, D)
    blocks = x.reshape(b, n, h // n, t, d).transpose(0, 1)  # (N, B, H/N, T/N, D): block j goes to rank j
    got = _a2a(blocks, group, stats, key)  # (N, B, H/N, T/N, D): block j is rank j's positions
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * t, d)  # (B, H/N, T, D)


def _to_seq(y, group, stats, key):
    n = dist.get_world_size(group)
    b, hn, t, d = y.shape  # (B, H/N, T, D)
    blocks = y.reshape(b, hn, n, t // n, d).permute(2, 0, 1, 3, 4)  # (N, B, H/N, T/N, D): positions of rank j
    got = _a2a(blocks, group, stats, key)  # (N, B, H/N, T/N, D): block j is head group j
    return got.transpose(0, 1).reshape(b, n * hn, t // n, d)  # (B, H, T/N, D)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, stats):
        ctx.group, ctx.stats = group, stats
        return _to_heads(x, group, stats, "bytes_sent")

    @staticmethod
    def backward(ctx, g):
        return _to_seq(g.contiguous(), ctx.group, ctx.stats, "bytes_sent_backward"), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group, stats):
        ctx.group, ctx.stats = group, stats
        return _to_seq(y, group, stats, "bytes_sent")

    @staticmethod
    def backward(ctx, g):
        return _to_heads(g.contiguous(), ctx.group, ctx.stats, "bytes_sent_backward"), None, None


def seq_to_heads(x: torch.Tensor, group=None, stats: dict | None = None) -> torch.Tensor:
    """(B, H, T/N, D) sequence shard -> (B, H/N, T, D) head shard: one all-to-all (differentiable)."""
    check_heads(x.shape[1], dist.get_world_size(group))
    return _SeqToHeads.apply(x, group, stats)


def heads_to_seq(y: torch.Tensor, group=None, stats: dict | None = None) -> torch.Tensor:
    """(B, H/N, T, D) head shard -> (B, H, T/N, D) sequence shard: the reverse all-to-all."""
    return _HeadsToSeq.apply(y, group, stats)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *, group=None,
                      stats: dict | None = None) -> torch.Tensor:
    """softmax(QKᵀ/√d)V for this rank's contiguous sequence chunk (B, H, T/N, D), via head-sharded full attention."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must be (B, H, T/N, D) chunks of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    check_heads(q.shape[1], dist.get_world_size(group))
    qh, kh, vh = (seq_to_heads(t, group, stats) for t in (q, k, v))  # (B, H/N, T, D) each
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)  # (B, H/N, T, D): whole sequence, my heads
    return heads_to_seq(out, group, stats)  # (B, H, T/N, D)


def ulysses_bytes_per_rank(seq_len: int, world: int, hidden: int, dtype_bytes: int = 2, batch: int = 1) -> dict:
    """Bytes one rank sends per layer: forward 4·(N−1)/N²·B·T·h·bytes (q, k, v, out), backward the same (Jacobs et al. 2023 §3.2)."""
    for name, x in (("seq_len", seq_len), ("world", world), ("hidden", hidden), ("dtype_bytes", dtype_bytes),
                    ("batch", batch)):
        positive_int(name, x)
    one = (world - 1) / world * batch * (seq_len / world) * hidden * dtype_bytes  # one tensor's all-to-all
    return {"forward": 4 * one, "backward": 4 * one, "per_all_to_all": one}


def choose_cp(world: int, kv_heads: int, ranks_per_node: int) -> dict:
    """Ulysses × ring degrees for `world` context-parallel ranks (USP, Fang & Zhao 2024): all-to-all where it fits.

    Ulysses needs whole (K/V) heads per rank and an all-to-all, which wants the fast links inside a node;
    so its degree is the largest divisor of `world` that divides kv_heads and fits in a node, and the ring
    takes the rest (its P2P messages tolerate slower links and any head count). Degree 1 means unused.
    """
    for name, v in (("world", world), ("kv_heads", kv_heads), ("ranks_per_node", ranks_per_node)):
        positive_int(name, v)
    u = max(d for d in range(1, world + 1) if world % d == 0 and kv_heads % d == 0 and d <= ranks_per_node)
    kind = "ulysses" if u == world else "ring" if u == 1 else "ulysses × ring"
    return {"ulysses": u, "ring": world // u, "kind": kind}
