"""Overlap arithmetic (lessons 04, 05, 12): per-layer compute against the communication hidden behind it; the
rail-model helpers added to comm_model for it (cluster_collective_time, group_link, ring_collective_time)."""

import dataclasses
import math

import pytest

from m11_helpers.comm_model import (
    HGX_H100,
    ONE_NIC_H100,
    cluster_allreduce_time,
    cluster_collective_time,
    group_link,
    ring_collective_time,
)
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.hardware_specs import IB_400G, NVLINK_H100, Link, chip
from m11_helpers.overlap import (
    cp_overlap,
    fsdp_overlap,
    layer_flops,
    layer_params,
    min_tokens,
    overlap_curves,
    ring_link,
    tp_overlap,
)

F = 0.4 * chip("H100 SXM").peak_flops("bf16")
NO_ALPHA = Link("IB, no latency", 50, "test", alpha_us=0.0)


def test_layer_params_of_the_7b():
    cfg = RUNNING_EXAMPLE
    assert layer_params(cfg) == 202_383_360  # 4h² + 3·h·11008 + 2h (RMSNorm weights)
    assert param_count(cfg) == 32 * layer_params(cfg) + 2 * 32000 * 4096 + 4096
    assert layer_flops(cfg, 1, causal=False) == 2 * 202_383_360 + 4 * 4096 * 4096


def test_fsdp_rule_of_thumb_is_the_closed_form_without_latency():
    cfg, n = RUNNING_EXAMPLE, 64
    tok = min_tokens("fsdp", cfg, n, NO_ALPHA, F)
    # 3·F_layer(t)/F = 3·(n−1)/n·P·b/B  →  t = (n−1)/n · P·b·F / (B · flops per token per layer)
    per_token = layer_flops(cfg, 1)
    assert tok == pytest.approx((n - 1) / n * layer_params(cfg) * 2 * F / (NO_ALPHA.bandwidth * per_token), rel=1e-6)
    assert fsdp_overlap(cfg, 2 * tok, n, NO_ALPHA, F).hidden and not fsdp_overlap(cfg, tok / 2, n, NO_ALPHA, F).hidden
    assert min_tokens("fsdp", cfg, 8, NVLINK_H100, F) < min_tokens("fsdp", cfg, 64, IB_400G, F)


def test_tp_ratio_does_not_depend_on_tokens():
    cfg = RUNNING_EXAMPLE
    r = [tp_overlap(cfg, t, 8, NO_ALPHA, F, ).ratio for t in (512, 4096, 65536)]
    assert max(r) == pytest.approx(min(r), rel=0.2)  # only attention's s·h term moves it
    assert min_tokens("tp", cfg, 8, NVLINK_H100, F) == math.inf
    assert tp_overlap(cfg, 4096, 8, IB_400G, F).ratio > tp_overlap(cfg, 4096, 8, NVLINK_H100, F).ratio


def test_cp_chunk_rule_and_gqa():
    cfg = RUNNING_EXAMPLE
    c = min_tokens("cp", cfg, 16, NO_ALPHA, F)
    assert c == pytest.approx(2 * cfg.hidden * 2 * F / (NO_ALPHA.bandwidth * 4 * cfg.hidden * 0.5), rel=1e-6)
    gqa = dataclasses.replace(cfg, kv_heads=8)  # 4× smaller K and V: a 4× shorter chunk hides them
    assert min_tokens("cp", gqa, 16, NO_ALPHA, F) == pytest.approx(c / 4, rel=1e-6)
    assert cp_overlap(cfg, 1024, 1, IB_400G, F).comm_s == 0


def test_curves_and_bad_input():
    curves = overlap_curves(RUNNING_EXAMPLE, [1024, 8192], F, 64, IB_400G, 8, NVLINK_H100, 16, IB_400G)
    assert set(curves) == {"FSDP", "TP", "CP ring"} and curves["FSDP"][0] > curves["FSDP"][1]
    with pytest.raises(ValueError, match="kind"):
        min_tokens("ep", RUNNING_EXAMPLE, 8, IB_400G, F)
    with pytest.raises(ValueError, match="world"):
        fsdp_overlap(RUNNING_EXAMPLE, 10, 0, IB_400G, F)
    with pytest.raises(ValueError, match="mfu"):
        overlap_curves(RUNNING_EXAMPLE, [1], F, 2, IB_400G, 2, IB_400G, 2, IB_400G, mfu=2.0)


def test_a_fabric_runs_fsdp_on_every_rail():
    # lesson 02's rail model: a flat ring over 8 HGX nodes crosses the network on 8 rails, min(NVLink, 8 × 50 GB/s)
    cfg, F_ = RUNNING_EXAMPLE, F
    assert ring_link(HGX_H100, 64).gbs_per_direction == 400 and ring_link(HGX_H100, 8) is NVLINK_H100
    assert ring_link(ONE_NIC_H100, 64).gbs_per_direction == 50 and ring_link(IB_400G, 64) is IB_400G
    rails, one_nic = min_tokens("fsdp", cfg, 64, HGX_H100, F_), min_tokens("fsdp", cfg, 64, ONE_NIC_H100, F_)
    assert 1100 < rails < 1300 and one_nic == pytest.approx(min_tokens("fsdp", cfg, 64, IB_400G, F_))
    assert one_nic > 6 * rails  # 8× the bandwidth, less the α terms
    p = layer_params(cfg) * 2
    assert fsdp_overlap(cfg, 4096, 64, HGX_H100, F_).comm_s == pytest.approx(
        3 * cluster_collective_time("all_gather", p, 8, HGX_H100))  # 2 all-gathers + a reduce-scatter, same time
    assert cluster_collective_time("all_reduce", p, 8, HGX_H100) == pytest.approx(cluster_allreduce_time(p, 8, HGX_H100))
    with pytest.raises(ValueError, match="whole nodes"):
        fsdp_overlap(cfg, 4096, 12, HGX_H100, F_)


def test_group_link_generalises_rail_link():
    assert group_link(HGX_H100, 1).gbs_per_direction == HGX_H100.rail_link().gbs_per_direction == 50
    assert group_link(HGX_H100, 8).bandwidth == HGX_H100.network_bandwidth()  # a flat ring: every rail
    assert group_link(ONE_NIC_H100, 8).gbs_per_direction == 50 and group_link(ONE_NIC_H100, 1).gbs_per_direction == 6.25
    assert group_link(HGX_H100, 4).alpha == IB_400G.alpha  # a hop across nodes pays the NIC's latency
    with pytest.raises(ValueError, match="per_node"):
        group_link(HGX_H100, 16)
    a, b = 5e-6, 1 / 50e9
    assert ring_collective_time("all_gather", 1e9, 8, a, b) == pytest.approx(7 * a + 7 / 8 * 1e9 * b)
    with pytest.raises(ValueError, match="op"):
        ring_collective_time("broadcast", 1e9, 8, a, b)
