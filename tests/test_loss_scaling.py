"""Lesson 06, loss scaling: the dynamic rule from scratch equals torch.amp.GradScaler, step for step and weight for weight."""

import pytest
import torch
import torch.nn.functional as F

from m11_helpers.data import regression
from m11_helpers.loss_scaling import DynamicLossScaler, overflow_run, scaler_run, update_scale
from m11_helpers.models import mlp


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_update_scale_rule():
    assert update_scale(8.0, 0, True) == (4.0, 0)
    assert update_scale(8.0, 2, False, growth_interval=4) == (8.0, 3)
    assert update_scale(8.0, 3, False, growth_interval=4) == (16.0, 0)
    assert update_scale(8.0, 3, True, growth_interval=4) == (4.0, 0)
    assert update_scale(3e38, 0, False, growth_interval=1) == (3e38, 0)  # never grows to inf
    with pytest.raises(ValueError, match="growth_interval"):
        update_scale(8.0, 0, False, growth_interval=0)
    with pytest.raises(ValueError, match="backoff_factor"):
        update_scale(8.0, 0, False, backoff_factor=1.0)
    with pytest.raises(ValueError, match="growth_factor"):
        update_scale(8.0, 0, False, growth_factor=float("inf"))


def _amp_run(scaler, inject=(3, 12, 13), steps=16):
    model = mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = regression(128).tensors
    scales, stepped = [], []
    for s in range(steps):
        i = torch.arange(s * 16, s * 16 + 16) % 128
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x[i]), y[i])
        opt.zero_grad()
        scaler.scale(loss).backward()
        if s in inject:  # an overflow, as a too-large scale would cause
            model[0].weight.grad[0, 0] = float("inf")
        before = model[0].weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        stepped.append(not torch.equal(before, model[0].weight))
    return scales, stepped, model


def test_dynamic_loss_scaler_matches_gradscaler():
    ref_scales, ref_stepped, ref = _amp_run(torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=4))
    scales, stepped, mine = _amp_run(DynamicLossScaler(init_scale=2.0**16, growth_interval=4))
    assert scales == ref_scales
    assert stepped == ref_stepped and stepped.count(False) == 3  # the injected steps were skipped
    assert 2.0**15 in scales and 2.0**17 in scales  # it both backed off and grew
    for p, q in zip(mine.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_scaler_run_is_the_lesson_comparison():
    ours, m_ours = scaler_run(DynamicLossScaler(init_scale=2.0**16, growth_interval=4))
    ref, m_ref = scaler_run(torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=4))
    assert ours == ref and len(ours) == 24
    assert all(torch.equal(p, q) for p, q in zip(m_ours.parameters(), m_ref.parameters()))
    assert ours[5] == ours[4] / 2  # the injected overflow at step 5 halves the scale


def test_gradscaler_defaults_are_the_course_figures():
    s = torch.amp.GradScaler("cpu")
    assert s.get_scale() == 2.0**16
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (2.0, 0.5, 2000)


def test_a_too_high_scale_overflows_and_backs_off():
    rows = overflow_run(init_scale=2.0**20, steps=10)
    assert rows[0]["skipped"]  # 2^20 × the tiny GPT's gradients overflows fp16 in the backward matmuls
    assert all(r["scale"] == 2 * rows[i + 1]["scale"] for i, r in enumerate(rows[:-1]) if r["skipped"])
    assert all(a["scale"] >= b["scale"] for a, b in zip(rows, rows[1:]))  # 2000 clean steps to grow: not here
    assert not any(r["skipped"] for r in rows[-3:]) and rows[-1]["loss"] < rows[0]["loss"]
    assert not any(r["skipped"] for r in overflow_run(init_scale=2.0**8, steps=2))
