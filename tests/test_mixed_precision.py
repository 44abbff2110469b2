"""Lesson 06: number formats, underflow, autocast, the two 16-byte layouts measured, master weights, activations, speed."""

import pytest
import torch

from m11_helpers.activations import activation_bytes, activation_ratio
from m11_helpers.autocast_ops import autocast_dtype_table, autocast_op_table
from m11_helpers.config import TINY_GPT, param_count
from m11_helpers.data import tokens
from m11_helpers.held_memory import autocast_weight_copy_bytes, held_state_bytes
from m11_helpers.master_weights import MODES, MasterWeightsAdamW, precision_run
from m11_helpers.memory import track_saved_tensors
from m11_helpers.model_states import bytes_per_param
from m11_helpers.models import mlp, tiny_gpt
from m11_helpers.number_formats import (
    activation_grads,
    bits,
    cast_fractions,
    finfo_table,
    format_limits,
    log2_window,
    round_trip,
)
from m11_helpers.precision_speed import cpu_16bit_support, speed_cases


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
    with pytest.raises(ValueError, match="exp_bits"):
        format_limits(1, 3)


def test_finfo_table_rows_and_log2_window():
    rows = {r["format"]: r for r in finfo_table()}
    assert rows["fp16"]["bits"] == "1/5/10" and rows["bf16"]["bits"] == "1/8/7"
    assert rows["fp16"]["min subnormal"] == 2.0**-24
    assert rows["fp8_e4m3"]["max"] == 448.0  # the "fn" variant: no inf, so the top exponent holds numbers
    lo_sub, lo, hi = log2_window(torch.float16)
    assert (lo_sub, lo) == (-24.0, -14.0) and 15.99 < hi < 16.0


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
    assert 0.002 < fp16["zero"] < 0.05 and 0.3 < fp16["subnormal"] < 0.7  # the lesson's bounded claims
    scaled = cast_fractions(g, torch.float16, scale=2.0**8)
    assert scaled["zero"] < fp16["zero"] / 2 and scaled["subnormal"] < fp16["subnormal"] / 5
    assert cast_fractions(g, torch.float16, scale=2.0**24)["overflow"] > 0  # too large a scale overflows
    assert cast_fractions(g, torch.bfloat16)["zero"] == 0.0


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


# --- memory: the layouts of model_states, measured on real training steps ---------------------------------------

def _one_step(layout):
    x, y = tokens(4).tensors
    m = tiny_gpt(0)
    if layout in ("deepspeed", "pure-bf16"):
        m = m.to(torch.bfloat16)
    opt = MasterWeightsAdamW(m.parameters()) if layout == "deepspeed" else torch.optim.AdamW(m.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=layout == "autocast"):
        loss = m(x, y)
    loss.backward()
    opt.step()
    return m, opt


@pytest.mark.parametrize("layout", ["fp32", "autocast", "deepspeed", "pure-bf16"])
def test_held_bytes_per_param_equal_model_states(layout):
    m, opt = _one_step(layout)
    psi = param_count(TINY_GPT)
    held = held_state_bytes(m, opt)
    assert {k: held[k] / psi for k in ("weights", "grads", "master", "optimizer", "total")} == bytes_per_param(layout)
    n_tensors = len(list(m.parameters()))
    assert held["other"] == 4 * n_tensors  # AdamW's step counter: one fp32 scalar per parameter tensor


def test_master_weights_adamw_equals_fp32_adamw_on_the_master_and_keeps_small_updates():
    model = mlp(seed=0).to(torch.bfloat16)
    ref_master = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    ref = torch.optim.AdamW(ref_master, lr=1e-5, weight_decay=0.0)
    opt = MasterWeightsAdamW(model.parameters(), lr=1e-5)  # updates of ~1e-5, under half a bf16 step of most weights
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)  # (8, 16)
    start = [p.detach().clone() for p in model.parameters()]
    for _ in range(5):
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        for r, p in zip(ref_master, model.parameters()):
            r.grad = p.grad.float()
        ref.step()
        opt.step()
    for r, mm, p in zip(ref_master, opt.master, model.parameters()):
        assert torch.equal(mm, r.detach()) and torch.equal(p, r.detach().to(torch.bfloat16))
    moved_master = sum((mm != s.float()).sum().item() for mm, s in zip(opt.master, start))
    moved_model = sum((p != s).sum().item() for p, s in zip(model.parameters(), start))
    total = sum(p.numel() for p in model.parameters())
    assert moved_master > total / 2 and moved_model < moved_master / 2  # most updates live in the master only


def test_precision_run_pure_bf16_stalls_and_master_copies_track_fp32():
    runs = {m: precision_run(m, steps=40, lr=3e-4) for m in MODES}
    fp32 = runs["fp32"]["loss"][-1][1]
    for mode in ("autocast", "deepspeed"):
        assert abs(runs[mode]["loss"][-1][1] - fp32) < 0.02 * fp32 and runs[mode]["unchanged"] < 0.05
    assert runs["pure-bf16"]["unchanged"] > 0.3 and runs["pure-bf16"]["loss"][-1][1] > 1.05 * fp32
    with pytest.raises(ValueError, match="mode"):
        precision_run("fp8")


# --- activations: autocast's ratio, measured == activations.activation_bytes ---------------------------------------

@pytest.mark.parametrize("batch", [1, 16])
def test_autocast_activations_and_weight_copies_measured_equal_the_model(batch):
    x, y = (t.clone() for t in tokens(batch).tensors)  # own storage: a slice would count the whole batch's ids
    m = tiny_gpt(0)
    saved = {}
    for ac in (False, True):
        with track_saved_tensors(m) as t, torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
            m(x, y)
        saved[ac] = t.bytes
    want16 = activation_bytes(TINY_GPT, batch, flash=True, autocast=True)
    assert saved[False] == activation_bytes(TINY_GPT, batch, flash=True, dtype_bytes=4)["total"]
    assert saved[True] == want16["total"]
    assert autocast_weight_copy_bytes(m, x, y) == want16["weight_copies"]
    assert saved[True] / saved[False] == pytest.approx(activation_ratio(TINY_GPT, batch, flash=True))
    assert (saved[True] > saved[False]) == (batch == 1)  # at batch 1 the weight copies outweigh the savings


def test_speed_cases_run_and_cpu_support_is_described():
    assert cpu_16bit_support().startswith("vector ISA ")
    cases = speed_cases("cpu", matmul_size=32)
    assert len(cases) == 2 and all(set(c) == {"fp32", "bf16", "fp16"} for c in cases.values())
    for fns in cases.values():
        for fn in fns.values():
            fn()
