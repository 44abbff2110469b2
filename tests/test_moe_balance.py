"""Expert balancing on one router and one data stream: none vs auxiliary loss vs DeepSeek-V3's bias; dropless vs capacity.

The bias-balanced layer under expert parallelism on 4 real ranks: tests/test_expert_parallel.py (its launch).
"""

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
    dropless = compare_balancing(steps=20, capacity_factor=None)  # the lesson runs the 40-step comparison
    assert last(dropless["aux_free"]) < last(dropless["aux"]) < last(dropless["none"])
    assert last(dropless["aux_free"]) < 2 < last(dropless["none"])
    assert all(sum(r["dropped"]) == 0 for r in dropless.values())  # dropless: every assignment computed
    capped = compare_balancing(steps=20, capacity_factor=1.25)
    assert sum(capped["aux_free"]["dropped"]) < sum(capped["none"]["dropped"])  # balance is what keeps tokens
    assert sum(capped["none"]["dropped"]) > 0
    with pytest.raises(ValueError, match="gamma"):
        compare_balancing(gamma=0)
