"""checkpointing.py: policies give the same gradients, the measured memory behaves, the formulas match the paper."""

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from m11_helpers.activation_checkpointing import (
    activation_bytes_per_layer,
    chen_memory,
    choose_policy,
    gpt_forward,
    model_activation_bytes,
    peak_activation_bytes,
    segment_bounds,
    sqrt_segments,
)
from m11_helpers.config import GPT3_175B, TINY_GPT
from m11_helpers.data import tokens
from m11_helpers.models import tiny_gpt

X, Y = tokens(4, seed=0).tensors  # (4, 32)


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny kernels gain nothing from more threads, and on shared busy cores OpenMP threads spin-wait on
    # each other (measured: a 16-block step 0.5 s on 1 thread, 5 s on 2 under load).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _grads(model, **kw):
    model.zero_grad(set_to_none=True)
    loss = gpt_forward(model, X, Y, **kw)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
@pytest.mark.parametrize("policy,segments", [("blocks", None), ("segments", 3), ("sqrt", None), ("attention", None)])
def test_policies_give_the_reference_loss_and_gradients(attention, policy, segments):
    model = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=5), attention)
    assert_close(gpt_forward(model, X, Y), model(X, Y))
    ref_loss, ref = _grads(model)
    loss, got = _grads(model, policy=policy, segments=segments)
    assert_close(loss, ref_loss)
    assert_close(got, ref)


def test_checkpointing_keeps_less_and_depth_scaling():
    def measure(layers, policy):
        m = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=layers))
        return peak_activation_bytes(m, X, Y, policy=policy)

    none4, none8 = measure(4, "none"), measure(8, "none")
    per_block = (none8["retained"] - none4["retained"]) / 4
    assert none8["retained"] == none4["retained"] + 4 * per_block  # exactly linear in depth
    blocks4, blocks8 = measure(4, "blocks"), measure(8, "blocks")
    assert blocks4["retained"] < none4["retained"] / 5
    assert blocks8["recompute"] == blocks4["recompute"]  # one block at a time
    boundary = X.numel() * TINY_GPT.hidden * 4  # one (B, T, C) fp32 block input
    assert blocks8["retained"] - blocks4["retained"] == 4 * boundary


def test_selective_removes_only_the_score_matrices():
    m = tiny_gpt(0, attention="naive")
    none = peak_activation_bytes(m, X, Y, policy="none")
    sel = peak_activation_bytes(m, X, Y, policy="attention")
    saved = none["retained"] - sel["retained"]
    s2 = X.shape[0] * TINY_GPT.heads * TINY_GPT.seq_len ** 2 * 4  # one (B, a, s, s) fp32 tensor
    assert s2 <= saved <= 4 * TINY_GPT.layers * s2


def test_korthikanti_gpt3_example():
    # §4.2: for GPT-3, 5as/h = 80 against 34, so selective recomputation saves 80/114 = 70 %.
    s, h, a = 2048, 12288, 96
    none = activation_bytes_per_layer(s, 1, h, a)
    assert none == s * h * (34 + 5 * a * s // h)
    assert 5 * a * s // h == 80
    sel = activation_bytes_per_layer(s, 1, h, a, recompute="selective")
    assert sel == 34 * s * h
    assert 1 - sel / none == pytest.approx(0.70, abs=0.005)
    assert activation_bytes_per_layer(s, 1, h, a, recompute="full") == 2 * s * h
    assert activation_bytes_per_layer(s, 1, h, a, flash_attention=True) == sel
    assert model_activation_bytes(GPT3_175B, 1, dropout=True) == 96 * none


def test_generalised_terms():
    # fp32 without dropout: 16 values of sbh (5 attn + 9 MLP + 2 norms) + as²b softmax output.
    s, b, h, a = 32, 4, 64, 4
    got = activation_bytes_per_layer(s, b, h, a, bytes_per_value=4, dropout=False)
    assert got == 4 * (16 * s * b * h + a * s * s * b)
    with pytest.raises(ValueError, match="recompute"):
        activation_bytes_per_layer(s, b, h, a, recompute="some")
    with pytest.raises(ValueError, match="hidden"):
        activation_bytes_per_layer(s, b, 0, a)


def test_segments_and_chen():
    assert sqrt_segments(16) == 4 and sqrt_segments(1) == 1
    assert segment_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError, match="segments"):
        segment_bounds(4, 5)
    # equal boundary and block cost: √L segments minimise k + L/k (Chen et al. 2016, §3)
    costs = {k: chen_memory(16, k, 1.0, 1.0) for k in range(1, 17)}
    assert min(costs, key=costs.get) == 4


def test_choose_policy():
    rows = [{"policy": "none", "peak": 100, "seconds": 1.0}, {"policy": "blocks", "peak": 30, "seconds": 1.3},
            {"policy": "sqrt", "peak": 50, "seconds": 1.3}]
    assert choose_policy(rows, 120)["policy"] == "none"
    assert choose_policy(rows, 60)["policy"] == "blocks"  # tie on time: less memory
    assert choose_policy(rows, 10) is None
    with pytest.raises(ValueError, match="budget_bytes"):
        choose_policy(rows, 0)
