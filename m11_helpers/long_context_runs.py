"""What lesson 12 runs on its ranks: one function per mechanism, each measuring several things in one launch.

    launch(sp_run, num_processes=4)      # sequence parallelism: equality, bytes per collective, activation bytes
    launch(ring_run, num_processes=4)    # ring attention: equality (4 cases), work per rank, bytes, saved bytes;
                                         # Ulysses against the ring on 4 heads, and its head-count limit on 2
    launch(ep_run, num_processes=4)      # expert parallelism: equality, dropped tokens per capacity factor, bytes

Each rank also computes the single-process reference itself (the shapes are tiny) and returns the
largest difference, so a notebook cell receives a few numbers per rank, not tensors. The mechanisms
live in `sequence_parallel`, `context_parallel`, `expert_parallel`; their tests compare them with
`torch.testing.assert_close`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from m11_helpers import expert_parallel as ep
from m11_helpers import sequence_parallel as sp
from m11_helpers import tensor_parallel as tp
from m11_helpers.attention import flash_attention, naive_attention
from m11_helpers.compare import max_diff
from m11_helpers.context_parallel import LAYOUTS, ring_attention, shard_sequence
from m11_helpers.grading.observe import record_comm
from m11_helpers.launch.base import rank_device
from m11_helpers.memory import saved_activation_bytes, track_saved_tensors
from m11_helpers.models import tiny_gpt
from m11_helpers.ulysses import ulysses_attention

__all__ = ["sp_run", "ring_run", "ep_run"]


def sp_run(batch: int = 2, seq_len: int = 32, seed: int = 0) -> dict:
    """Tiny GPT block under TP + SP on this rank's T/t tokens vs the whole block; bytes and saved activations."""
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq_len, 64, generator=g, dtype=torch.float64)  # (B, T, C)
    ref_block = tiny_gpt(seed).blocks[0].double()
    xr = x.clone().requires_grad_()
    ref = ref_block(xr)
    ref.square().sum().backward()
    out = {"rank": r, "single_bytes": saved_activation_bytes(tiny_gpt(seed).blocks[0], x.float().requires_grad_())}
    for name, regather in (("SP", True), ("SP, keep gathered input", False)):
        block = sp.SPBlock(tiny_gpt(seed).blocks[0].double(), regather=regather)
        xl = x.chunk(n, dim=1)[r].clone().requires_grad_()  # (B, T/t, C): this rank's tokens
        sp.COMM.clear()
        y = block(xl)
        y.square().sum().backward()
        sp.sync_sequence_parallel_grads(block)
        out[name] = {"diff_y": max_diff(y, ref.chunk(n, dim=1)[r]), "diff_dx": max_diff(xl.grad, xr.grad.chunk(n, dim=1)[r]),
                     "diff_ln_grad": max_diff(block.ln_1.weight.grad, ref_block.ln_1.weight.grad),
                     "comm": sp.COMM.table(),
                     "bytes": saved_activation_bytes(sp.SPBlock(tiny_gpt(seed).blocks[0], regather=regather),
                                                     x.float().chunk(n, dim=1)[r].clone().requires_grad_())}
    tpb = tp.TPBlock(tiny_gpt(seed).blocks[0].double())
    tp.COMM.clear()
    tpb(x.clone().requires_grad_()).square().sum().backward()
    out["TP"] = {"comm": tp.COMM.table(),  # op -> calls, payload, wire (comm_count)
                 "bytes": saved_activation_bytes(tp.TPBlock(tiny_gpt(seed).blocks[0]), x.float().requires_grad_())}
    return out


def ring_run(batch: int = 1, heads: int = 2, seq_len: int = 64, head_dim: int = 16, seed: int = 0) -> dict:
    """Ring attention, causal and not, contiguous and zigzag: forward/backward vs full attention, work, bytes, memory."""
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    dev = rank_device()  # the ring's messages leave from here: this rank's GPU under NCCL
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=torch.float64).to(dev)
                   for _ in range(4))  # (B, H, T, D) each
    out = {"rank": r}
    for causal in (False, True):
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = naive_attention(*full, causal=causal)
        ref_grads = torch.autograd.grad(ref, full, do)
        for layout in LAYOUTS:
            mine = [shard_sequence(t, r, n, layout).requires_grad_() for t in (q, k, v)]
            stats: dict = {}
            with record_comm() as log:
                o = ring_attention(*mine, causal, layout=layout, stats=stats)
                grads = torch.autograd.grad(o, mine, shard_sequence(do, r, n, layout))
            diffs = [max_diff(o, shard_sequence(ref, r, n, layout))]
            diffs += [max_diff(a, shard_sequence(b, r, n, layout)) for a, b in zip(grads, ref_grads)]
            out[(causal, layout)] = {"max_diff": max(diffs), **stats, "isend_to": log.peers("isend"),
                                     "irecv_from": log.peers("irecv"), "collectives": log.collectives()}
    out["ulysses"] = _ulysses_vs_ring(q.shape, do.dtype, seed)
    try:  # Ulysses gives each rank whole heads: 2 heads cannot spread over 4 ranks
        ulysses_attention(*(shard_sequence(t, r, n) for t in (q, k, v)))
    except ValueError as e:
        out["head_limit"] = str(e)
    qf, kf, vf = (t.float() for t in (q, k, v))
    mine = [shard_sequence(t, r, n, "zigzag").requires_grad_() for t in (qf, kf, vf)]
    with track_saved_tensors() as saved:
        ring_attention(*mine, True, layout="zigzag")
    out["saved_ring"] = saved.bytes
    full = [t.clone().requires_grad_() for t in (qf, kf, vf)]
    out["saved_naive"] = saved_activation_bytes(naive_attention, *full, causal=True)
    out["saved_flash"] = saved_activation_bytes(flash_attention, *full, causal=True)
    return out


def _ulysses_vs_ring(shape, dtype, seed: int) -> dict:
    """Causal Ulysses and ring attention on the same N-head sequence shards: equality (forward, grads) and bytes."""
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed + 2)
    b, _, t, d = shape
    q, k, v, do = (torch.randn(b, n, t, d, generator=g, dtype=dtype).to(rank_device()) for _ in range(4))
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = naive_attention(*full, causal=True)  # (B, N, T, D): N heads, one whole head per rank for Ulysses
    ref_grads = torch.autograd.grad(ref, full, do)
    out = {"heads": q.shape[1]}
    for name, fn in (("ulysses", ulysses_attention), ("ring", ring_attention)):
        mine = [shard_sequence(x, r, n).requires_grad_() for x in (q, k, v)]  # contiguous positions
        stats: dict = {}
        with record_comm() as log:
            o = fn(*mine, causal=True, stats=stats)
            grads = torch.autograd.grad(o, mine, shard_sequence(do, r, n))
        diffs = [max_diff(o, shard_sequence(ref, r, n))] + [max_diff(a, shard_sequence(c, r, n))
                                                             for a, c in zip(grads, ref_grads)]
        out[name] = {"max_diff": max(diffs), **stats, "ops": sorted(set(log.ops()))}
    return out


def ep_run(capacity_factors=(None, 2.0, 1.25, 1.0, 0.5), tokens: int = 64, hidden: int = 32, experts: int = 8,
           top_k: int = 2, seed: int = 0) -> dict:
    """MoE with experts spread over the ranks: equality with the dense layer, drops per capacity factor, bytes."""
    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n * tokens, hidden, generator=g, dtype=torch.float64)  # every rank's tokens, rank-major
    out = {"rank": r, "tokens": tokens, "assignments": tokens * top_k}
    for cf in capacity_factors:
        moe = ep.MoELayer(hidden, experts, top_k, 2 * hidden, capacity_factor=cf, seed=seed, dtype=torch.float64)
        xr = x.clone().requires_grad_()
        y_ref, _ = moe(xr, groups=n)  # one process, every expert, capacity per rank-sized group
        y_ref.square().sum().backward()
        ref_w1 = [e.w1.weight.grad.clone() for e in moe.experts]
        moe.zero_grad()
        layer = ep.ExpertParallelMoE(moe)
        xl = x.chunk(n)[r].clone().requires_grad_()
        ep.COMM.clear()
        y, aux = layer(xl)
        y.square().sum().backward()
        first = r * layer.per_rank
        out[cf] = {"diff_y": max_diff(y, y_ref.chunk(n)[r]), "diff_dx": max_diff(xl.grad, xr.grad.chunk(n)[r]),
                   "diff_expert_grad": max(max_diff(e.w1.weight.grad, ref_w1[first + i]) for i, e in enumerate(layer.local)),
                   "dropped": layer.last_dropped, "aux": aux.item(), "comm": ep.COMM.table()}
    out["expert_params"] = sum(p.numel() for p in moe.experts.parameters())
    return out
