"""HSDP (FSDP2 on a 2×2 replicate × shard mesh) on 4 real gloo ranks against one process; the α–β comparison."""

import pytest

from m11_helpers.comm_model import HGX_H100, NVLINK_H100, ONE_NIC_H100, ring_allreduce_time
from m11_helpers.hsdp import hsdp_step_report, hsdp_vs_fsdp
from m11_helpers.launch import launch


@pytest.fixture(scope="module")
def reports():
    return launch(hsdp_step_report, num_processes=4, timeout=180, show_output=False)


def test_hsdp_and_fsdp_gradients_equal_one_process(reports):
    for r in reports:
        assert r["hsdp"]["max_grad_diff"] < 1e-6 and r["fsdp"]["max_grad_diff"] < 1e-6
        assert r["hsdp"]["placements"] == "(Replicate(), Shard(dim=0))"


def test_parameter_bytes_per_rank(reports):
    for r in reports:
        full = r["param_bytes_full"]
        assert r["hsdp"]["param_bytes"] == pytest.approx(full / 2, rel=1e-3)  # sharded over 2, replicated over 2
        assert r["fsdp"]["param_bytes"] == pytest.approx(full / 4, rel=1e-3)


def test_collectives_hsdp_reduce_scatters_in_the_shard_group_and_all_reduces_shards(reports):
    for r in reports:
        full, hsdp, fsdp = r["param_bytes_full"], r["hsdp"]["comm"], r["fsdp"]["comm"]
        assert set(hsdp) == {"all_gather_single", "reduce_scatter_single", "all_reduce"}
        assert set(fsdp) == {"all_gather_single", "reduce_scatter_single"}
        # all-gather payload = this rank's shard, twice per step (forward, backward): 2·full/shard
        assert hsdp["all_gather_single"]["payload"] == pytest.approx(2 * full / 2, rel=1e-3)
        assert fsdp["all_gather_single"]["payload"] == pytest.approx(2 * full / 4, rel=1e-3)
        assert hsdp["reduce_scatter_single"]["payload"] == pytest.approx(full, rel=1e-3)
        assert hsdp["all_reduce"]["payload"] == pytest.approx(full / 2, rel=1e-3)  # only the gradient shards
        # wire, a ring over the call's group: all-gather (g−1)·shard, reduce-scatter (g−1)/g·S, all-reduce 2(g−1)/g·S
        assert hsdp["all_gather_single"]["wire"] == hsdp["all_gather_single"]["payload"]  # g = 2 (the shard group)
        assert fsdp["all_gather_single"]["wire"] == 3 * fsdp["all_gather_single"]["payload"]  # g = 4
        assert hsdp["reduce_scatter_single"]["wire"] == hsdp["reduce_scatter_single"]["payload"] / 2
        assert hsdp["all_reduce"]["wire"] == hsdp["all_reduce"]["payload"]  # g = 2 (the replicate group)
        assert hsdp["all_reduce"]["calls"] == hsdp["reduce_scatter_single"]["calls"]


def test_hsdp_vs_fsdp_model_uses_the_rails():
    S = 13.5e9  # 7B parameters in bf16
    out = hsdp_vs_fsdp(S, nodes=8, fabric=HGX_H100)
    # inter-node bytes per GPU: FSDP's flat ring 3·(63/64)·S/8, HSDP's shard all-reduce 2·(7/8)·S/8: ≈ 1.7×, not 13.5×
    assert out["fsdp_inter_bytes"] == pytest.approx(3 * 63 / 64 * S / 8)
    assert out["hsdp_inter_bytes"] == pytest.approx(2 * 7 / 8 * S / 8)
    assert out["fsdp_inter_bytes"] / out["hsdp_inter_bytes"] == pytest.approx(3 * 63 / 64 / (2 * 7 / 8))
    # FSDP's flat ring crosses nodes on 8 rails: min(NVLink 450, 8 × 50) = 400 GB/s per GPU, not one NIC's 50
    ring = 3 * 63 / 64 * S / 400e9
    assert out["fsdp"]["total"] == pytest.approx(ring + 3 * 63 * 5e-6)
    assert out["fsdp"]["total"] < out["hsdp"]["total"]  # on 8-rail nodes, one unit: FSDP is slightly faster
    one_nic = hsdp_vs_fsdp(S, nodes=8, fabric=ONE_NIC_H100)
    assert one_nic["hsdp"]["total"] < 0.75 * one_nic["fsdp"]["total"]  # one NIC per node: HSDP wins clearly
    assert one_nic["fsdp_inter_bytes"] == out["fsdp_inter_bytes"]  # the bytes do not depend on the NICs
    # at scale, per-layer collectives: FSDP's flat ring pays 2(N-1) latency steps each time
    big = [hsdp_vs_fsdp(S, nodes=n, fabric=HGX_H100, units=32) for n in (8, 32)]
    assert big[1]["hsdp"]["total"] < big[1]["fsdp"]["total"] and big[1]["fsdp"]["total"] > 1.5 * big[0]["fsdp"]["total"]
    one = hsdp_vs_fsdp(S, nodes=1, fabric=HGX_H100)
    assert one["hsdp"]["all_reduce"] == 0 and one["fsdp"]["total"] == pytest.approx(one["hsdp"]["total"])
    a, b = NVLINK_H100.alpha, NVLINK_H100.beta  # one node: two ring all-gathers over NVLink, (n-1)α + (n-1)/n·S·β each
    assert one["fsdp"]["all_gather"] == pytest.approx(2 * (7 * a + 7 / 8 * S * b))
    assert one["fsdp"]["reduce_scatter"] == pytest.approx(ring_allreduce_time(S, 8, a, b) / 2)
    with pytest.raises(ValueError, match="nodes"):
        hsdp_vs_fsdp(S, 0, HGX_H100)
    with pytest.raises(ValueError, match="units"):
        hsdp_vs_fsdp(S, 8, HGX_H100, units=0)
