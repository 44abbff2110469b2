"""Lesson 11: the capstone plan against real runs — model states exact, activations exact, traffic exact."""

import math

import pytest
import torch
import torch.distributed as dist

from m11_helpers.capstone import (
    LEVERS,
    checkpoint_blocks,
    comm_elements,
    fsdp_local_numel,
    lever_rows,
    local_bytes,
    model_state_bytes,
    param_shapes,
    predict_gpu_run,
    predict_run,
    resume_drill,
    step_seconds,
    tiny_gpt_activation_bytes,
    track_activations,
)
from m11_helpers.config import RUNNING_EXAMPLE, TINY_GPT, param_count
from m11_helpers.launch import launch, launch_script
from m11_helpers.models import tiny_gpt
from m11_helpers.resources import script_path

SCRIPT = script_path("capstone_harness.py")


def test_param_shapes_count_the_tiny_gpt_exactly():
    shapes = param_shapes(TINY_GPT)
    assert sum(math.prod(s) for s in shapes) == param_count(TINY_GPT) == sum(p.numel() for p in tiny_gpt().parameters())
    assert len(shapes) == 52  # tied head counted once


@pytest.mark.parametrize("rows,n", [(64, 4), (5, 4), (7, 3), (1, 2), (192, 3)])
def test_fsdp_local_numel_follows_torch_chunk(rows, n):
    chunks = [c.numel() for c in torch.empty(rows, 3).chunk(n)]
    chunks += [0] * (n - len(chunks))  # chunk() returns fewer pieces when rows < n
    assert [fsdp_local_numel((rows, 3), n, r) for r in range(n)] == chunks


def test_model_states_ddp_formula():
    shapes = param_shapes(TINY_GPT)
    psi = param_count(TINY_GPT)
    got = model_state_bytes(shapes, 4, "ddp")
    assert got == {"parameters": 4 * psi, "gradients": 4 * psi, "optimizer": 8 * psi + 4 * 52, "local_params": psi}
    assert sum(model_state_bytes(shapes, 3, "fsdp2", r)["local_params"] for r in range(3)) == psi


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_activation_formula_matches_saved_tensors_exactly(batch, ckpt, bf16):
    model = tiny_gpt(0)
    if ckpt:
        checkpoint_blocks(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (batch, 32), generator=g)  # (B, T) inputs
    y = torch.randint(0, 64, (batch, 32), generator=g)  # (B, T) targets: their own storage, as in training
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), track_activations() as t:
        loss = model(x, y)
    assert t.bytes == tiny_gpt_activation_bytes(TINY_GPT, batch, checkpointing=ckpt, bf16=bf16)
    loss.backward()  # checkpointed or not, the model still trains


def test_checkpoint_blocks_keeps_gradients():
    ref, ck = tiny_gpt(0), checkpoint_blocks(tiny_gpt(0))
    x = torch.randint(0, 64, (2, 32))
    ref(x, x).backward()
    ck(x, x).backward()
    for p, q in zip(ref.parameters(), ck.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert set(ref.state_dict()) == set(ck.state_dict())


def _measure_fsdp_step(batch: int = 6):
    """On each rank: FSDP2 tiny GPT, one AdamW step; measured local bytes and traffic vs DDP's gradients."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.fsdp import TrafficCounter, apply_fsdp, init_device_mesh

    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.randint(0, 64, (batch, 32), generator=torch.Generator().manual_seed(1)).chunk(n)[rank].clone()  # (B/N, T) own storage
    model = apply_fsdp(tiny_gpt(0), init_device_mesh("cpu", (n,)))
    counter = TrafficCounter().attach(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with track_activations() as t:
        loss = model(x, x)
    loss.backward()
    ddp = DDP(tiny_gpt(0))
    ddp(x, x).backward()
    diff = max((p.grad.full_tensor() - q.grad).abs().max().item() for p, q in zip(model.parameters(), ddp.parameters()))
    opt.step()
    opt_bytes = local_bytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    out = {"rank": rank, "parameters": local_bytes(model.parameters()),
           "gradients": local_bytes(p.grad for p in model.parameters()), "optimizer": opt_bytes,
           "activations": t.bytes, "comm": sum(counter.totals()[k] for k in ("all_gather", "reduce_scatter")),
           "diff": diff, "local_batch": x.shape[0]}
    del ddp
    return out


def test_plan_equals_measured_fsdp2_on_3_processes():
    # 3 ranks: 64 rows split 22/22/20, so the per-rank plan must follow FSDP2's uneven chunks exactly.
    results = launch(_measure_fsdp_step, num_processes=3, show_output=False)
    for r in results:
        p = predict_run(TINY_GPT, 3, r["local_batch"], parallel="fsdp2", rank=r["rank"])
        for k in ("parameters", "gradients", "optimizer"):
            assert r[k] == p[k], (k, r)
        assert r["activations"] == tiny_gpt_activation_bytes(TINY_GPT, r["local_batch"], separate_targets=False)
        assert r["comm"] == p["comm_elements"] > 3 * param_count(TINY_GPT)  # padded to 3·⌈d₀/3⌉ rows
        assert r["diff"] < 1e-6
    assert results[0]["parameters"] != results[2]["parameters"]  # uneven shards really happened


def test_comm_elements_and_errors():
    shapes = param_shapes(TINY_GPT)
    psi = param_count(TINY_GPT)
    assert comm_elements(shapes, "ddp", accum=4)["total"] == psi  # no_sync: one all-reduce per step
    assert comm_elements(shapes, "fsdp2", accum=2, world_size=4)["total"] == 6 * psi  # 4 divides every d₀
    with pytest.raises(ValueError, match="parallel"):
        predict_run(TINY_GPT, 2, 1, parallel="zero9")
    with pytest.raises(ValueError, match="world_size"):
        model_state_bytes(shapes, 0)
    with pytest.raises(ValueError, match="micro_batch"):
        tiny_gpt_activation_bytes(TINY_GPT, 0)
    with pytest.raises(ValueError, match="rank"):
        fsdp_local_numel((4, 4), 2, 2)
    with pytest.raises(ValueError, match="mfu"):
        step_seconds(1e9, 1e3, 1e15, mfu=0)


def test_gpu_plan_for_the_running_example():
    psi = param_count(RUNNING_EXAMPLE)
    ddp = predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="ddp", bf16=False)
    fsdp = predict_gpu_run(RUNNING_EXAMPLE, 8, parallel="fsdp2", bf16=True, checkpointing=True)
    assert ddp["model_states_gb"] == pytest.approx(16 * psi / 1e9) and not ddp["fits"]
    assert fsdp["model_states_gb"] == pytest.approx(2 * psi / 1e9) and fsdp["fits"]
    # full recomputation keeps 2sbh per layer (Korthikanti et al. 2022, Table 2): 32 · 2 · 4096 · 4096 bytes
    assert fsdp["activations_gb"] == pytest.approx(32 * 2 * 4096 * 4096 / 1e9)
    t = step_seconds(1e9, 1000, 1e12, mfu=0.5, comm_bytes=0)
    assert t["compute"] == pytest.approx(6 * 1e9 * 1000 / 0.5e12)
    assert step_seconds(1e9, 1000, 1e12, mfu=0.5, checkpointing=True)["compute"] == pytest.approx(4 / 3 * t["compute"])
    rows = lever_rows(RUNNING_EXAMPLE)
    assert [r["fits"] for r in rows] == [False, False, False, True]  # only recomputation brings seq-4096 activations under 80 GB
    assert {"lever", "bottleneck", "saves", "costs", "source"} <= set(LEVERS[0])


@pytest.mark.slow
def test_script_sweep_and_preemption_resume_bit_exact(tmp_path):
    common = ["--steps", "5", "--batch", "8"]
    ref = launch_script(SCRIPT, *common, "--sweep", "ddp,fsdp2,checkpointing", num_processes=2, echo=False,
                        show_command=False, timeout=300)
    runs = ref.results[0]["runs"]
    torch.testing.assert_close(runs["fsdp2"]["losses"], runs["ddp"]["losses"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(runs["checkpointing"]["losses"], runs["ddp"]["losses"], rtol=1e-5, atol=1e-6)
    for name in ("ddp", "fsdp2", "checkpointing"):
        p = predict_run(TINY_GPT, 2, 4, parallel=runs[name]["parallel"], checkpointing=runs[name]["checkpointing"])
        for k in ("parameters", "gradients", "optimizer", "activations", "comm_elements"):
            assert runs[name][k] == p[k], (name, k)
    ck = ["--parallel", "fsdp2", "--ckpt-dir", str(tmp_path)]
    part = launch_script(SCRIPT, *common, *ck, "--preempt-at", "1", num_processes=2, echo=False, show_command=False,
                         check=False, timeout=300)
    stop = part.results[0]["runs"]["run"]["preempted_at"]
    assert stop is not None and 2 <= stop < 5
    rest = launch_script(SCRIPT, *common, *ck, "--resume", num_processes=2, echo=False, show_command=False, timeout=300)
    done = rest.results[0]["runs"]["run"]
    assert done["start"] == stop
    assert part.results[0]["runs"]["run"]["losses"] + done["losses"] == runs["fsdp2"]["losses"]
    assert done["checksum"] == runs["fsdp2"]["checksum"]


def _full_save(model, opt, step):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True)
    return {"model": get_model_state_dict(model, options=full),
            "optimizer": get_optimizer_state_dict(model, opt, options=full), "step": step}


def _full_load(model, opt, state, with_optimizer=True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=full)
    if with_optimizer:
        set_optimizer_state_dict(model, opt, state["optimizer"], options=full)
    return state["step"]


def _model_only_load(model, opt, state):
    return _full_load(model, opt, state, with_optimizer=False)


def test_resume_drill_is_bit_exact_and_catches_a_missing_optimizer():
    good = launch(resume_drill, _full_save, _full_load, steps=4, stop=2, num_processes=2, show_output=False)
    assert all(r["bitwise_equal"] and r["start"] == 2 and r["full_losses"] == r["resumed_losses"] for r in good)
    bad = launch(resume_drill, _full_save, _model_only_load, steps=4, stop=2, num_processes=2, show_output=False)
    assert not any(r["bitwise_equal"] for r in bad)
