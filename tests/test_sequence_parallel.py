"""Megatron sequence parallelism on 4 real gloo ranks against the unsharded block: outputs, gradients, bytes, memory."""

import pytest
import torch
import torch.distributed as dist

from m11_helpers import sequence_parallel as sp
from m11_helpers import tensor_parallel as tp
from m11_helpers.grading.observe import record_comm
from m11_helpers.launch import LaunchError, launch, rank_device
from m11_helpers.memory import saved_activation_bytes
from m11_helpers.models import tiny_gpt
from m11_helpers.sequence_parallel import (
    SPBlock,
    gather_sequence,
    ring_bytes,
    scatter_sequence,
    sync_sequence_parallel_grads,
)

B, T, C = 2, 32, 64


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, T, C, generator=g, dtype=torch.float64), torch.randn(B, T, C, generator=g, dtype=torch.float64)


def _on_ranks():
    r, n = dist.get_rank(), dist.get_world_size()
    x, w = (t.to(rank_device()) for t in _data())  # the rank's data on its device (NCCL: its GPU)
    out = {}
    for regather in (True, False):
        block = SPBlock(tiny_gpt(0).blocks[0].double(), regather=regather)
        xl = x.chunk(n, dim=1)[r].clone().requires_grad_()  # (B, T/t, C)
        sp.COMM.clear()
        with record_comm() as log:
            y = block(xl)
            (y * w.chunk(n, dim=1)[r]).sum().backward()
        sync_sequence_parallel_grads(block)
        out[regather] = {"y": y.detach(), "dx": xl.grad, "grads": {k: p.grad for k, p in block.named_parameters()},
                         "comm": sp.COMM.table(), "ops": log.ops(),
                         "acts": saved_activation_bytes(block, xl.detach().requires_grad_())}
    tpb = tp.TPBlock(tiny_gpt(0).blocks[0].double())
    tp.COMM.clear()
    (tpb(x.clone().requires_grad_()) * w).sum().backward()
    out["tp"] = {"comm": tp.COMM.table(), "acts": saved_activation_bytes(tpb, x.clone().requires_grad_())}
    z = torch.arange(float(B * T * C), device=x.device).view(B, T, C) * (r + 1)  # g and ḡ on their own
    out["g"] = gather_sequence(z.chunk(n, dim=1)[r])
    out["gbar"] = scatter_sequence(z)
    return out


@pytest.fixture(scope="module")
def results():
    return launch(_on_ranks, num_processes=4, timeout=120, show_output=False)


@pytest.fixture(scope="module")
def reference():
    block = tiny_gpt(0).blocks[0].double()
    x, w = _data()
    x.requires_grad_()
    y = block(x)
    (y * w).sum().backward()
    return block, y.detach(), x.grad, saved_activation_bytes(block, x.detach().requires_grad_())


@pytest.mark.parametrize("regather", [True, False])
def test_sp_block_equals_the_unsharded_block(results, reference, regather):
    block, y, dx, _ = reference
    got = [r[regather] for r in results]
    torch.testing.assert_close(torch.cat([g["y"] for g in got], dim=1), y)
    torch.testing.assert_close(torch.cat([g["dx"] for g in got], dim=1), dx)
    for g in got:  # replicated parameters: partial on each rank until synced, then the full gradient
        torch.testing.assert_close(g["grads"]["ln_1.weight"], block.ln_1.weight.grad)
        torch.testing.assert_close(g["grads"]["ln_2.bias"], block.ln_2.bias.grad)
        torch.testing.assert_close(g["grads"]["proj.bias"], block.mlp.proj.bias.grad)
        torch.testing.assert_close(g["grads"]["attn_proj.bias"], block.attn.proj.bias.grad)
    torch.testing.assert_close(torch.cat([g["grads"]["fc.weight"] for g in got]), block.mlp.fc.weight.grad)
    torch.testing.assert_close(torch.cat([g["grads"]["proj.weight"] for g in got], dim=1), block.mlp.proj.weight.grad)


def test_g_and_gbar_are_all_gather_and_reduce_scatter(results):
    z = torch.arange(float(B * T * C)).view(B, T, C)
    for r, out in enumerate(results):
        torch.testing.assert_close(out["g"], torch.cat([c * (i + 1) for i, c in enumerate(z.chunk(4, dim=1))], dim=1))
        torch.testing.assert_close(out["gbar"], z.chunk(4, dim=1)[r] * 10)  # 1 + 2 + 3 + 4


def test_bytes_equal_plain_tp_and_regather_adds_one_all_gather_per_column_linear(results):
    full = B * T * C * 8
    tp_comm = results[0]["tp"]["comm"]["all_reduce"]
    tp_bytes = ring_bytes("all_reduce", full, 4) * tp_comm["calls"]
    assert tp_comm["calls"] == 4 and tp_comm["payload"] == 4 * full and tp_comm["wire"] == tp_bytes  # 2 fwd + 2 bwd
    keep = results[0][False]["comm"]
    assert keep["all_gather"]["calls"] == keep["reduce_scatter"]["calls"] == 4
    assert keep["all_gather"]["wire"] + keep["reduce_scatter"]["wire"] == tp_bytes
    assert keep["all_gather"]["payload"] == 4 * full / 4 and keep["all_gather"]["elements"] == 4 * full / 8  # shard; S
    again = results[0][True]["comm"]
    assert again["all_gather"]["calls"] == 6 and again["reduce_scatter"]["calls"] == 4
    assert again["all_gather"]["wire"] - keep["all_gather"]["wire"] == 2 * ring_bytes("all_gather", full, 4)
    assert results[0][False]["ops"] == ["all_gather_single", "reduce_scatter_single"] * 4
    assert "all_reduce" not in results[0][True]["ops"]


def test_activation_bytes_per_rank_are_the_unsharded_ones_divided_by_t(results, reference):
    single = reference[3]
    for r in results:
        assert r[True]["acts"] == single // 4  # every saved tensor is a 1/t slice: exactly ÷ t
        assert r[True]["acts"] < r[False]["acts"] < r["tp"]["acts"] < single


def test_ring_bytes_and_bad_input():
    assert ring_bytes("all_reduce", 1000, 4) == 2 * ring_bytes("all_gather", 1000, 4) == 1500
    with pytest.raises(LaunchError, match="ValueError: the sequence length"):
        launch(lambda: sp.scatter_sequence(torch.zeros(1, 6, 2)), num_processes=4, show_output=False)
