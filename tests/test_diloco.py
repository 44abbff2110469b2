"""DiLoCo (lesson 10): the outer step is Nesterov SGD on θ − mean θ_i; 4 real ranks against one process and data parallel."""

import math

import pytest
import torch

from m11_helpers.diloco import compare_rank, diloco_round_end, outer_step, simulate_diloco
from m11_helpers.launch import launch


def _tensors(seed, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 5, generator=g) for _ in range(n)]


def test_outer_step_is_torch_nesterov_sgd_on_the_pseudo_gradient_and_the_wrong_sign_is_caught():
    outer, buf = _tensors(0), [torch.zeros(4, 5) for _ in range(3)]
    params = [torch.nn.Parameter(o.clone()) for o in outer]
    sgd = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    for r in range(3):
        inner = [o - 0.1 * d for o, d in zip(outer, _tensors(10 + r))]
        outer, buf = outer_step(outer, inner, buf, lr=0.7, momentum=0.9)
        for p, i in zip(params, inner):
            p.grad = p.detach() - i  # the pseudo-gradient as torch's optimiser sees it
        sgd.step()
        for o, p in zip(outer, params):
            torch.testing.assert_close(o, p.detach())
    # lr 1 without momentum is plain averaging: the new outer parameters are the workers' mean
    avg = _tensors(3)
    for a, b in zip(outer_step(_tensors(2), avg, [torch.zeros(4, 5)] * 3, 1.0, 0.0)[0], avg):
        torch.testing.assert_close(a, b)
    # the wrong sign (θ_i − θ) walks away from where the workers went: 2θ − mean θ_i
    wrong, _ = outer_step(avg, _tensors(2), [torch.zeros(4, 5)] * 3, 1.0, 0.0)
    assert not torch.allclose(wrong[0], avg[0])
    with pytest.raises(ValueError, match="momentum"):
        outer_step(outer, outer, buf, momentum=1.5)


def test_forgetting_to_reset_the_inner_parameters_is_caught_by_the_one_process_reference():
    ref = simulate_diloco(world=2, steps=4, h=2, batch=2)

    def no_reset(model, outer, buf, inner_avg, lr, momentum):
        return outer_step(outer, inner_avg, buf, lr, momentum)  # the outer step, but workers keep their θ_i

    def wrong_sign(model, outer, buf, inner_avg, lr, momentum):
        return diloco_round_end(model, outer, buf, [2 * o - i for o, i in zip(outer, inner_avg)], lr, momentum)

    for wrong in (no_reset, wrong_sign):
        assert not torch.allclose(simulate_diloco(world=2, steps=4, h=2, batch=2, round_end=wrong), ref, atol=1e-4)


def test_diloco_on_four_ranks_matches_one_process_and_sends_h_times_less_than_data_parallel():
    ranks = launch(compare_rank, steps=8, hs=(4,), batch=2, num_processes=4, timeout=300)
    dp, dl = [r[0] for r in ranks], [r[1] for r in ranks]
    assert dp[0]["method"] == "data parallel" and dl[0]["method"] == "diloco"
    assert dp[0]["bytes"] == 4 * dl[0]["bytes"] > 0  # one parameter all-reduce per 4 steps vs a gradient one per step
    assert dp[0]["calls"] == 4 * dl[0]["calls"] and dl[0]["wire"] == dl[0]["bytes"] * 2 * 3 / 4  # a ring: 2(N−1)/N
    assert all(torch.equal(r["params"], dl[0]["params"]) for r in dl)  # every worker leaves a round on one θ
    assert all(torch.equal(r["params"], dp[0]["params"]) for r in dp)
    torch.testing.assert_close(dl[0]["params"], simulate_diloco(world=4, steps=8, h=4, batch=2), atol=1e-4, rtol=1e-4)
    for run in (dp[0], dl[0]):  # both learn: below the uniform guess ln(64) on held-out rows
        assert run["eval_loss"] < math.log(64) - 0.2, run["eval_loss"]
