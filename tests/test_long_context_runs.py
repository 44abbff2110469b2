"""What lesson 12 runs on its ranks: each run's measurements, as the notebook reads them, on 4 real gloo ranks.

ep_run is tested in tests/test_expert_parallel.py's launch. The ring run is also the test of `context_parallel.ring_attention` and `ulysses.ulysses_attention` on real ranks
(one launch for both families: equality with one process, messages, bytes, work per rank, the head limit).
"""

import pytest

from m11_helpers.context_parallel import LAYOUTS, ring_bytes_per_rank, score_tiles
from m11_helpers.launch import launch
from m11_helpers.long_context_runs import ring_run, sp_run
from m11_helpers.sequence_parallel import ring_bytes
from m11_helpers.ulysses import ulysses_bytes_per_rank


def test_sp_run_equal_and_same_bytes_as_tp():
    for r in launch(sp_run, num_processes=4, device="cpu", show_output=False):
        for name in ("SP", "SP, keep gathered input"):
            assert max(r[name][k] for k in ("diff_y", "diff_dx", "diff_ln_grad")) < 1e-12
        keep = r["SP, keep gathered input"]["comm"]
        assert keep["all_gather"]["wire"] + keep["reduce_scatter"]["wire"] == r["TP"]["comm"]["all_reduce"]["wire"]
        assert r["SP"]["comm"]["all_gather"]["wire"] - keep["all_gather"]["wire"] == 2 * ring_bytes("all_gather", 2 * 32 * 64 * 8, 4)
        assert keep["all_gather"]["elements"] + keep["reduce_scatter"]["elements"] == 2 * r["TP"]["comm"]["all_reduce"]["elements"]
        assert r["SP"]["bytes"] * 4 == r["single_bytes"]


@pytest.fixture(scope="module")
def ring():
    return launch(ring_run, num_processes=4, device="cpu", show_output=False)


def test_ring_run_equal_neighbours_only_bytes_balanced_and_small(ring):
    """Ring attention, causal and not, both layouts, forward and backward, against full attention on one process."""
    B, H, T, D = 1, 2, 64, 16
    want = ring_bytes_per_rank(T, 4, H * D, dtype_bytes=8, batch=B)
    for rank, r in enumerate(ring):
        for causal in (False, True):
            for layout in LAYOUTS:
                case = r[(causal, layout)]
                assert case["max_diff"] < 1e-12  # output, dq, dk, dv
                assert case["bytes_sent"] == want["forward"] and case["bytes_sent_backward"] == want["backward"]
                assert case["isend_to"] == {(rank + 1) % 4} and case["irecv_from"] == {(rank - 1) % 4}
                assert case["collectives"] == set()
        assert r["saved_ring"] * 4 < r["saved_flash"] + 4 * 4 * T  # q, k, v, O ÷ 4 (+ the lse rows)
        assert r["saved_flash"] < r["saved_naive"]
    unit = (T // 8) ** 2  # (T/2N)² score entries
    for layout in LAYOUTS:
        assert [r[(True, layout)]["score_entries"] // unit for r in ring] == score_tiles(4, layout)
    # the largest score tile alive is one (T/2N)² sub-block with zigzag, never the (T, T) matrix
    assert all(r[(True, "zigzag")]["largest_tile"] == unit for r in ring)


def test_ulysses_equals_full_attention_and_sends_half_the_ring(ring):
    B, T, D, N = 1, 64, 16, 4
    for r in ring:
        u, rg = r["ulysses"]["ulysses"], r["ulysses"]["ring"]
        assert u["max_diff"] < 1e-12 and rg["max_diff"] < 1e-12  # output, dq, dk, dv, causal
        assert u["ops"] == ["all_to_all_single"] and u["all_to_alls"] == 8  # q, k, v, out; and back in backward
        want = ulysses_bytes_per_rank(T, N, N * D, dtype_bytes=8, batch=B)
        assert u["bytes_sent"] == want["forward"] and u["bytes_sent_backward"] == want["backward"]
        assert rg["bytes_sent"] == ring_bytes_per_rank(T, N, N * D, dtype_bytes=8, batch=B)["forward"]
        assert rg["bytes_sent"] == N / 2 * u["bytes_sent"]  # ring / Ulysses = N/2 at equal K/V width
        assert "heads (2) must be a multiple" in r["head_limit"]  # 2 heads on 4 ranks: no whole head each
