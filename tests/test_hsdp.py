"""HSDP (FSDP2 on a 2×2 replicate × shard mesh) on 4 real gloo ranks against one process; the α–β comparison."""

import pytest

from m11_helpers.hardware_specs import IB_400G, NVLINK_H100
from m11_helpers.hsdp import hsdp_step_report, hsdp_vs_fsdp, ring_collective_time
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
        assert hsdp["all_gather_single"]["bytes"] == pytest.approx(2 * full / 2, rel=1e-3)
        assert fsdp["all_gather_single"]["bytes"] == pytest.approx(2 * full / 4, rel=1e-3)
        assert hsdp["reduce_scatter_single"]["bytes"] == pytest.approx(full, rel=1e-3)
        assert hsdp["all_reduce"]["bytes"] == pytest.approx(full / 2, rel=1e-3)  # only the gradient shards
        assert hsdp["all_reduce"]["calls"] == hsdp["reduce_scatter_single"]["calls"]


def test_hsdp_vs_fsdp_model():
    S = 13.5e9  # 7B parameters in bf16
    out = hsdp_vs_fsdp(S, nodes=8, gpus_per_node=8, intra=NVLINK_H100, inter=IB_400G)
    assert out["hsdp"]["total"] < out["fsdp"]["total"]
    assert out["fsdp_inter_bytes"] / out["hsdp_inter_bytes"] == pytest.approx(3 * 63 / 64 / (2 * 7 / 8 / 8))
    one = hsdp_vs_fsdp(S, nodes=1, gpus_per_node=8, intra=NVLINK_H100, inter=IB_400G)
    assert one["hsdp"]["all_reduce"] == 0 and one["fsdp"]["total"] == pytest.approx(one["hsdp"]["total"])
    assert ring_collective_time("all_reduce", S, 8, IB_400G) == pytest.approx(
        2 * ring_collective_time("all_gather", S, 8, IB_400G))
    with pytest.raises(ValueError, match="op"):
        ring_collective_time("broadcast", S, 8, IB_400G)
    with pytest.raises(ValueError, match="nodes"):
        hsdp_vs_fsdp(S, 0, 8, NVLINK_H100, IB_400G)
