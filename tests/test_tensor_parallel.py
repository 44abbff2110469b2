"""Tensor-parallel layers on real gloo processes against the unsharded layer."""

import copy

import pytest
import torch

from m11_helpers.launch import launch
from m11_helpers.models import tiny_gpt
from m11_helpers.tensor_parallel import (
    COMM,
    ColumnParallelLinear,
    RowParallelLinear,
    TPBlock,
    all_reduces_per_layer,
    count_collectives,
    parallelize_mlp,
)
from m11_helpers.tensor_parallel_run import allreduce_busbw, lesson_runs


def _check_on_ranks():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    out = {}
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)  # (B, in)
    col = ColumnParallelLinear.from_linear(lin, r, w)
    out["col"] = (col(x).detach(), lin(x)[:, r * 8 // w:(r + 1) * 8 // w].detach())
    row = RowParallelLinear.from_linear(lin, r, w)
    out["row"] = (row(x[:, r * 16 // w:(r + 1) * 16 // w]).detach(), lin(x).detach())
    block = tiny_gpt(0).blocks[0]
    h = torch.randn(2, 8, 64, requires_grad=True)  # (B, T, C)
    ref = block(h)
    ref.square().sum().backward()
    ref_grad = h.grad.clone()
    h.grad = None
    tp = TPBlock(copy.deepcopy(block), r, w)
    COMM.clear()
    y = tp(h)
    forward_calls = COMM.calls("all_reduce")
    y.square().sum().backward()
    out["block"] = (y.detach(), ref.detach())
    out["block_dx"] = (h.grad, ref_grad)
    n = 256 // w
    out["fc_grad"] = (tp.mlp.fc.weight.grad, block.mlp.fc.weight.grad[r * n:(r + 1) * n])
    out["ln_grad"] = (tp.ln_1.weight.grad, block.ln_1.weight.grad)
    out["calls"] = (forward_calls, COMM.calls("all_reduce"))
    mesh = init_device_mesh("cpu", (w,))
    dmlp = parallelize_mlp(copy.deepcopy(block.mlp), mesh)
    z = torch.randn(2, 8, 64, requires_grad=True)
    counts = count_collectives(lambda: dmlp(z).sum().backward())
    yd = dmlp(z)
    yd = yd.full_tensor() if isinstance(yd, DTensor) else yd
    yd = yd.wait() if hasattr(yd, "wait") else yd  # RowwiseParallel may return an AsyncCollectiveTensor
    out["dtensor"] = (yd.detach(), block.mlp(z).detach())
    out["dtensor_counts"] = counts
    out["dtensor_weight"] = type(dmlp.fc.weight).__name__
    return out


@pytest.fixture(scope="module")
def ranks():
    return launch(_check_on_ranks, num_processes=2, timeout=120)


@pytest.mark.parametrize("key", ["col", "row", "block", "block_dx", "fc_grad", "ln_grad", "dtensor"])
def test_tp_equals_unsharded(ranks, key):
    for res in ranks:
        got, expected = res[key]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_two_all_reduces_forward_two_backward(ranks):
    assert all(res["calls"] == (2, 4) for res in ranks)
    assert all(res["dtensor_counts"] == {"all_reduce": 2} for res in ranks)  # g forward, f backward
    assert all(res["dtensor_weight"] == "DTensor" for res in ranks)


def test_comm_formulas():
    c = all_reduces_per_layer(batch=1, seq_len=4096, hidden=4096)
    assert c["forward"] == 2 and c["backward"] == 2 and c["bytes_each"] == 4096 * 4096 * 2
    with pytest.raises(ValueError, match="hidden"):
        all_reduces_per_layer(1, 1, 0)


def test_bad_split_names_parameter():
    with pytest.raises(ValueError, match="out_features"):
        ColumnParallelLinear.from_linear(torch.nn.Linear(4, 3), 0, 2)
    with pytest.raises(ValueError, match="rank"):
        RowParallelLinear.from_linear(torch.nn.Linear(4, 4), 2, 2)


@pytest.fixture(scope="module")
def lesson_ranks():
    return launch(lesson_runs, num_processes=2, timeout=120, device="cpu")


def test_lesson_demo_equals_unsharded_and_counts_collectives(lesson_ranks):
    for res in lesson_ranks:
        d = res["demo"]
        assert max(d["max_diff"], d["dx_diff"], d["fc_grad_diff"], d["dtensor_diff"]) < 1e-5
        assert (d["forward"], d["backward"]) == (2, 2)  # per block: attention's g and f, the MLP's g and f
        assert d["weight_shape"] == (128, 64) and d["full_shape"] == (256, 64)
        assert d["dtensor_counts"] == {"all_reduce": 2} and d["dtensor_weight"].startswith("DTensor")


def test_column_parallel_output_is_gathered_not_reduced(lesson_ranks):
    # The claim "a column-parallel split is followed by an all-reduce" is wrong: an all-gather rebuilds the output,
    # and before a row-parallel layer nothing is needed (its one all-reduce sums partial products).
    for res in lesson_ranks:
        c = res["column"]
        assert c["local_shape"] == (4, 128) and c["full_shape"] == (4, 256)
        assert not c["allreduce_equals_slice"] and c["allgather_equals_full"] and c["row_output_equals_mlp"]
        assert c["all_reduces_col_to_row"] == 1


def test_allreduce_busbw_reports_a_bandwidth(lesson_ranks):
    dev, gbs = lesson_ranks[0]["busbw"]
    assert dev == "cpu" and gbs > 0
    with pytest.raises(ValueError, match="megabytes"):
        allreduce_busbw(0)
