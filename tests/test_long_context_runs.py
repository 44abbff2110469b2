"""What lesson 12 runs on its ranks: each run's measurements, as the notebook reads them, on 4 real gloo ranks."""

import pytest

from m11_helpers.context_parallel import LAYOUTS, ring_bytes_per_rank, score_tiles
from m11_helpers.launch import launch
from m11_helpers.long_context_runs import ep_run, ring_run, sp_run
from m11_helpers.sequence_parallel import ring_bytes


def test_sp_run_equal_and_same_bytes_as_tp():
    for r in launch(sp_run, num_processes=4, device="cpu", show_output=False):
        for name in ("SP", "SP, keep gathered input"):
            assert max(r[name][k] for k in ("diff_y", "diff_dx", "diff_ln_grad")) < 1e-12
        keep = r["SP, keep gathered input"]["comm"]
        assert keep["all_gather"]["wire"] + keep["reduce_scatter"]["wire"] == r["TP"]["comm"]["all_reduce"]["wire"]
        assert r["SP"]["comm"]["all_gather"]["wire"] - keep["all_gather"]["wire"] == 2 * ring_bytes("all_gather", 2 * 32 * 64 * 8, 4)
        assert keep["all_gather"]["elements"] + keep["reduce_scatter"]["elements"] == 2 * r["TP"]["comm"]["all_reduce"]["elements"]
        assert r["SP"]["bytes"] * 4 == r["single_bytes"]


def test_ring_run_equal_balanced_and_small():
    B, H, T, D = 1, 2, 64, 16
    want = ring_bytes_per_rank(T, 4, H * D, dtype_bytes=8, batch=B)
    ranks = launch(ring_run, num_processes=4, device="cpu", show_output=False)
    for r in ranks:
        for causal in (False, True):
            for layout in LAYOUTS:
                case = r[(causal, layout)]
                assert case["max_diff"] < 1e-12
                assert case["bytes_sent"] == want["forward"] and case["bytes_sent_backward"] == want["backward"]
        assert r["saved_ring"] * 4 < r["saved_flash"] + 4 * 4 * T  # q, k, v, O ÷ 4 (+ the lse rows)
        assert r["saved_flash"] < r["saved_naive"]
    unit = (T // 8) ** 2
    for layout in LAYOUTS:
        assert [r[(True, layout)]["score_entries"] // unit for r in ranks] == score_tiles(4, layout)


@pytest.mark.parametrize("cf", [None, 1.0])
def test_ep_run_equal_and_drops(cf, ep_results):
    for r in ep_results:
        assert max(r[cf][k] for k in ("diff_y", "diff_dx", "diff_expert_grad")) < 1e-12
    dropped = sum(r[cf]["dropped"] for r in ep_results)
    assert (dropped == 0) == (cf is None)


@pytest.fixture(scope="module")
def ep_results():
    return launch(ep_run, (None, 1.0), num_processes=4, device="cpu", show_output=False)
