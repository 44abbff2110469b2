"""The 3D planner against Megatron-LM's published configurations (Narayanan et al. 2021, Table 1)."""

import pytest

from m11_helpers.activations import activation_bytes
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.planner import (
    DGX_A100,
    MEGATRON_1T,
    MEGATRON_TABLE1,
    NVL72,
    SELENE,
    comm_per_step,
    evaluate,
    first_stage_params,
    megatron_rule,
    memory_per_gpu,
    placement_link,
    plan_3d,
    traffic,
)
from m11_helpers.quantities import value


def test_table1_parameter_counts():
    # Table 1 prints 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) to one decimal (1.65 B shows as 1.7).
    for cfg, *_ in MEGATRON_TABLE1:
        published = float(cfg.name.split()[1].rstrip("B"))
        assert abs(param_count(cfg) / 1e9 - published) <= 0.05


def test_every_published_configuration_fits():
    for cfg, tp, pp, gpus, batch in MEGATRON_TABLE1:
        assert evaluate(cfg, SELENE, gpus // (tp * pp), tp, pp, batch).fits, cfg.name


def test_rule_reproduces_tp8_pp64_for_1t():
    plan = megatron_rule(MEGATRON_1T, SELENE, gpus=3072, global_batch=3072)
    assert (plan.dp, plan.tp, plan.pp) == (6, 8, 64)
    assert not evaluate(MEGATRON_1T, SELENE, 12, 8, 32, 3072).fits  # half the stages: ~80 GB, does not fit


def test_rule_matches_table1_where_memory_decides():
    got = {cfg.name: (r.tp, r.pp) for cfg, _, _, g, b in MEGATRON_TABLE1 if (r := megatron_rule(cfg, SELENE, g, b))}
    for name, expected in [("GPT 1.7B", (1, 1)), ("GPT 18.4B", (8, 1)), ("GPT 39.1B", (8, 2)),
                           ("GPT 76.1B", (8, 4)), ("GPT 145.6B", (8, 8)), ("GPT 529.6B", (8, 35)),
                           ("GPT 1008.0B", (8, 64))]:
        assert got[name] == expected


def test_memory_comes_from_the_kit_and_equals_the_shared_figures():
    # The planner has no activation formula of its own: Korthikanti et al. 2022 §4.1's 34 + 5as/h bytes per
    # s·b·h for a 16-bit GPT layer with dropout, and §4.2.2's 10 + 24/t with selective recomputation, come
    # from activations.activation_bytes (statistics=False: the paper ignores the norms' fp32 statistics).
    gpt = MEGATRON_TABLE1[0][0]
    s, h, a = gpt.seq_len, gpt.hidden, gpt.heads
    assert activation_bytes(gpt, 1, statistics=False)["per_layer"] == pytest.approx(s * h * (34 + 5 * a * s / h))
    assert activation_bytes(gpt, 1, recompute="selective", tp=8, statistics=False)["per_layer"] == \
        pytest.approx(s * h * (10 + 24 / 8))
    # The 7B on one GPU: the same figures lessons print with quantities.say (one helper per quantity).
    mem = memory_per_gpu(RUNNING_EXAMPLE, tp=1, pp=1, recompute="full")
    assert mem["states"] * 1e9 == pytest.approx(value("7b.model_states.megatron"))
    assert mem["activations"] * 1e9 == pytest.approx(value("7b.activations.full.peak"))
    assert first_stage_params(RUNNING_EXAMPLE, 1) == param_count(RUNNING_EXAMPLE)
    assert first_stage_params(RUNNING_EXAMPLE, 4) < param_count(RUNNING_EXAMPLE) / 3  # 8 of 32 layers + embedding
    assert SELENE.memory_gb == pytest.approx(80 * 2**30 / 1e9)  # an "80 GB" A100 holds 80 GiB
    bf16_grads = memory_per_gpu(RUNNING_EXAMPLE, tp=1, pp=1, layout="deepspeed")  # the ZeRO paper's 16 B
    assert mem["states"] == pytest.approx(bf16_grads["states"] * 18 / 16)  # Megatron's fp32 main grads: 18 B
    with pytest.raises(ValueError, match="layout"):
        memory_per_gpu(RUNNING_EXAMPLE, tp=1, pp=1, layout="fp8")


def test_comm_formulas_and_traffic():
    cfg = RUNNING_EXAMPLE
    s, h = cfg.seq_len, cfg.hidden
    comm = comm_per_step(cfg, tp=8, pp=1, dp=1, micro_batch=1, microbatches=1)
    assert comm["pp"] == 0 and comm["dp"] == 0
    assert comm["tp"] == pytest.approx(4 * 32 * s * h * 2 * 2 * 7 / 8 / 1e9)
    rows = {r["kind"]: r for r in traffic(MEGATRON_1T, SELENE, dp=6, tp=8, pp=64, global_batch=3072)}
    assert rows["TP"]["GB"] > 5 * rows["PP"]["GB"] > 5 * rows["DP"]["GB"]  # TP sends the most: it gets NVLink
    assert rows["PP"]["operations"] == 2 * 512 and rows["DP"]["operations"] == 1


def test_plan_3d_is_sorted_and_consistent():
    plans = plan_3d(RUNNING_EXAMPLE, SELENE, gpus=64, global_batch=512)
    assert plans and all(p.dp * p.tp * p.pp == 64 and p.fits for p in plans)
    assert [p.step_s for p in plans] == sorted(p.step_s for p in plans)
    assert all(p.tp <= 8 for p in plans[:3])  # the fastest keep tensor parallelism inside a node


def test_zero1_moves_the_rule():
    # ZeRO-1 shards master + Adam (12 B/param) over dp: 6 + 12/dp bytes per parameter, Megatron Core's
    # distributed-optimizer row for bf16 params with fp32 grads (exercise 4.4 derives it)
    z, n = memory_per_gpu(RUNNING_EXAMPLE, tp=1, pp=1, dp=64, zero1=True), param_count(RUNNING_EXAMPLE)
    assert z["states"] * 1e9 == pytest.approx(6 * n + 12 * -(-n // 64))
    seven_b = megatron_rule(RUNNING_EXAMPLE, SELENE, 64, 512, zero1=True)
    assert (seven_b.dp, seven_b.tp, seven_b.pp) == (64, 1, 1)  # without ZeRO-1: (32, 2, 1)
    one_t = megatron_rule(MEGATRON_1T, SELENE, 3072, 3072, zero1=True)
    assert (one_t.dp, one_t.tp, one_t.pp) == (24, 8, 16) and one_t.fits  # PP 16 instead of the published 64


def test_a_72_gpu_nvlink_domain_moves_pp_onto_nvlink_and_lets_tp_grow():
    # GB200 NVL72 (72 GPUs per NVLink 5 domain): the 146B's TP 8 × PP 8 group fits one rack, its pipeline hops
    # leave the NIC; the memory rule may pick TP beyond 8 where the heads divide (96 heads: TP 24)
    cfg = MEGATRON_TABLE1[6][0]
    dgx, rack = ({r["kind"]: r for r in traffic(cfg, c, dp=24, tp=8, pp=8, global_batch=2304)} for c in (SELENE, NVL72))
    assert rack["PP"]["placed_s"] * 10 < dgx["PP"]["placed_s"] and rack["PP"]["GB"] == dgx["PP"]["GB"]
    assert NVL72.gpus_per_node == 72 and NVL72.nvlink_gbps == 900
    plan = megatron_rule(cfg, NVL72, 1536, 2304)
    assert (plan.tp, plan.pp) == (24, 1) and megatron_rule(cfg, SELENE, 1536, 2304).tp == 8


def test_links_follow_megatrons_rank_order_on_the_rails():
    # DGX A100: NVLink 3 inside a node, one 25 GB/s HDR NIC per GPU (lesson 02's comm_model.Fabric)
    assert SELENE.gpus_per_node == 8 and SELENE.nvlink_gbps == 300 and SELENE.ib_gbps == 25
    assert placement_link(DGX_A100, 8) is DGX_A100.intra  # TP 8: one node
    assert placement_link(DGX_A100, 16).gbs_per_direction == 200  # TP 16: a ring on 8 rails, 8 × 25
    assert placement_link(DGX_A100, 6, 512).gbs_per_direction == 25  # DP of the 1T: one GPU per node, its own rail
    assert placement_link(DGX_A100, 32, 2).gbs_per_direction == 100  # 4 of the group per node: 4 rails
    assert placement_link(DGX_A100, 64, 8, p2p=True).gbs_per_direction == 25  # pipeline hops: the GPU's own NIC
    assert placement_link(DGX_A100, 2, 2, p2p=True) is DGX_A100.intra  # neighbouring stages in one node
    rows = {r["kind"]: r for r in traffic(MEGATRON_1T, SELENE, dp=6, tp=8, pp=64, global_batch=3072)}
    assert rows["TP"]["placed_s"] == pytest.approx(rows["TP"]["nvlink_s"])
    assert rows["PP"]["placed_s"] == pytest.approx(rows["PP"]["ib_s"]) and rows["TP"]["ib_s"] > 10 * rows["TP"]["nvlink_s"]


@pytest.mark.parametrize("kw", [dict(tp=0, pp=1), dict(tp=1, pp=-1), dict(tp=1, pp=1, recompute="some")])
def test_bad_input(kw):
    with pytest.raises(ValueError, match="tp|pp|recompute"):
        memory_per_gpu(RUNNING_EXAMPLE, **kw)
