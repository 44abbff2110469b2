"""Ring attention on 4 real gloo ranks against full attention on one process: forward and backward, causal and not."""

import pytest
import torch
import torch.distributed as dist

from m11_helpers.attention import naive_attention
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
from m11_helpers.grading.observe import record_comm
from m11_helpers.launch import launch, rank_device

SHAPE = (2, 3, 32, 8)  # (B, H, T, D)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*SHAPE, generator=g, dtype=torch.float64) for _ in range(4)]  # q, k, v, dout


def _on_ranks():
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, do = (t.to(rank_device()) for t in _inputs())  # the rank's data on its device (NCCL: its GPU)
    res = {}
    for causal in (False, True):
        for layout in LAYOUTS:
            qs, ks, vs = (shard_sequence(t, r, n, layout).requires_grad_() for t in (q, k, v))
            stats = {}
            with record_comm() as log:
                out = ring_attention(qs, ks, vs, causal, layout=layout, stats=stats)
                out.backward(shard_sequence(do, r, n, layout))
            res[(causal, layout)] = {"grads": (out.detach(), qs.grad, ks.grad, vs.grad), "stats": stats,
                                     "isend_to": log.peers("isend"), "irecv_from": log.peers("irecv"),
                                     "collectives": log.collectives()}
    return res


@pytest.fixture(scope="module")
def ring_results():
    return launch(_on_ranks, num_processes=4, timeout=120, show_output=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_attention_forward_and_backward_equal_full_attention(ring_results, causal, layout):
    q, k, v, do = (t.clone() for t in _inputs())
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = naive_attention(q, k, v, causal=causal)
    expected = [out.detach(), *torch.autograd.grad(out, (q, k, v), do)]
    for i, name in enumerate(["out", "dq", "dk", "dv"]):
        got = unshard_sequence([r[(causal, layout)]["grads"][i] for r in ring_results], layout)
        torch.testing.assert_close(got, expected[i], msg=lambda m, name=name: f"{name}: {m}")


def test_only_point_to_point_messages_to_the_neighbours(ring_results):
    for rank, r in enumerate(ring_results):
        for case in r.values():
            assert case["isend_to"] == {(rank + 1) % 4} and case["irecv_from"] == {(rank - 1) % 4}
            assert case["collectives"] == set()


def test_bytes_sent_match_the_formula(ring_results):
    B, H, T, D = SHAPE
    want = ring_bytes_per_rank(T, 4, H * D, dtype_bytes=8, batch=B)
    for r in ring_results:
        for case in r.values():
            assert case["stats"]["bytes_sent"] == want["forward"]
            assert case["stats"]["bytes_sent_backward"] == want["backward"]


def test_zigzag_balances_causal_work_and_contiguous_does_not(ring_results):
    unit = (SHAPE[2] // 8) ** 2  # (T/2N)² score entries
    for layout in LAYOUTS:
        measured = [r[(True, layout)]["stats"]["score_entries"] // unit for r in ring_results]
        assert measured == score_tiles(4, layout, causal=True)
    assert score_tiles(4, "contiguous") == [4, 8, 12, 16]  # rank r: r + 1 blocks of (T/N)²
    assert score_tiles(4, "zigzag") == [9, 9, 9, 9]  # 2N + 1 sub-blocks on every rank
    assert score_tiles(4, "zigzag", causal=False) == [16] * 4
    # the ring waits for the busiest rank at every step: N whole blocks vs 2N + 1 quarter blocks
    assert [critical_path_tiles(n, "contiguous") for n in (2, 4, 8)] == [8, 16, 32]
    assert [critical_path_tiles(n, "zigzag") for n in (2, 4, 8)] == [5, 9, 17]
    assert critical_path_tiles(4, "zigzag", causal=False) == 16
    # the largest score tile alive is one (T/2N)² sub-block with zigzag, never the (T, T) matrix
    assert all(r[(True, "zigzag")]["stats"]["largest_tile"] == unit for r in ring_results)


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
