"""Async vs sync DCP checkpoints: what each costs the training loop, and the Young interval it implies.

    python benchmarks/async_checkpoint.py [--ranks 2] [--hidden 64] [--steps 20] [--every 5] [--repeats 3]

On `--ranks` real gloo processes, one FSDP2 GPT (the tiny GPT's shape, `--hidden` wide) trains
`--steps` steps three ways, interleaved round by round in one run: no checkpoints; a `Checkpointer`
saving every `--every` steps synchronously (`dcp.save`: training waits for every file and the
metadata); and the same asynchronously (`dcp.async_save`: training waits while the state is copied
to CPU memory, then a background thread writes the files). Timed with `timing.time_it`, medians of
`--repeats` rounds: each way's total, and the time training spent inside `save` (and the last
`wait`). δ, the cost of one checkpoint to training, is that blocked time per save; the table also
shows the whole slowdown per save (total − no-checkpoint total), which adds the background writer's
competition for the same cores. The script prints δ_async / δ_sync, then Young's interval
τ = √(2δM) (`cloud.young_interval`) for each δ, with M = the mean time between unexpected
interruptions Llama 3 reported (Dubey et al. 2024, §3.3.4: 419 in a 54-day snapshot, M ≈ 3.1 h).

On a CPU-only box the background writer competes with the ranks for the same cores, so async saves
less than on a GPU node, where the GPUs compute while host CPUs write. The figures are this machine's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from m11_helpers.cloud import young_interval
from m11_helpers.config import TINY_GPT, param_count
from m11_helpers.display import show_table
from m11_helpers.launch import launch
from m11_helpers.meta_init import materialize
from m11_helpers.models import TinyGPT
from m11_helpers.sharded_checkpoint import Checkpointer
from m11_helpers.timing import time_it

LLAMA3_MTBF_S = 54 * 24 * 3600 / 419  # Dubey et al. 2024, §3.3.4: unexpected interruptions in 54 days


def measure(hidden: int, steps: int, every: int, repeats: int) -> dict:
    """On each rank: per way (none / sync / async), the seconds of `steps` steps and of the time spent inside
    `Checkpointer.save` + the final `wait` (what training waits for), over `repeats` interleaved rounds."""
    cfg = dataclasses.replace(TINY_GPT, hidden=hidden, ffn_hidden=4 * hidden, heads=max(1, hidden // 16))
    with torch.device("meta"):
        model = TinyGPT(cfg)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, "cpu", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    # m11: cpu-only - this benchmark measures checkpointing a CPU model (materialized on "cpu" above)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=torch.Generator().manual_seed(dist.get_rank()))
    box = [tempfile.mkdtemp(prefix="m11-bench-ckpt-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)  # one folder for every rank: DCP writes one checkpoint together
    checkpointers = {"sync": Checkpointer(f"{box[0]}/sync", keep=1, async_save=False),
                     "async": Checkpointer(f"{box[0]}/async", keep=1, async_save=True)}
    blocked = {"none": [], "sync": [], "async": []}

    def train(mode: str) -> None:
        waited = 0.0
        for step in range(steps):
            model(x, x).backward()  # (4, T) tokens, their own targets: the work, not the task, matters here
            opt.step()
            opt.zero_grad(set_to_none=True)
            if mode != "none" and step % every == 0:
                waited += time_it(lambda: checkpointers[mode].save(step, model, opt), repeats=1, warmup=0).median
        if mode != "none":  # the last save must land too
            waited += time_it(checkpointers[mode].wait, repeats=1, warmup=0).median
        dist.barrier()
        blocked[mode].append(waited)

    totals = {"none": [], "sync": [], "async": []}
    for r in range(repeats + 1):  # interleaved, so a load change on a shared machine hits every way alike
        for mode in totals:
            seconds = time_it(lambda: train(mode), repeats=1, warmup=0).median
            if r:  # round 0 warms up (lazy init, first DCP plans)
                totals[mode].append(seconds)
            else:
                blocked[mode].clear()
    return {"total": {m: statistics.median(t) for m, t in totals.items()},
            "blocked": {m: statistics.median(b) for m, b in blocked.items()}, "params": param_count(cfg)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64, help="model width (64: the tiny GPT)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    r = launch(measure, a.hidden, a.steps, a.every, a.repeats, num_processes=a.ranks, timeout=1200,
               show_output=False)[0]
    total, blocked, saves = r["total"], r["blocked"], len(range(0, a.steps, a.every))
    step = total["none"] / a.steps
    print(f"FSDP2 GPT, {r['params']:,} parameters ({12 * r['params'] / 1e6:.1f} MB of fp32 weights + AdamW "
          f"state), {a.ranks} gloo ranks, {a.steps} steps, a checkpoint every {a.every}: medians of {a.repeats}")
    rows = [[m, total[m], total[m] / total["none"], blocked[m] / saves if m != "none" else 0.0,
             (total[m] - total["none"]) / saves if m != "none" else 0.0] for m in total]
    show_table(rows, ["checkpoints", "seconds", "× no checkpoints", "δ blocked per save (s)",
                      "δ slowdown per save (s)"], floatfmt=".3f")
    delta = {m: blocked[m] / saves for m in ("sync", "async")}
    print(f"δ_async / δ_sync (time training waits per checkpoint) = {delta['async'] / delta['sync']:.2f}")
    for m in ("sync", "async"):
        tau = young_interval(delta[m], LLAMA3_MTBF_S)
        print(f"Young interval with δ_{m} = {delta[m]:.3f} s and M = {LLAMA3_MTBF_S / 3600:.1f} h (Llama 3): "
              f"τ = √(2δM) = {tau:.0f} s = {tau / step:,.0f} steps of {1e3 * step:.0f} ms")


if __name__ == "__main__":
    main()
