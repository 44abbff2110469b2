"""Lesson 05 — a ZeRO-1 run saved on N ranks and resumed on M: each rank writes its shard, each reads what overlaps.

    save_shards(opt, folder)      # rank r writes shard-<start>-<end>.pt: its slice [start, end) of the flat state
    load_shards(opt, folder)      # on any world size: reads only the files whose range meets this rank's slice
    launch(resume_run, folder, "save", num_processes=4); launch(resume_run, folder, "resume", num_processes=2)

AdamW's state is element-wise (Kingma & Ba 2015, Alg. 1: m, v per element), so a flat vector cut at
N−1 places can be cut again at M−1 others: resharding is copying ranges (what
torch.distributed.checkpoint does for DTensors, and DeepSpeed's universal checkpoint for ZeRO). The
file name carries the range, so a rank finds its files without opening the others.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist

from m11_helpers.collectives import backend_all_gather, backend_reduce_scatter
from m11_helpers.zero_optimizer import ShardedAdamW

__all__ = ["save_shards", "load_shards", "resume_run"]

_NAME = re.compile(r"shard-(\d+)-(\d+)\.pt$")


def save_shards(opt: ShardedAdamW, folder: str | Path) -> Path:
    """Write this rank's `state_dict()` as folder/shard-<start>-<end>.pt (atomically: a temporary file, then rename)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = opt.state_dict()
    path = folder / f"shard-{sd['start']}-{sd['start'] + sd['state']['exp_avg'].numel()}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(sd, tmp)
    tmp.replace(path)  # a crash mid-save leaves the old file or none, never half of one
    return path


def load_shards(opt: ShardedAdamW, folder: str | Path) -> list[Path]:
    """Load the saved shards that overlap this rank's slice into `opt`; returns the files it read."""
    lo = opt.rank * opt.shard_size
    hi = min(lo + opt.shard_size, opt.numel)
    files = []
    for path in sorted(Path(folder).glob("shard-*.pt")):
        a, b = map(int, _NAME.search(path.name).groups())
        if a < hi and lo < b or (lo >= hi and a == b == 0):  # a range that meets mine (an empty slice takes one)
            files.append(path)
    if not files:
        raise ValueError(f"folder {str(folder)!r} holds no shard-*.pt overlapping elements [{lo}, {hi})")
    opt.load_state_dict([torch.load(p, map_location=opt.exp_avg.device) for p in files])
    return files


def resume_run(folder: str, phase: str, steps: int = 2, sizes: tuple[int, ...] = (5, 7, 3), seed: int = 0) -> dict:
    """On each rank (via `launch`): ShardedAdamW beside torch.optim.AdamW(foreach=False), fed the same gradients.

    phase "save": `steps` steps from the seeded start, then each rank saves its shard (rank 0 also the
    model and the reference optimizer's state_dict). phase "resume": load all three (on any world size),
    `steps` more steps. The reference gets the very average ShardedAdamW steps on (the reduce-scatter's
    slices, all-gathered), so any difference is the optimizer's state, not summation order.
    """
    from m11_helpers.launch import rank_device
    from m11_helpers.models import mlp

    if phase not in ("save", "resume"):
        raise ValueError(f"phase must be one of ('save', 'resume'), got {phase!r}")
    rank, n, dev = dist.get_rank(), dist.get_world_size(), rank_device()
    model, ref = mlp(sizes, seed=seed).to(dev), mlp(sizes, seed=seed).to(dev)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=1e-2, foreach=False)
    if phase == "resume":
        saved = torch.load(Path(folder) / "model.pt", map_location=dev)
        for m, key in ((model, "model"), (ref, "model")):
            m.load_state_dict(saved[key])
        ref_opt.load_state_dict(saved["ref_opt"])
    opt = ShardedAdamW(model.parameters(), lr=1e-2)
    read = load_shards(opt, folder) if phase == "resume" else []
    gen = torch.Generator().manual_seed(seed + 1 + (phase == "resume"))
    for _ in range(steps):
        x = torch.randn(4 * n, sizes[0], generator=gen).to(dev).chunk(n)[rank]  # (4, d_in): this rank's rows
        model(x).pow(2).mean().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            q.grad = p.grad.clone()  # the same local gradient; averaged below exactly as opt.step() does
        opt.step()
        opt.zero_grad()
        flat = opt._flat([q.grad for q in ref.parameters()])  # (N·S,)
        mine = flat.new_empty(opt.shard_size)  # (S,)
        backend_reduce_scatter(mine, flat)
        full = flat.new_empty(flat.numel())  # (N·S,)
        backend_all_gather(full, mine.div_(n))
        offset = 0
        for q in ref.parameters():
            q.grad.copy_(full[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
        ref_opt.step()
        ref_opt.zero_grad()
    if phase == "save":
        save_shards(opt, folder)
        if rank == 0:
            torch.save({"model": model.state_dict(), "ref_opt": ref_opt.state_dict()}, Path(folder) / "model.pt")
        dist.barrier()  # every shard on disk before any rank returns
    ref_v = opt._flat([ref_opt.state[q]["exp_avg_sq"] for q in ref.parameters()])  # (N·S,)
    lo = rank * opt.shard_size
    return {"world_size": n, "step": opt.step_count, "read": [p.name for p in read], "state_bytes": opt.state_bytes(),
            "params_equal": all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters())),
            "state_equal": torch.equal(opt.exp_avg_sq, ref_v[lo:lo + opt.shard_size]),
            "max_abs_diff": max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))}
