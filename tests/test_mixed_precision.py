"""Lesson 06 helpers: number formats, underflow, the dynamic loss scaler, autocast, the 16P budget."""

import math

import pytest
import torch
import torch.nn.functional as F

from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.data import regression, tokens
from m11_helpers.mixed_precision import (
    DynamicLossScaler,
    activation_grads,
    autocast_dtype_table,
    autocast_op_table,
    bits,
    bytes_per_param,
    cast_fractions,
    finfo_table,
    format_limits,
    round_trip,
    saved_activation_bytes,
    training_memory_gb,
    update_scale,
)
from m11_helpers.models import mlp, tiny_gpt


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# --- formats (IEEE 754-2019 §3; Micikevicius et al. 2018 §2 quote fp16's 65504 and 2^-24) ---------------------

def test_format_limits_match_ieee_and_torch_finfo():
    fp16 = format_limits(5, 10)
    assert fp16["max"] == 65504.0 and fp16["min_normal"] == 2.0**-14 and fp16["min_subnormal"] == 2.0**-24
    assert fp16["eps"] == 2.0**-10
    bf16 = format_limits(8, 7)
    assert bf16["eps"] == 2.0**-7 and bf16["min_normal"] == torch.finfo(torch.float32).smallest_normal
    for dt, (e, m) in [(torch.float32, (8, 23)), (torch.float16, (5, 10)), (torch.bfloat16, (8, 7)),
                       (torch.float8_e5m2, (5, 2))]:
        fi, lim = torch.finfo(dt), format_limits(e, m)
        assert (lim["max"], lim["min_normal"], lim["eps"]) == (fi.max, fi.smallest_normal, fi.eps)


def test_finfo_table_rows():
    rows = {r["format"]: r for r in finfo_table()}
    assert rows["fp16"]["bits"] == "1/5/10" and rows["bf16"]["bits"] == "1/8/7"
    assert rows["fp16"]["min_subnormal"] == 2.0**-24
    assert rows["fp8_e4m3"]["max"] == 448.0  # the "fn" variant: no inf, so the top exponent holds numbers


def test_bits_known_patterns():
    assert bits(1.0, torch.float32) == "0 01111111 " + "0" * 23
    assert bits(-2.0, torch.float16) == "1 10000 0000000000"
    assert bits(65504.0, torch.float16) == "0 11110 1111111111"
    assert bits(0.1, torch.bfloat16) == "0 01111011 1001101"
    assert bits(2.0**-24, torch.float16) == "0 00000 0000000001"  # the smallest subnormal
    with pytest.raises(ValueError, match="dtype"):
        bits(1.0, torch.float64)


def test_round_trip_and_master_weight_update_vanishes():
    assert round_trip(1 + 1e-3, torch.bfloat16)["stored"] == 1.0  # 1e-3 < half of bf16's spacing 2^-7 at 1.0
    assert round_trip(1 + 1e-3, torch.float32)["stored"] != 1.0
    r = round_trip(0.1, torch.float16)
    assert r["rel_error"] <= 2.0**-11  # round to nearest: at most half an ulp
    assert (torch.tensor(1.0, dtype=torch.bfloat16) + 1e-3).item() == 1.0


# --- underflow --------------------------------------------------------------------------------------------------

def test_cast_fractions():
    v = torch.tensor([1e-9, 1e-6, 1e-3, 1.0, 1e5, 0.0])
    f = cast_fractions(v, torch.float16)
    assert f == {"zero": 1 / 5, "subnormal": 1 / 5, "overflow": 1 / 5}
    f = cast_fractions(v, torch.float16, scale=2.0**10)  # 1e-9 -> 1e-6 (subnormal), 1e-6 -> 1e-3 (normal)
    assert f["zero"] == 0 and f["subnormal"] == 1 / 5 and f["overflow"] == 1 / 5
    assert cast_fractions(v, torch.bfloat16) == {"zero": 0.0, "subnormal": 0.0, "overflow": 0.0}
    with pytest.raises(ValueError, match="scale"):
        cast_fractions(v, torch.float16, scale=0.0)


def test_tiny_gpt_activation_grads_underflow_in_fp16_not_bf16():
    x, y = tokens(16).tensors
    g = activation_grads(tiny_gpt(0), x[:8], y[:8])
    assert g.dtype == torch.float32 and g.numel() > 10_000
    fp16 = cast_fractions(g, torch.float16)
    assert fp16["zero"] > 0.001 and fp16["subnormal"] > 0.3  # most activation grads sit below 2^-14
    scaled = cast_fractions(g, torch.float16, scale=2.0**8)
    assert scaled["zero"] < fp16["zero"] / 2 and scaled["subnormal"] < fp16["subnormal"] / 5
    assert cast_fractions(g, torch.float16, scale=2.0**24)["overflow"] > 0  # too large a scale overflows
    assert cast_fractions(g, torch.bfloat16)["zero"] == 0.0


# --- dynamic loss scaling: from scratch == torch.amp.GradScaler("cpu") -------------------------------------------

def test_update_scale_rule():
    assert update_scale(8.0, 0, True) == (4.0, 0)
    assert update_scale(8.0, 2, False, growth_interval=4) == (8.0, 3)
    assert update_scale(8.0, 3, False, growth_interval=4) == (16.0, 0)
    assert update_scale(8.0, 3, True, growth_interval=4) == (4.0, 0)
    assert update_scale(3e38, 0, False, growth_interval=1) == (3e38, 0)  # never grows to inf
    with pytest.raises(ValueError, match="growth_interval"):
        update_scale(8.0, 0, False, growth_interval=0)


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


def test_gradscaler_defaults_are_the_course_figures():
    s = torch.amp.GradScaler("cpu")
    assert s.get_scale() == 2.0**16
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (2.0, 0.5, 2000)


# --- autocast -----------------------------------------------------------------------------------------------------

def test_autocast_tables_on_cpu():
    x, _ = tokens(4).tensors
    rows = {r["module"]: r for r in autocast_dtype_table(tiny_gpt(0), x)}
    assert rows["blocks.0.attn.qkv"]["out"] == "bfloat16" and rows["blocks.0.mlp.fc"]["out"] == "bfloat16"
    assert rows["wte"]["out"] == "float32" and rows["ln_f"]["out"] == "float32"
    assert rows["(model)"]["out"] == "bfloat16"  # the logits come out of the head's matmul
    ops = autocast_op_table()
    assert ops["matmul"] == ("bfloat16", "bfloat16") and ops["cross_entropy"] == ("float32", "float32")
    assert ops["softmax"] == ("float32", "bfloat16")  # CPU autocast passes softmax through (CUDA casts it up)


# --- memory --------------------------------------------------------------------------------------------------------

def test_bytes_per_param_is_zero_16P():
    assert bytes_per_param()["total"] == 16  # ZeRO §3.1: 2Ψ + 2Ψ + 12Ψ
    assert bytes_per_param("fp32")["total"] == 16  # mixed precision does not shrink the optimizer budget
    assert bytes_per_param("pure bf16 (no master)")["total"] == 8
    gb = training_memory_gb(param_count(RUNNING_EXAMPLE))
    assert math.isclose(gb["total"], 6_738_415_616 * 16 / 1e9)
    with pytest.raises(ValueError, match="setup"):
        bytes_per_param("fp8")


def test_saved_activations_shrink_under_autocast():
    x, y = tokens(8).tensors
    m = tiny_gpt(0)
    fp32 = saved_activation_bytes(m, x, y)
    bf16 = saved_activation_bytes(m, x, y, autocast_dtype=torch.bfloat16)
    assert "bfloat16" not in fp32.by_dtype and bf16.by_dtype["bfloat16"] > 0
    assert 0.5 <= bf16.total / fp32.total < 0.8  # not 0.5: norms and the residual stream stay fp32
