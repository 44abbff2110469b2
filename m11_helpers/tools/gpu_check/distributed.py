"""GPU checks through the course's launchers: NCCL, FSDP2, DCP, the reference script, the notebooks."""

from __future__ import annotations

import time

from m11_helpers.launch.base import gpu_count  # counted through NVML: CUDA stays uninitialised until launch()
from m11_helpers.tools.gpu_check.checks import Outcome


def _nccl_all_reduce() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item()


def check_nccl_launch(ctx: dict) -> Outcome:
    from m11_helpers.launch import launch

    n = gpu_count()
    out = launch(_nccl_all_reduce, num_processes=n, device="cuda", timeout=120, show_output=False)
    expected = n * (n + 1) / 2
    if out != [expected] * n:
        raise AssertionError(f"all-reduce gave {out}, expected {expected} on every rank")
    note = "" if n > 1 else " (one GPU: one rank; the multi-rank NCCL checks need ≥ 2 GPUs)"
    return Outcome(f"{n} rank(s), NCCL all-reduce = {expected:g} on every rank{note}")


def _fsdp2_step() -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from m11_helpers.models import tiny_gpt

    mesh = init_device_mesh("cuda", (torch.distributed.get_world_size(),))
    model = tiny_gpt(0).cuda()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    x = torch.randint(0, 64, (4, 32), device="cuda")
    loss = model(x, x)
    loss.backward()
    grad = next(p for p in model.parameters() if p.grad is not None).grad
    return {"loss": loss.item(), "param_dtype": str(next(model.parameters()).dtype),
            "grad_dtype": str(grad.dtype)}


def check_fsdp2(ctx: dict) -> Outcome:
    from m11_helpers.launch import launch

    out = launch(_fsdp2_step, num_processes=1, device="cuda", timeout=180, show_output=False)[0]
    return Outcome(f"FSDP2 + MixedPrecisionPolicy(bf16 params, fp32 reduce), 1 rank: loss {out['loss']:.3f}, "
                   f"sharded params {out['param_dtype']}, grads {out['grad_dtype']}")


def check_reference_script(ctx: dict) -> Outcome:
    import subprocess
    import sys

    from m11_helpers.launch import launch_script
    from m11_helpers.resources import script_path

    script = script_path("train.py")
    flags = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                           timeout=120).stdout
    args = ["--steps", "5"] if "--steps" in flags else []
    args += ["--ac"] if "--ac" in flags else []
    start = time.monotonic()
    run = launch_script("train.py", *args, num_processes=1, device="cuda", timeout=300, echo=False,
                        show_command=False)
    last = run.results[0] if run.results else {}
    shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in last.items()
                      if k in ("loss", "tokens_per_s", "mfu", "final_loss"))
    return Outcome(f"train.py {' '.join(args)} on 1 GPU in {time.monotonic() - start:.0f} s" + (f": {shown}" if shown else ""))


def _dcp_round_trip(folder: str) -> bool:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.randn(256, 256, device="cuda")}
    dcp.save(state, checkpoint_id=folder)
    loaded = {"w": torch.zeros(256, 256, device="cuda")}
    dcp.load(loaded, checkpoint_id=folder)
    return bool(torch.equal(state["w"], loaded["w"])) and loaded["w"].is_cuda


def check_dcp(ctx: dict) -> Outcome:
    import tempfile

    from m11_helpers.launch import launch

    with tempfile.TemporaryDirectory() as folder:
        ok = launch(_dcp_round_trip, folder, num_processes=1, device="cuda", timeout=120, show_output=False)[0]
    if not ok:
        raise AssertionError("the loaded GPU tensor differs from the saved one")
    return Outcome("torch.distributed.checkpoint save/load of a CUDA tensor: bit-identical")
