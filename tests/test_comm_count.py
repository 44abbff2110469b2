"""The kit's one communication counter and its one reference difference: pure functions, no ranks (cheap)."""

from __future__ import annotations

import pytest
import torch

from m11_helpers.comm_count import CommCounter
from m11_helpers.compare import max_diff


def test_counter_keeps_payload_and_wire_apart_per_op_until_cleared():
    c = CommCounter()
    c.add("all_reduce", 1000, 1500, 250)  # 4 ranks: wire 2(N−1)/N·S
    c.add("all_reduce", 1000, 1500, 250)
    c.add("all_gather", 400, 300)  # S gathered, (N−1)/N·S sent
    assert (c.calls("all_reduce"), c.payload("all_reduce"), c.wire("all_reduce"), c.elements()) == (2, 2000, 3000, 500)
    assert (c.calls(), c.payload(), c.wire(), c.calls("broadcast")) == (3, 2400, 3300, 0)
    assert c.table()["all_gather"] == {"calls": 1, "payload": 400, "wire": 300, "elements": 0}
    with pytest.raises(ValueError, match="payload"):
        c.add("all_reduce", -1, 0)
    c.clear()
    assert c.table() == {} and c.calls() == 0


def test_max_diff_of_tensors_sequences_and_dicts_and_what_it_refuses():
    a = torch.zeros(3, 2)
    b = a.clone()
    b[2, 1] = -0.5
    assert max_diff(a, b) == 0.5 and max_diff(a, a) == 0.0 and max_diff(torch.empty(0), torch.empty(0)) == 0.0
    assert max_diff([a, a], [a, b]) == 0.5 and max_diff({"w": b}, {"w": a}) == 0.5 and max_diff([], []) == 0.0
    w = torch.ones(2, requires_grad=True)
    assert max_diff(w * 2, torch.ones(2)) == 1.0  # detached: a tensor that needs grad is fine
    with pytest.raises(ValueError, match="same shape"):
        max_diff(a, a[:1])  # broadcasting would compare one row with all three
    with pytest.raises(ValueError, match="as many tensors"):
        max_diff([a], [a, a])
    with pytest.raises(ValueError, match="same keys"):
        max_diff({"w": a}, {"v": a})
