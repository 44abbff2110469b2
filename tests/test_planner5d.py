"""The 5D planner: parameter counts against the papers, published layouts, and what each dimension does."""

import dataclasses

import pytest

from m11_helpers.activations import activation_bytes
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.planner5d import (
    DEEPSEEK_V3,
    H100_CLUSTER,
    H800_CLUSTER,
    LLAMA3_405B_128K,
    META_H100,
    MOE_7B,
    Model5D,
    evaluate_5d,
    params,
    plan_5d,
)

M7_128K = Model5D(dataclasses.replace(RUNNING_EXAMPLE, seq_len=131072))


def test_parameter_counts_match_the_papers():
    assert params(LLAMA3_405B_128K)["total"] == param_count(LLAMA3_405B_128K.cfg)
    assert params(LLAMA3_405B_128K)["total"] / 1e9 == pytest.approx(405, rel=0.01)  # Dubey et al. 2024, Table 3
    ds = params(DEEPSEEK_V3)
    assert ds["total"] / 1e9 == pytest.approx(671, rel=0.002)  # DeepSeek-V3: 671B total
    assert ds["active"] / 1e9 == pytest.approx(37, rel=0.02)  # 37B activated per token
    moe = params(MOE_7B)
    assert moe["active"] == pytest.approx(param_count(RUNNING_EXAMPLE), rel=1e-3)  # same active size as the 7B
    assert moe["total"] > 2.5 * moe["active"]


def test_llama3_long_context_layout_fits_only_with_recomputation():
    kw = dict(tp=8, cp=16, pp=16, dp=8, global_batch=128)  # Dubey et al. 2024, Table 4: 16,384 GPUs, 131,072 tokens
    none = evaluate_5d(LLAMA3_405B_128K, META_H100, **kw)
    full = evaluate_5d(LLAMA3_405B_128K, META_H100, recompute="full", **kw)
    assert not none.fits and full.fits
    assert none.memory["states"] == full.memory["states"] < 8 * 2**30
    inter = [evaluate_5d(LLAMA3_405B_128K, META_H100, recompute="full", virtual_stages=v, **kw).mfu for v in (1, 2, 4)]
    assert inter == sorted(inter)  # interleaving shrinks the bubble
    assert full.comm_bytes["ep"] == 0 and full.comm_bytes["cp"] > 0


def test_deepseek_v3_layout_is_expert_parallel_across_nodes():
    p = evaluate_5d(DEEPSEEK_V3, H800_CLUSTER, tp=1, cp=1, pp=16, dp=128, ep=64, global_batch=15360,
                    recompute="full", ep_overlap=True)
    assert p.fits and p.comm_bytes["tp"] == 0 and p.comm_bytes["ep"] > p.comm_bytes["dp"]
    exposed = evaluate_5d(DEEPSEEK_V3, H800_CLUSTER, tp=1, cp=1, pp=16, dp=128, ep=64, global_batch=15360,
                          recompute="full")
    assert exposed.step_s > p.step_s  # without DualPipe's overlap the all-to-all sits on the critical path


def test_cp_divides_activations_and_sp_divides_the_rest():
    a = {cp: evaluate_5d(M7_128K, H100_CLUSTER, tp=1, cp=cp, pp=1, dp=64 // cp, global_batch=64) for cp in (1, 4)}
    assert a[4].memory["activations"] < a[1].memory["activations"] / 3.5
    one = activation_bytes(RUNNING_EXAMPLE, 1, seq_len=131072 // 8, flash=True, tp=8, sequence_parallel=True)
    p = evaluate_5d(M7_128K, H100_CLUSTER, tp=8, cp=8, pp=1, dp=1, global_batch=64)
    assert p.memory["activations"] == pytest.approx(32 * one["per_layer"] + one["outside"])


def test_planner_finds_long_context_layouts_that_pure_dp_cannot():
    assert not evaluate_5d(M7_128K, H100_CLUSTER, tp=1, cp=1, pp=1, dp=64, global_batch=64, recompute="full").fits
    plans = plan_5d(M7_128K, H100_CLUSTER, 64, 64)
    assert plans and all(p.fits for p in plans) and plans[0].cp > 1
    assert [p.step_s for p in plans] == sorted(p.step_s for p in plans)
    moe = plan_5d(MOE_7B, H100_CLUSTER, 64, 512)
    assert any(p.ep > 1 for p in moe)


def test_links_come_from_lesson_02s_rails():
    # H100_CLUSTER is comm_model.HGX_H100: a DP ring over all 64 GPUs runs on 8 rails at once (400 GB/s per GPU),
    # one GPU per node (TP 8 inside) rides its own rail (50 GB/s); not one NIC's 50 GB/s for every ring
    assert H100_CLUSTER.fabric.nics == 8 and H100_CLUSTER.gpus_per_node == 8
    flat = evaluate_5d(MOE_7B, H100_CLUSTER, tp=1, cp=1, pp=1, dp=64, global_batch=512)
    assert flat.comm_s["dp"] == pytest.approx(flat.comm_bytes["dp"] / 400e9)
    rail = evaluate_5d(M7_128K, H100_CLUSTER, tp=8, cp=1, pp=1, dp=8, global_batch=64, recompute="full")
    assert rail.comm_s["dp"] == pytest.approx(rail.comm_bytes["dp"] / 50e9)
    assert rail.comm_s["tp"] == pytest.approx(rail.comm_bytes["tp"] / H100_CLUSTER.intra.bandwidth)


def test_bad_input():
    with pytest.raises(ValueError, match="ep"):
        evaluate_5d(MOE_7B, H100_CLUSTER, tp=1, cp=1, pp=1, dp=4, ep=3, global_batch=8)
    with pytest.raises(ValueError, match="global_batch"):
        evaluate_5d(M7_128K, H100_CLUSTER, tp=1, cp=1, pp=1, dp=3, global_batch=8)
    with pytest.raises(ValueError, match="recompute"):
        evaluate_5d(M7_128K, H100_CLUSTER, tp=1, cp=1, pp=1, dp=1, global_batch=8, recompute="some")
