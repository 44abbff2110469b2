"""FSDP2 on a CPU mesh: Ψ/N per rank measured, gradients equal DDP's, 2Ψ vs 3Ψ counted, one block at a time
measured (live_memory); Accelerate's CPU fallback. (Ψ/4 on 4 ranks: tests/test_fsdp2_knobs.py's launch.)"""

import pytest
import torch

from m11_helpers.config import TINY_GPT, param_count
from m11_helpers.fsdp import TrafficCounter, accelerate_fsdp_probe, fsdp_memory_report, fsdp_step_report, is_sharded
from m11_helpers.launch import launch
from m11_helpers.live_memory import track_live_bytes
from m11_helpers.models import mlp

PSI = param_count(TINY_GPT)


def _both_modes_and_memory():  # one launch for the traffic and the memory tests (each launch costs seconds)
    return [fsdp_step_report(True), fsdp_step_report(False), fsdp_memory_report()]


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_both_modes_and_memory, num_processes=2, show_output=False)


def test_fully_shard_on_2_processes_shards_and_counts_traffic(two_ranks):
    for zero3, zero2, _ in two_ranks:
        for r in (zero3, zero2):
            assert r["num_params"] == PSI and r["local_params"] == PSI // 2  # Ψ/N exactly
            assert r["max_grad_diff_vs_ddp"] <= 1e-6
            assert r["reduce_scatter"] == PSI
        assert zero3["all_gather"] == 2 * PSI  # forward + backward: 3Ψ with the reduce-scatter
        assert zero2["all_gather"] == PSI  # kept after forward: 2Ψ


def test_accelerate_fsdp_on_cpu_falls_back_to_ddp():
    out = launch(accelerate_fsdp_probe, num_processes=2, show_output=False)
    for r in out:
        assert r["distributed_type"].endswith("MULTI_CPU")
        assert r["wrapper"] == "DistributedDataParallel" and not r["sharded"]
        assert r["local_params"] == sum(p.numel() for p in mlp().parameters())


def test_plain_module_is_not_sharded_and_counter_refuses_it():
    m = mlp()
    assert not is_sharded(m)
    with pytest.raises(ValueError, match="fully_shard"):
        TrafficCounter().attach(m)


def test_accelerate_launch_refuses_use_fsdp_with_cpu(tmp_path):
    # `accelerate launch`'s own entry point, in this process: the refusal comes before any process starts, so a
    # subprocess (another torch import, ~30 s on a loaded 2-core machine) proves nothing more
    from accelerate.commands.launch import launch_command, launch_command_parser

    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    args = launch_command_parser().parse_args(["--use_fsdp", "--cpu", "--num_processes", "2", str(script)])
    with pytest.raises(ValueError, match="only use one of `--cpu`"):
        launch_command(args)


def test_live_bytes_follow_storages_not_tensors():
    weights = [torch.randn(64, 64) for _ in range(4)]  # (64, 64) each: 16 KiB, made before the block
    layer = 64 * 64 * 4

    def forward(keep):
        x, kept = torch.randn(2, 64), []  # (2, 64)
        for w in weights:
            full = w.clone()  # a "gathered" copy: 16 KiB the block allocates
            x = x @ full.t()  # (2, 64)
            if keep:
                kept.append(full)
            del full
        return x, kept

    for keep in (False, True):
        with track_live_bytes() as mem:
            x, kept = forward(keep)
            mem.phase("after")
            del kept
            mem.phase("freed")
        held = (4 if keep else 1) * layer  # one gathered copy at a time, or all four
        assert held < mem.peaks["start"] <= held + 2 * x.numel() * 4  # + the old and the new x, at most
        assert mem.peaks["after"] == (4 * layer if keep else 0) + x.numel() * 4
        assert mem.peaks["freed"] == x.numel() * 4
    with track_live_bytes() as mem:  # views of tensors made before the block cost nothing
        for w in weights:
            w.t()[:, 0].view(-1)[:10].sum()  # view ops only; the sum allocates 4 bytes
        buf = torch.empty(0)  # a storage resized inside the block counts by its growth
        buf.resize_(1000)
    assert mem.now() == mem.peak == 4 * 1000  # the views cost nothing, each 4-byte sum died at once


def test_fsdp2_frees_each_block_after_its_forward_unless_told_not_to(two_ranks):
    for *_, r in two_ranks:
        block, base = r["block_bytes"], r["unsharded"]["after forward"]
        kept = {case: (r[f"reshard_after_forward={case}"]["after forward"] - base) / block for case in (True, False)}
        assert round(kept[True]) == 0  # ZeRO-3: nothing gathered outlives its block's forward
        assert round(kept[False]) == TINY_GPT.layers  # every block stays gathered until backward
        assert r["reshard_after_forward=True"]["forward peak"] < r["reshard_after_forward=False"]["forward peak"]
