"""accumulation_step.py: the composed step (autocast → ÷K → sync on the K-th → clip → step → scheduler) on real
gloo ranks under DDP and FSDP2, against one process on the large batch; fp16 + GradScaler skips an inf step."""

import pytest
import torch
from torch.testing import assert_close

from m11_helpers.accumulation_step import (
    accumulation_step,
    composed_step_run,
    fsdp_grad_memory_run,
    large_batch_reference,
    make_optimizer,
    step_batches,
)
from m11_helpers.launch import launch
from m11_helpers.models import mlp


def _many(configs):
    """Several composed runs in one launch (each launch forks 2 ranks; FSDP2's first step is the slow part)."""
    return [composed_step_run(**c) for c in configs]


@pytest.fixture(scope="module")
def runs():
    configs = [dict(wrapper=w, precision=p, max_norm=m) for w in ("ddp", "fsdp2") for p, m in
               (("fp32", 0.2), ("bf16", 0.2), ("fp32", 100.0))]
    configs += [dict(wrapper="ddp", precision="fp16", steps=4, inf_at=(1, 0, 1), max_norm=0.2),
                dict(wrapper="ddp", precision="fp16", steps=4, inf_at=(1, 0, 1), max_norm=0.2, scheduler_always=True)]
    out = launch(_many, configs, num_processes=2, show_output=False, timeout=240)
    return configs, out


def test_composed_step_equals_the_large_batch_under_ddp_and_fsdp2(runs):
    configs, out = runs
    for i, c in enumerate(configs[:6]):
        ref = large_batch_reference(3, 3, 4, 2, max_norm=c["max_norm"], precision=c["precision"])
        tol = dict(rtol=1e-5, atol=1e-6) if c["precision"] == "fp32" else dict(rtol=2e-2, atol=2e-3)  # bf16: 8 bits
        for rank in out:
            r = rank[i]
            assert_close(r["params"], ref["params"], **tol, msg=str(c))
            assert_close([s["norm"] for s in r["log"]], ref["norms"], **tol, msg=str(c))
            assert r["log"][-1]["lr"] == pytest.approx(ref["lr"])  # 3 scheduler steps, not 9
            assert r["grad_syncs"] == (3 if c["wrapper"] == "ddp" else 3 * 3)  # once per step (per FSDP unit)
    assert out[0][0]["log"][0]["norm"] > 0.2 and out[0][2]["log"][0]["norm"] < 100  # clipping active, then not


def test_fp16_inf_step_is_skipped_four_ways(runs):
    configs, out = runs
    ref = large_batch_reference(4, 3, 4, 2, max_norm=0.2, precision="fp16", skip=(1,))
    for rank in out:
        log = rank[6]["log"]
        assert [s["stepped"] for s in log] == [True, False, True, True]  # the scaler skipped the inf step
        assert log[1]["scale"] == log[0]["scale"] / 2  # ... and halved the scale
        assert not log[1]["weights changed"] and log[2]["weights changed"]  # weights untouched by it
        assert log[1]["lr"] == log[0]["lr"]  # the schedule did not advance
        assert_close(rank[6]["params"], ref["params"], rtol=1e-2, atol=1e-3)  # = the large batch without step 1
        wrong = rank[7]["log"]  # scheduler.step() every step, skipped or not: the schedule runs ahead
        assert wrong[1]["lr"] > wrong[0]["lr"] and wrong[-1]["lr"] > log[-1]["lr"]


def test_fsdp2_without_sync_holds_unsharded_gradients():
    rows = launch(fsdp_grad_memory_run, 3, num_processes=2, show_output=False, timeout=120)[0]
    full = sum(p.numel() * 4 for p in mlp(seed=0).parameters())
    assert [r["unsharded grad bytes"] for r in rows] == [full, full, 0]  # the whole model's fp32 gradients
    assert [r["sharded grad bytes"] for r in rows] == [0, 0, full // 2]  # after the sync: this rank's half


def test_bad_input_names_the_parameter():
    model = mlp(seed=0)
    opt, sched = make_optimizer(model)
    x, y = step_batches(1, 2, 4, 1)
    with pytest.raises(ValueError, match="precision"):
        accumulation_step(model, opt, sched, list(zip(x[0, 0], y[0, 0])), max_norm=1.0, precision="fp16")
    with pytest.raises(ValueError, match="max_norm"):
        accumulation_step(model, opt, sched, list(zip(x[0, 0], y[0, 0])), max_norm=0.0)
    with pytest.raises(ValueError, match="wrapper"):
        composed_step_run("zero3")
    with pytest.raises(ValueError, match="micro"):
        step_batches(1, 2, 0, 1)


def test_single_process_step_equals_the_large_batch():
    """No wrapper (one process): grad_sync is a no-op and the step is the window's large-batch step."""
    model = mlp(seed=0)
    opt, sched = make_optimizer(model)
    x, y = step_batches(2, 3, 4, 1)
    for s in range(2):
        accumulation_step(model, opt, sched, list(zip(x[s, 0], y[s, 0])), max_norm=0.2, precision="fp32")
    ref = large_batch_reference(2, 3, 4, 1, max_norm=0.2, precision="fp32")
    assert_close([p.detach() for p in model.parameters()], ref["params"])
    assert all(p.grad is None for p in model.parameters())
    assert torch.isfinite(torch.cat([p.detach().flatten() for p in model.parameters()])).all()
