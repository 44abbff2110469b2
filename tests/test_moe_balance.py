"""Expert balancing on one router and one data stream: none vs auxiliary loss vs DeepSeek-V3's bias; dropless vs capacity."""

import statistics

import pytest
import torch

from m11_helpers.moe_balance import biased_route, compare_balancing, imbalance


def test_bias_steers_the_choice_not_the_gate():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    r = biased_route(logits, torch.tensor([0.0, 0.0, 1.0, 0.0]), top_k=2, capacity=None)
    probs = logits.softmax(-1)
    assert sorted(r.experts[0].tolist()) == [0, 2]  # the bias pulled expert 2 into the top 2
    torch.testing.assert_close(r.gates[0], probs[0, r.experts[0]] / probs[0, r.experts[0]].sum())  # raw affinities
    assert imbalance(torch.tensor([[0, 1], [2, 3]]), 4) == 1.0 and imbalance(torch.tensor([[0, 0]]), 2) == 2.0


def test_balancing_methods_and_dropping():
    last = lambda r: statistics.mean(r["imbalance"][-10:])  # noqa: E731
    dropless = compare_balancing(capacity_factor=None)
    assert last(dropless["aux_free"]) < last(dropless["aux"]) < last(dropless["none"])
    assert last(dropless["aux_free"]) < 2 < last(dropless["none"])
    assert all(sum(r["dropped"]) == 0 for r in dropless.values())  # dropless: every assignment computed
    capped = compare_balancing(capacity_factor=1.25)
    assert sum(capped["aux_free"]["dropped"]) < sum(capped["none"]["dropped"])  # balance is what keeps tokens
    assert sum(capped["none"]["dropped"]) > 0
    with pytest.raises(ValueError, match="gamma"):
        compare_balancing(gamma=0)


def _ep_rank(capacity_factor):
    import torch.distributed as dist

    from m11_helpers.expert_parallel import ExpertParallelMoE
    from m11_helpers.moe_balance import BiasedMoELayer, update_bias

    rank, n = dist.get_rank(), dist.get_world_size()
    x, t = _tokens()
    moe = BiasedMoELayer(16, 8, 2, capacity_factor=capacity_factor, seed=0)
    ep = ExpertParallelMoE(moe)
    for step in range(2):  # step 0 sets the bias from the global load; step 1 routes with it
        moe.zero_grad()
        y, _ = ep(x[rank::n])
        torch.nn.functional.mse_loss(y, t[rank::n]).backward()
        update_bias(moe.bias, moe.routing(x[rank::n]).experts, gamma=0.05)
    dist.all_reduce(moe.router.weight.grad)  # the router is replicated: its gradient is a sum over ranks
    return {"y": y.detach(), "bias": moe.bias.clone(), "router": moe.router.weight.grad,
            "experts": {i: [p.grad for p in ep.local[i - rank * ep.per_rank].parameters()]
                        for i in range(rank * ep.per_rank, (rank + 1) * ep.per_rank)}}


def _tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randn(32, 16, generator=g) + 2.0 * torch.randn(16, generator=g), torch.randn(32, 16, generator=g)


def test_bias_balanced_moe_expert_parallel_equals_one_process(cf=None):
    from m11_helpers.launch import launch
    from m11_helpers.moe_balance import BiasedMoELayer, moe_step

    results = launch(_ep_rank, cf, num_processes=4, timeout=60, stall_timeout=8)
    x, t = _tokens()
    moe = BiasedMoELayer(16, 8, 2, capacity_factor=cf, seed=0)
    chunks = [x[r::4] for r in range(4)]
    for step in range(2):
        moe.zero_grad()
        outs = [moe_step(moe, c, moe.bias, None)[0] for c in chunks]
        sum(torch.nn.functional.mse_loss(o, t[r::4]) for r, o in enumerate(outs)).backward()
        chosen = torch.cat([moe.routing(c).experts for c in chunks])
        load = torch.bincount(chosen.reshape(-1), minlength=8).float()
        moe.bias += 0.05 * torch.sign(load.mean() - load)
    assert moe.bias.abs().sum() > 0  # the bias really moved the routing
    for r, res in enumerate(results):
        torch.testing.assert_close(res["y"], outs[r].detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(res["bias"], moe.bias)  # every rank holds the same bias: global load
        torch.testing.assert_close(res["router"], moe.router.weight.grad, atol=1e-6, rtol=1e-5)
        for i, grads in res["experts"].items():
            for got, want in zip(grads, [p.grad for p in moe.experts[i].parameters()]):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
