"""The 3D planner against Megatron-LM's published configurations (Narayanan et al. 2021, Table 1)."""

import pytest

from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.planner import (
    MEGATRON_1T,
    MEGATRON_TABLE1,
    SELENE,
    activation_bytes_per_layer,
    comm_per_step,
    evaluate,
    megatron_rule,
    memory_per_gpu,
    plan_3d,
)


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
                           ("GPT 76.1B", (8, 4)), ("GPT 145.6B", (8, 8))]:
        assert got[name] == expected


def test_memory_and_comm_formulas():
    # Korthikanti et al. 2022 §4.1: 34 + 5as/h bytes per s·b·h without parallelism.
    cfg = RUNNING_EXAMPLE
    s, h, a = cfg.seq_len, cfg.hidden, cfg.heads
    assert activation_bytes_per_layer(cfg, 1, 1, "none") == pytest.approx(s * h * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(cfg, 1, 8, "selective") == pytest.approx(s * h * 13)
    mem = memory_per_gpu(cfg, tp=1, pp=1, recompute="full")
    assert mem["states"] == pytest.approx(16 * param_count(cfg) / 1e9)
    comm = comm_per_step(cfg, tp=8, pp=1, dp=1, micro_batch=1, microbatches=1)
    assert comm["pp"] == 0 and comm["dp"] == 0
    assert comm["tp"] == pytest.approx(4 * 32 * s * h * 2 * 2 * 7 / 8 / 1e9)


def test_plan_3d_is_sorted_and_consistent():
    plans = plan_3d(RUNNING_EXAMPLE, SELENE, gpus=64, global_batch=512)
    assert plans and all(p.dp * p.tp * p.pp == 64 and p.fits for p in plans)
    assert [p.step_s for p in plans] == sorted(p.step_s for p in plans)
    assert all(p.tp <= 8 for p in plans[:3])  # the fastest keep tensor parallelism inside a node


@pytest.mark.parametrize("kw", [dict(tp=0, pp=1), dict(tp=1, pp=-1), dict(tp=1, pp=1, recompute="some")])
def test_bad_input(kw):
    with pytest.raises(ValueError, match="tp|pp|recompute"):
        memory_per_gpu(RUNNING_EXAMPLE, **kw)
