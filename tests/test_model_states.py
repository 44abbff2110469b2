"""model_states.py: bytes per parameter by layout, against the ZeRO paper, real optimizer state and a real DDP step."""

import pytest
import torch
from torch import nn

from m11_helpers.config import RUNNING_EXAMPLE, TINY_GPT, param_count
from m11_helpers.data import tokens
from m11_helpers.launch import launch
from m11_helpers.model_states import (
    LAYOUTS,
    MEGATRON_CORE_TABLE,
    Layout,
    as_layout,
    bytes_per_param,
    gradient_bytes,
    model_state_bytes,
)
from m11_helpers.models import tiny_gpt

PSI_7B = param_count(RUNNING_EXAMPLE)


def test_zero_paper_figure_1():
    # Rajbhandari et al. 2020, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12 → 120, 31.4, 16.6, 1.9 GB per GPU
    got = [model_state_bytes(7_500_000_000, "deepspeed", world_size=64, zero_stage=s)["total"] for s in range(4)]
    assert got == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert [round(g / 1e9, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("d", [1, 8, 64])
def test_megatron_core_distributed_optimizer_table(d):
    # Megatron Core docs, Distributed Optimizer: bf16 params + fp32 grads 18 | 6 + 12/d; fp32 16 | 8 + 8/d
    psi = 64 * 1000
    for layout, key in (("megatron", ("bf16", "fp32")), ("fp32", ("fp32", "fp32"))):
        whole, (a, b) = MEGATRON_CORE_TABLE[key]
        assert bytes_per_param(layout)["total"] == whole
        assert model_state_bytes(psi, layout, world_size=d, zero_stage=1)["total"] == a * psi + b * psi // d
    assert gradient_bytes(psi, "megatron") == 4 * psi  # fp32 main gradients are what is reduced


def test_documented_totals_and_parts():
    totals = {name: bytes_per_param(name)["total"] for name in LAYOUTS}
    assert totals == {"fp32": 16, "autocast": 16, "autocast+bf16-hook": 16, "megatron": 18, "deepspeed": 16,
                      "fsdp2-mp": 16, "pure-bf16": 8}
    assert bytes_per_param("deepspeed") == {"weights": 2, "grads": 2, "master": 4, "optimizer": 8, "total": 16}
    assert bytes_per_param("megatron") == {"weights": 2, "grads": 4, "master": 4, "optimizer": 8, "total": 18}
    assert bytes_per_param("autocast") == {"weights": 4, "grads": 4, "master": 0, "optimizer": 8, "total": 16}
    for lay in LAYOUTS.values():
        assert lay.framework and lay.source and lay.title and lay.grad_reduce_bytes in (2, 4)
    assert as_layout(LAYOUTS["fp32"]) is LAYOUTS["fp32"]
    assert model_state_bytes(10, layout="fp32")["total"] == 160  # the keyword common.md documents


def test_zero_stages_shard_the_right_parts_with_padding():
    # ZeRO §5.1: P_os shards optimizer (+ master), P_os+g also grads, P_os+g+p also weights; ⌈Ψ/N⌉ per rank
    psi, n = 10, 3
    s1 = model_state_bytes(psi, "deepspeed", n, 1)
    assert s1 == {"weights": 20, "grads": 20, "master": 16, "optimizer": 32, "total": 88}
    s2 = model_state_bytes(psi, "deepspeed", n, 2)
    assert (s2["grads"], s2["weights"]) == (8, 20)
    s3 = model_state_bytes(psi, "deepspeed", n, 3)
    assert s3["total"] == 16 * 4
    assert model_state_bytes(psi, "fsdp2-mp", n, 3)["total"] == 16 * 4  # FSDP2: fp32 shards + grads + Adam
    big = model_state_bytes(PSI_7B, "deepspeed", 8, 1)["total"]
    assert big == 4 * PSI_7B + 12 * (PSI_7B // 8)  # 4Ψ + 12Ψ/N, Ψ divisible by 8


def test_gradient_bytes_autocast_vs_bf16():
    # under autocast DDP moves fp32 gradients (27 GB for the 7B), not "13.5 GB of bf16"
    assert gradient_bytes(PSI_7B, "autocast") == 4 * PSI_7B
    assert round(gradient_bytes(PSI_7B, "autocast") / 1e9, 1) == 27.0
    assert round(gradient_bytes(PSI_7B, "autocast+bf16-hook") / 1e9, 1) == 13.5
    assert gradient_bytes(PSI_7B, "megatron") == gradient_bytes(PSI_7B, "fsdp2-mp") == 4 * PSI_7B


def _one_adamw_step(model: nn.Module, autocast: bool) -> torch.optim.AdamW:
    x, y = tokens(4, seed=0).tensors
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, y)
    loss.backward()
    opt.step()
    return opt


def _measured_states(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int, int, int]:
    params = list(model.parameters())
    weights = sum(p.nbytes for p in params)
    grads = sum(p.grad.nbytes for p in params)
    moments = sum(opt.state[p][k].nbytes for p in params for k in ("exp_avg", "exp_avg_sq"))
    steps = sum(opt.state[p]["step"].nbytes for p in params)
    return weights, grads, moments, steps


@pytest.mark.parametrize("name, autocast, cast", [("autocast", True, None), ("fp32", False, None),
                                                   ("pure-bf16", False, torch.bfloat16)])
def test_layout_equals_real_adamw_state(name, autocast, cast):
    model = tiny_gpt(0)
    assert not list(model.buffers())  # the tiny GPT has no buffers: parameters are all its state
    if cast is not None:
        model = model.to(cast)
    psi = sum(p.numel() for p in model.parameters())
    assert psi == param_count(TINY_GPT)
    opt = _one_adamw_step(model, autocast)
    weights, grads, moments, steps = _measured_states(model, opt)
    want = bytes_per_param(name)
    assert (weights, grads, moments) == (want["weights"] * psi, want["grads"] * psi, want["optimizer"] * psi)
    assert want["master"] == 0  # none of these keeps a master copy
    # AdamW's `step` counter: one 4-byte scalar per parameter tensor, the one state the layouts leave out
    assert steps == 4 * len(list(model.parameters()))


def test_autocast_gradients_are_fp32():
    model = tiny_gpt(0)
    x, y = tokens(4, seed=0).tensors
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = model(x, y)
    assert logits.dtype == torch.bfloat16  # the matmuls ran in bf16 ...
    loss.backward()
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}  # ... the gradients are fp32
    assert LAYOUTS["autocast"].grads == 4 and LAYOUTS["autocast"].grad_reduce_bytes == 4


def _ddp_step_bytes(hook_name: str) -> dict:
    """One DDP step of the tiny GPT under bf16 autocast: bytes this rank hands to all_reduce, via DDP's comm hook."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.grading.observe import record_comm

    inner = {"allreduce": default_hooks.allreduce_hook, "bf16": default_hooks.bf16_compress_hook}[hook_name]
    sent = []

    def recording_hook(state, bucket):  # what the hook hands to all_reduce: the bytes on the wire per step
        with record_comm() as log:
            fut = inner(state, bucket)
        sent.append(log.bytes("all_reduce"))
        return fut

    model = DDP(tiny_gpt(0))
    model.register_comm_hook(None, recording_hook)
    x, y = tokens(8, seed=dist.get_rank()).tensors
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    return {"sent": sum(sent), "psi": sum(p.numel() for p in model.parameters()),
            "grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters()})}


@pytest.mark.parametrize("hook, name", [("allreduce", "autocast"), ("bf16", "autocast+bf16-hook")])
def test_ddp_under_autocast_reduces_the_layouts_gradient_bytes(hook, name):
    for r in launch(_ddp_step_bytes, hook, num_processes=2, timeout=120, show_output=False):
        assert r["grad_dtypes"] == ["torch.float32"]
        assert r["sent"] == gradient_bytes(r["psi"], name)


def test_bad_input():
    with pytest.raises(ValueError, match="layout"):
        bytes_per_param("fp8")
    with pytest.raises(ValueError, match="num_params"):
        model_state_bytes(0, "fp32")
    with pytest.raises(ValueError, match="num_params"):
        gradient_bytes(7.5e9, "fp32")  # a count of parameters is an integer: pass 7_500_000_000
    with pytest.raises(ValueError, match="world_size"):
        model_state_bytes(10, "fp32", world_size=0)
    with pytest.raises(ValueError, match="zero_stage"):
        model_state_bytes(10, "fp32", 8, zero_stage=4)
    custom = Layout("mine", 2, 2, 4, 8, 2, "me", "here")
    assert bytes_per_param(custom)["total"] == 16 == custom.total
