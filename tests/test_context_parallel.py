"""Ring attention's layouts, work and byte formulas, and bad input. On 4 real ranks against full attention (forward
and backward, causal and not, both layouts): tests/test_long_context_runs.py, in the lesson's own ring run."""

import pytest
import torch

from m11_helpers.context_parallel import (
    LAYOUTS,
    chunk_ids,
    critical_path_tiles,
    ring_attention,
    ring_bytes_per_rank,
    score_tiles,
    shard_sequence,
    unshard_sequence,
)


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    # measured per rank on 4 real ranks in test_long_context_runs (ring_run's score_entries)
    assert score_tiles(4, "contiguous") == [4, 8, 12, 16]  # rank r: r + 1 blocks of (T/N)²
    assert score_tiles(4, "zigzag") == [9, 9, 9, 9]  # 2N + 1 sub-blocks on every rank
    assert score_tiles(4, "zigzag", causal=False) == [16] * 4
    # the ring waits for the busiest rank at every step: N whole blocks vs 2N + 1 quarter blocks
    assert [critical_path_tiles(n, "contiguous") for n in (2, 4, 8)] == [8, 16, 32]
    assert [critical_path_tiles(n, "zigzag") for n in (2, 4, 8)] == [5, 9, 17]
    assert critical_path_tiles(4, "zigzag", causal=False) == 16


def test_layouts_round_trip_and_zigzag_pairs_chunks():
    x = torch.arange(24).view(1, 24, 1)
    for layout in LAYOUTS:
        shards = [shard_sequence(x, r, 3, layout, dim=1) for r in range(3)]
        assert torch.equal(unshard_sequence(shards, layout, dim=1), x)
    assert [chunk_ids(r, 4, "zigzag") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert shard_sequence(x, 0, 3, "zigzag", dim=1).flatten().tolist() == [0, 1, 2, 3, 20, 21, 22, 23]


def test_bad_input():
    with pytest.raises(ValueError, match="layout"):
        chunk_ids(0, 2, "striped")
    with pytest.raises(ValueError, match="rank"):
        chunk_ids(2, 2)
    with pytest.raises(ValueError, match="divisible"):
        shard_sequence(torch.zeros(1, 1, 10, 2), 0, 4, "zigzag")
    with pytest.raises(ValueError, match="q, k, v"):
        ring_attention(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 3), torch.zeros(1, 1, 4, 2))
    with pytest.raises(ValueError, match="world"):
        ring_bytes_per_rank(1024, 0, 64)
