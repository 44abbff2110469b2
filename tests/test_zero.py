"""ZeRO's memory and communication formulas against the paper; the sharded optimizer against AdamW on real processes."""

import pytest
import torch

from m11_helpers.comm_model import ring_bytes_sent
from m11_helpers.config import RUNNING_EXAMPLE, TINY_GPT, param_count
from m11_helpers.hardware_specs import chip
from m11_helpers.launch import launch
from m11_helpers.model_states import gradient_bytes, model_state_bytes
from m11_helpers.quantities import GB, GiB
from m11_helpers.zero import (
    accelerate_estimate,
    bytes_sent_per_step,
    comm_volume,
    deepspeed_estimate,
    memory_breakdown,
    memory_per_gpu,
    min_gpus,
    reduction_factor,
)
from m11_helpers.zero_lab import lab_figure, lab_rows
from m11_helpers.zero_optimizer import adamw_update, compare_with_adamw, zero_redundancy_report
from m11_helpers.zero_resume import resume_run


def test_paper_figure_1_example_7_5b_on_64_gpus():
    # Rajbhandari et al. 2020, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12 → 120, 31.4, 16.6, 1.9 GB
    got = [round(memory_per_gpu(7.5e9, 64, s) / GB, 1) for s in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_breakdown_parts_come_from_model_states():
    m = memory_breakdown(1e9, 8, 2)
    assert (m.parameters, m.gradients, m.optimizer) == (2e9, 2e9 / 8, 12e9 / 8)
    for layout in ("deepspeed", "autocast", "megatron"):
        for stage in range(4):
            parts = model_state_bytes(10**9 + 1, layout, 8, stage)  # Ψ % N != 0: shards of ⌈Ψ/N⌉
            m = memory_breakdown(10**9 + 1, 8, stage, layout=layout)
            assert (m.parameters, m.gradients, m.optimizer) == (parts["weights"], parts["grads"],
                                                               parts["master"] + parts["optimizer"])
    # autocast's 16 bytes shard differently: fp32 weights + fp32 grads stay whole under ZeRO-1
    assert memory_per_gpu(10**9, 8, 1, layout="autocast") == 8e9 + 8e9 / 8


def test_reduction_factors_approach_4_8_and_n():
    assert reduction_factor(8, 1) == pytest.approx(16 / 5.5)
    assert reduction_factor(10**9, 1) == pytest.approx(4, rel=1e-6)
    assert reduction_factor(10**9, 2) == pytest.approx(8, rel=1e-6)
    assert reduction_factor(64, 3) == pytest.approx(64)


def test_offload_moves_optimizer_and_params_to_cpu():
    m = memory_breakdown(1e9, 4, 2, offload="optimizer")
    assert m.optimizer == 0 and m.parameters == 2e9 and m.cpu == pytest.approx(14e9 / 4)
    m3 = memory_breakdown(1e9, 4, 3, offload="optimizer+params")
    assert m3.parameters == 0 and m3.optimizer == 0 and m3.cpu == pytest.approx(16e9 / 4)
    with pytest.raises(ValueError, match="stage=3"):
        memory_breakdown(1e9, 4, 2, offload="optimizer+params")


def test_min_gpus_100b_on_40gb_and_the_unit_matters():
    # 100B × 16 B = 1.6 TB of model states: a "40 GB" A100 holds 40 GiB, so ZeRO-3 needs 38 of them (40 if
    # the capacity is misread as 40e9 bytes); DDP and ZeRO-1 never fit
    assert min_gpus(100e9, 40 * GiB, 3) == 38 and min_gpus(100e9, 40 * GB, 3) == 40
    assert min_gpus(100e9, 40 * GiB, 0) is None
    assert min_gpus(100e9, 40 * GiB, 1) is None  # 4Ψ = 400 GB of replicated weights and grads
    hbm = H100.memory_bytes  # an "80 GB" H100: 80 GiB
    assert hbm == 80 * GiB
    n = min_gpus(RUNNING_EXAMPLE_PARAMS, hbm, 1)
    assert memory_per_gpu(RUNNING_EXAMPLE_PARAMS, n, 1) <= hbm < memory_per_gpu(RUNNING_EXAMPLE_PARAMS, n - 1, 1)
    # the lesson's fit call: ZeRO-1 with one sequence's activations (no recomputation) fits on 21 H100s
    # (80 GiB) and on no number of GPUs whose "80 GB" label is misread as 80e9 bytes
    from m11_helpers.activations import activation_bytes
    acts = activation_bytes(RUNNING_EXAMPLE, 1)["total"]
    assert min_gpus(RUNNING_EXAMPLE_PARAMS, hbm, 1, activations=acts) == 21
    assert min_gpus(RUNNING_EXAMPLE_PARAMS, H100.memory_gib * GB, 1, activations=acts) is None


RUNNING_EXAMPLE_PARAMS = param_count(RUNNING_EXAMPLE)
H100 = chip("H100 SXM")


def test_comm_volume_2psi_and_3psi():
    assert comm_volume(100, 0) == comm_volume(100, 2) == 200
    assert comm_volume(100, 3) == 300
    assert comm_volume(100, 3, world_size=4) == pytest.approx(225)


def test_bytes_sent_per_step_is_lesson_02s_ring():
    psi = RUNNING_EXAMPLE_PARAMS
    ddp = ring_bytes_sent(gradient_bytes(psi, "deepspeed"), 8)  # lesson 02's 23.6 GB: 13.5 GB of bf16 grads
    assert round(ddp / GB, 1) == 23.6
    for stage in (0, 1, 2):  # a reduce-scatter + an all-gather = an all-reduce's bytes
        assert bytes_sent_per_step(psi, stage, 8) == pytest.approx(ddp)
    assert bytes_sent_per_step(psi, 3, 8) == pytest.approx(1.5 * ddp)  # the parameters gathered twice
    assert bytes_sent_per_step(psi, 0, 8, "autocast") == pytest.approx(2 * ddp)  # fp32 gradients
    # FSDP2 MixedPrecisionPolicy: bf16 all-gathers, fp32 reduce-scatter
    assert bytes_sent_per_step(psi, 3, 8, "fsdp2-mp", gather_bytes=2) == pytest.approx(2 * ddp)  # 4Ψ + 2 × 2Ψ
    assert bytes_sent_per_step(psi, 2, 1) == 0


def test_bad_inputs_name_the_parameter():
    for kwargs, name in [({"num_params": 0, "world_size": 8, "stage": 1}, "num_params"),
                         ({"num_params": 1e9, "world_size": 0, "stage": 1}, "world_size"),
                         ({"num_params": 1e9, "world_size": 8, "stage": 4}, "stage")]:
        with pytest.raises(ValueError, match=name):
            memory_per_gpu(**kwargs)
    with pytest.raises(ValueError, match="offload"):
        memory_per_gpu(1e9, 8, 1, offload="nvme")
    with pytest.raises(ValueError, match="layout"):
        memory_per_gpu(1e9, 8, 1, layout="fp8")
    with pytest.raises(ValueError, match="gather_bytes"):
        bytes_sent_per_step(1e9, 3, 8, gather_bytes=0)


def test_other_tools_formulas():
    psi = 10**9
    assert deepspeed_estimate(psi, 2, 8) == 4 * psi + 2 * psi  # 4Ψ + 16Ψ/N
    assert deepspeed_estimate(psi, 3, 8, largest_layer_params=10**6) == 4 * 10**6 + int(18 * psi / 8)
    assert accelerate_estimate(psi, "float32") == 16 * psi  # the max of the four parts
    assert accelerate_estimate(psi, "bfloat16") == 8 * psi  # a max, not the 26Ψ sum


def test_lab_rows_and_figure():
    rows = lab_rows(RUNNING_EXAMPLE_PARAMS, 8, 3, activations=18e9, gpu_bytes=H100.memory_bytes)
    assert [r["stage"] for r in rows] == [0, 1, 2, 3] and [r["selected"] for r in rows] == [0, 0, 0, 1]
    assert [r["fits"] for r in rows] == [False, True, True, True]
    assert rows[3]["total"] == pytest.approx(memory_per_gpu(RUNNING_EXAMPLE_PARAMS, 8, 3, activations=18e9) / GiB)
    for r in rows:
        assert r["total"] == pytest.approx(r["parameters"] + r["gradients"] + r["optimizer"] + r["activations"])
    off = lab_rows(1e9, 4, 2, offload="optimizer+params")  # parameter offload only where valid
    assert [r["offload"] for r in off] == ["optimizer"] * 3 + ["optimizer+params"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = lab_figure(rows, H100.memory_bytes)
    assert len(fig.axes[0].patches) == 17  # 4 stages × 4 parts + the selected outline
    plt.close(fig)


def test_memory_lab_widget_builds_and_recomputes():
    import matplotlib
    matplotlib.use("Agg")
    from m11_helpers.zero_lab import memory_lab
    lab = memory_lab()
    *controls, summary, figure = lab.children
    assert [c.description for c in controls] == ["parameters (B)", "GPUs (N)", "stage", "offload",
                                                "include activations", "activations (GiB)", "GPU memory (GiB)"]
    assert "on 8 GPUs" in summary.value and bytes(figure.value).startswith(b"\x89PNG")
    before = bytes(figure.value)
    controls[1].value = 64  # moving a slider recomputes the summary and redraws the plot
    assert "on 64 GPUs" in summary.value and bytes(figure.value).startswith(b"\x89PNG") and bytes(figure.value) != before
    controls[3].value = "optimizer+params"
    controls[2].value = 1  # parameter offload needs ZeRO-3: the lab says what it shows instead
    assert "needs ZeRO-3" in summary.value


def test_adamw_update_is_bitwise_torch_adamw():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(100))
    q = p.detach().clone()
    m, v = torch.zeros(100), torch.zeros(100)
    opt = torch.optim.AdamW([p], lr=1e-2, foreach=False)
    for step in range(1, 4):
        g = torch.randn(100)
        p.grad = g.clone()
        opt.step()
        adamw_update(q, g, m, v, step, 1e-2, 0.9, 0.999, 1e-8, 1e-2)
    assert torch.equal(p.detach(), q)


def _both_optimizers():  # one 2-rank launch for ours and torch's ZeroRedundancyOptimizer (each launch costs seconds)
    return compare_with_adamw(steps=2), zero_redundancy_report(steps=1)


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_both_optimizers, num_processes=2, show_output=False)


def test_sharded_adamw_bitwise_equal_on_2_processes_and_state_is_the_formula(two_ranks):
    for r, _ in two_ranks:
        assert r["bitwise_equal"] and torch.equal(r["exp_avg"], r["ref_exp_avg"])
        assert r["state_bytes"] == model_state_bytes(param_count(TINY_GPT), "fp32", 2, 1)["optimizer"] \
            == r["adamw_state_bytes"] // 2


def test_sharded_adamw_saved_on_4_resumes_on_2_bitwise_as_adamw(tmp_path):
    # Ψ = 66 on 4 ranks: S = 17, the last shard padded; on 2 ranks S = 33 spans 2 and 3 of the saved files
    saved = launch(resume_run, str(tmp_path), "save", num_processes=4, show_output=False)
    assert sorted(p.name for p in tmp_path.glob("shard-*.pt")) == ["shard-0-17.pt", "shard-17-34.pt",
                                                                 "shard-34-51.pt", "shard-51-66.pt"]
    assert all(r["state_bytes"] == model_state_bytes(66, "fp32", 4, 1)["optimizer"] == 8 * 17 for r in saved)
    resumed = launch(resume_run, str(tmp_path), "resume", num_processes=2, show_output=False)
    assert [r["read"] for r in resumed] == [["shard-0-17.pt", "shard-17-34.pt"],
                                             ["shard-17-34.pt", "shard-34-51.pt", "shard-51-66.pt"]]
    for r in saved + resumed:  # the same averaged gradient in both: equal bits means equal state (m, v, step)
        assert r["params_equal"] and r["state_equal"] and r["max_abs_diff"] == 0.0, r
    assert resumed[0]["step"] == 4


def test_zero_redundancy_optimizer_equals_adamw_and_splits_state(two_ranks):
    out = [r for _, r in two_ranks]
    assert all(r["bitwise_equal"] for r in out)
    assert sum(r["params_on_rank"] for r in out) == param_count(TINY_GPT)
    assert sum(r["state_bytes"] for r in out) == 8 * param_count(TINY_GPT)
