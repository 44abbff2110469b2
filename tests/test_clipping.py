"""Lesson 06 helpers: global-norm clipping (== clip_grad_norm_, and sharded on real ranks), NaN hunter."""

import math

import pytest
import torch

from m11_helpers.clipping import clip_grad_norm_global_, global_grad_norm, loss_spike_run
from m11_helpers.data import tokens
from m11_helpers.launch import launch
from m11_helpers.models import tiny_gpt
from m11_helpers.nan_hunter import find_first_nonfinite, nonfinite_grads


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _model_with_grads(seed=0):
    x, y = tokens(8).tensors
    m = tiny_gpt(seed)
    (m(x, y) * 50).backward()  # large enough that max_norm=1 clips
    return m


@pytest.mark.parametrize("max_norm", [0.05, 1.0, 1e6])
def test_clip_equals_torch(max_norm):
    a, b = _model_with_grads(), _model_with_grads()
    mine = clip_grad_norm_global_(a.parameters(), max_norm)
    ref = torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm)
    torch.testing.assert_close(mine, ref)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_global_norm_is_norm_of_concatenation_and_clip_keeps_direction():
    m = _model_with_grads()
    flat = torch.cat([p.grad.flatten() for p in m.parameters()])
    torch.testing.assert_close(global_grad_norm(m.parameters()), flat.norm(), rtol=1e-5, atol=0)
    clip_grad_norm_global_(m.parameters(), 1.0)
    after = torch.cat([p.grad.flatten() for p in m.parameters()])
    assert math.isclose(after.norm().item(), 1.0, rel_tol=1e-4)
    torch.testing.assert_close(after / after.norm(), flat / flat.norm())
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_global_(m.parameters(), 0.0)


def _sharded(rank, world):

    from m11_helpers.clipping import sharded_grad_norm

    m = _model_with_grads()
    params = [p for i, p in enumerate(m.parameters()) if i % world == rank]  # this rank's shard
    return sharded_grad_norm(params).item()


def test_sharded_norm_on_real_ranks_equals_single_process():
    ref = global_grad_norm(_model_with_grads().parameters()).item()
    results = launch(lambda: _sharded(torch.distributed.get_rank(), torch.distributed.get_world_size()),
                     num_processes=2, timeout=120, show_output=False)
    assert len(results) == 2 and results[0] == results[1]
    torch.testing.assert_close(torch.tensor(results[0]), torch.tensor(ref))


def test_loss_spike_is_tamed_by_clipping():
    raw, clipped = loss_spike_run(None, steps=30), loss_spike_run(1.0, steps=30)
    assert raw["loss"][:20] == clipped["loss"][:20] or max(clipped["grad_norm"][:20]) > 1.0
    assert max(raw["loss"][20:]) > 3 * raw["loss"][19]  # the bad batch makes a spike without clipping
    assert max(clipped["loss"][20:]) < 1.5 * clipped["loss"][19]
    with pytest.raises(ValueError, match="bad_step"):
        loss_spike_run(steps=10, bad_step=10)


def test_nan_hunter_names_the_module():
    x, _ = tokens(4).tensors
    m = tiny_gpt(0)
    assert find_first_nonfinite(m, x) is None
    with torch.no_grad():
        m.blocks[2].attn.qkv.weight[0, 0] = float("nan")
    hit = find_first_nonfinite(m, x)
    assert hit.module == "blocks.2.attn.qkv" and hit.inputs_finite and hit.kind == "nan"
    m2 = tiny_gpt(0)
    with torch.no_grad():
        m2.blocks[1].mlp.fc.weight.mul_(1e6)  # activations beyond fp16's 65504
    with torch.autocast("cpu", dtype=torch.float16):
        hit = find_first_nonfinite(m2, x)
    assert hit is not None and hit.module.startswith("blocks.1.mlp")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert find_first_nonfinite(m2, x) is None  # bf16 has fp32's range


def test_nonfinite_grads():
    m = _model_with_grads()
    assert nonfinite_grads(m) == []
    m.blocks[0].ln_1.weight.grad[0] = float("inf")
    assert nonfinite_grads(m) == ["blocks.0.ln_1.weight"]
