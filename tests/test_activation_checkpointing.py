"""Lesson 08: checkpointing policies give the reference gradients, and what they keep is measured and modelled exactly.

Two exact measurements agree (autograd's saved-tensor hooks and the live tensors of `live_memory`); the
kit's activation model (`m11_helpers.activations`) gives the tiny GPT's bytes for each recompute policy
byte for byte; the partial-checkpointing formula of exercise 8.1 predicts the measured peaks.
"""

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from m11_helpers.activation_checkpointing import (
    checkpointed_blocks,
    chen_memory,
    fewest_checkpointed,
    gpt_forward,
    partial_peak,
    segment_bounds,
    sqrt_segments,
)
from m11_helpers.activation_costs import choose_policy, measure_policies, measure_step, step_flops
from m11_helpers.activations import activation_bytes
from m11_helpers.config import TINY_GPT
from m11_helpers.data import tokens
from m11_helpers.live_memory import warm_up
from m11_helpers.memory import saved_activation_bytes
from m11_helpers.models import tiny_gpt
from m11_helpers.selective_checkpointing import ALL_MATMULS, sac_context, save_ops_policy

X, Y = tokens(4, seed=0).tensors  # (4, 32)
B, T, C, H = X.shape[0], TINY_GPT.seq_len, TINY_GPT.hidden, TINY_GPT.heads


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny kernels gain nothing from more threads, and on shared busy cores OpenMP threads spin-wait on
    # each other (measured: a 16-block step 0.5 s on 1 thread, 5 s on 2 under load).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    warm_up()
    yield
    torch.set_num_threads(before)


def _fwd(**kw):
    return lambda m, i, t: gpt_forward(m, i, t, **kw)


def _grads(model, **kw):
    model.zero_grad(set_to_none=True)
    loss = gpt_forward(model, X, Y, **kw)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
@pytest.mark.parametrize("kw", [dict(policy="blocks"), dict(policy="segments", segments=3), dict(policy="sqrt"),
                                dict(policy="attention"), dict(policy="first", checkpointed=2),
                                dict(policy="last", checkpointed=2), dict(policy="blocks", context_fn=sac_context())],
                         ids=["blocks", "segments3", "sqrt", "attention", "first2", "last2", "sac"])
def test_policies_give_the_reference_loss_and_gradients(attention, kw):
    model = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=5), attention)
    assert_close(gpt_forward(model, X, Y), model(X, Y))
    ref_loss, ref = _grads(model)
    loss, got = _grads(model, **kw)
    assert_close(loss, ref_loss)
    assert_close(got, ref)


def test_plans_and_bad_arguments():
    assert checkpointed_blocks(5, "first", checkpointed=2) == [(0, 1, True), (1, 2, True), (2, 5, False)]
    assert checkpointed_blocks(5, "last", checkpointed=2) == [(0, 3, False), (3, 4, True), (4, 5, True)]
    assert checkpointed_blocks(4, "sqrt") == [(0, 2, True), (2, 4, True)]
    assert checkpointed_blocks(3, "none") == [(0, 3, False)]
    with pytest.raises(ValueError, match="checkpointed"):
        checkpointed_blocks(4, "first")
    with pytest.raises(ValueError, match="segments"):
        checkpointed_blocks(4, "segments")
    with pytest.raises(ValueError, match="policy"):
        checkpointed_blocks(4, "everything")


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_live_bytes_equal_saved_tensors_and_the_kit_model(attention):
    # three ways to the same byte count: live tensors after forward, autograd's saved-tensor hooks, and
    # m11_helpers.activations (fp32, flash = SDPA); the naive attention's masked_fill also keeps its (s, s) bool mask
    cfg = dataclasses.replace(TINY_GPT, layers=3)
    model = tiny_gpt(0, cfg, attention)
    for policy, recompute in (("none", "none"), ("blocks", "full"), ("attention", "selective")):
        live = measure_step(model, _fwd(policy=policy), X, Y)["retained"]
        saved = saved_activation_bytes(lambda: gpt_forward(model, X, Y, policy=policy), exclude=[model])
        want = activation_bytes(cfg, B, dtype_bytes=4, flash=attention == "sdpa", recompute=recompute)["total"]
        mask = cfg.layers * T * T if (attention, policy) == ("naive", "none") else 0
        assert live == saved == want + mask, policy


def test_depth_scaling_and_partial_checkpointing_measured():
    # naive attention, 4 blocks; b = one (B, T, C) fp32 block input, B_ = what an un-checkpointed block keeps
    def rows(layers, plans):
        m = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=layers), attention="naive")
        return {r["policy"]: r for r in measure_policies(m, X, Y, {k: _fwd(**kw) for k, kw in plans.items()})}

    L = 4
    r = rows(L, {"none": {}, "blocks": dict(policy="blocks"), "first2": dict(policy="first", checkpointed=2),
                 "last2": dict(policy="last", checkpointed=2), "first3": dict(policy="first", checkpointed=3)})
    b = B * T * C * 4
    block = b + (r["none"]["retained"] - r["blocks"]["retained"]) / L
    outside = r["blocks"]["retained"] - L * b
    grad_temps = r["none"]["transient"]  # gradients of the logits and the like: every plan has them
    for name, n, first in (("first2", 2, True), ("last2", 2, False), ("first3", 3, True), ("blocks", 4, True)):
        assert r[name]["retained"] == outside + n * b + (L - n) * block
        predicted = outside + partial_peak(L, n, b, block, first=first) + grad_temps
        assert abs(r[name]["peak"] - predicted) <= 1024, name  # a few hundred bytes of small temporaries
    assert r["last2"]["peak"] - r["first2"]["peak"] == pytest.approx(block - b, abs=1024)
    assert abs(r["first3"]["peak"] - r["blocks"]["peak"]) <= 1024  # checkpointing the last block buys nothing
    r8 = rows(8, {"none": {}, "blocks": dict(policy="blocks")})
    assert r8["none"]["retained"] - r["none"]["retained"] == 4 * block  # exactly linear in depth
    assert r8["blocks"]["transient"] == r["blocks"]["transient"]  # one block rebuilt at a time


def test_pytorch_selective_checkpointing_measured():
    # "save matmuls" keeps the Linear outputs; keeping the batched matmuls too keeps the attention's two bmm
    # outputs per layer, the (B, nh, T, T) scores among them; the linear-only policy recomputes exactly those bmms
    cfg = dataclasses.replace(TINY_GPT, layers=2)
    m = tiny_gpt(0, cfg, attention="naive")
    plans = {"none": _fwd(), "selective": _fwd(policy="attention"),
             "sac": _fwd(policy="blocks", context_fn=sac_context()),
             "sac_bmm": _fwd(policy="blocks", context_fn=sac_context(save_ops_policy(ALL_MATMULS)))}
    r = {row["policy"]: row for row in measure_policies(m, X, Y, plans, flops=True)}
    scores, av = B * H * T * T * 4, B * H * T * (C // H) * 4
    assert r["sac_bmm"]["retained"] - r["sac"]["retained"] == cfg.layers * (scores + av)
    assert r["sac"]["retained"] < r["selective"]["retained"] < r["none"]["retained"]
    bmm_flops = 2 * (2 * B * H * T * T * (C // H))  # q·kᵀ and softmax·v, per layer
    assert r["sac"]["flops"] - r["none"]["flops"] == cfg.layers * bmm_flops
    assert r["sac_bmm"]["flops"] == r["none"]["flops"]  # nothing recomputed that the counter sees
    # SAC's cache is invisible to saved-tensor hooks: the live measurement is the one that sees it
    hooks_only = saved_activation_bytes(lambda: plans["sac"](m, X, Y), exclude=[m])
    assert hooks_only < r["sac"]["retained"]


def test_step_flops_full_recompute_is_one_forward_of_the_blocks_but_the_last_matmul():
    # non-reentrant checkpoint stops recomputing once every tensor backward needs is rebuilt ("early stop",
    # torch.utils.checkpoint.set_checkpoint_early_stop): a block's last Linear output is needed by nothing
    m = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=2))
    none, blocks = step_flops(m, _fwd(), X, Y), step_flops(m, _fwd(policy="blocks"), X, Y)
    f = TINY_GPT.ffn_hidden
    linear = {"qkv": 3 * C * C, "proj": C * C, "fc": C * f, "mlp proj": f * C}  # weights of each Linear
    forward_flops = {k: 2 * B * T * w for k, w in linear.items()}  # 2·tokens·weights; SDPA on CPU is not counted
    assert blocks - none == 2 * (sum(forward_flops.values()) - forward_flops["mlp proj"])
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        assert step_flops(m, _fwd(policy="blocks"), X, Y) - none == 2 * sum(forward_flops.values())


def test_partial_peak_and_fewest_checkpointed():
    assert partial_peak(8, 0, 1, 10) == 80
    assert partial_peak(8, 3, 1, 10) == 3 + 50 and partial_peak(8, 3, 1, 10, first=False) == 53 + 9
    assert partial_peak(8, 8, 1, 10) == partial_peak(8, 7, 1, 10) == 17  # the last block: no saving
    assert fewest_checkpointed(8, 1, 10, 80) == 0
    assert fewest_checkpointed(8, 1, 10, 53) == 3 and fewest_checkpointed(8, 1, 10, 52) == 4
    assert fewest_checkpointed(8, 1, 10, 17) == 7 and fewest_checkpointed(8, 1, 10, 16.9) is None
    with pytest.raises(ValueError, match="checkpointed"):
        partial_peak(4, 5, 1, 1)
    with pytest.raises(ValueError, match="budget_bytes"):
        fewest_checkpointed(4, 1, 1, -1)


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
