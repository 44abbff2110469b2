"""Ulysses' head limit and the ring / all-to-all / both rule. On 4 real ranks (equal to full attention, forward and
gradients; bytes against the ring): tests/test_long_context_runs.py, in the lesson's own ring run."""

import pytest

from m11_helpers.ulysses import check_heads, choose_cp


def test_head_limit():
    check_heads(8, 4)
    with pytest.raises(ValueError, match="heads"):
        check_heads(6, 4)


def test_choose_ring_all_to_all_or_both():
    assert choose_cp(4, 8, 8) == {"ulysses": 4, "ring": 1, "kind": "ulysses"}  # fits in a node, enough heads
    assert choose_cp(16, 8, 8) == {"ulysses": 8, "ring": 2, "kind": "ulysses × ring"}  # USP: a2a in node, ring across
    assert choose_cp(16, 1, 8)["kind"] == "ring"  # multi-query attention: one K/V head, no all-to-all
    assert choose_cp(32, 8, 4) == {"ulysses": 4, "ring": 8, "kind": "ulysses × ring"}
    with pytest.raises(ValueError, match="kv_heads"):
        choose_cp(4, 0, 8)
