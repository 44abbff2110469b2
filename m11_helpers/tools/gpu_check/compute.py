"""GPU checks on one device: matmul throughput, a training step's MFU, attention kernels, fp16 loss scaling."""

from __future__ import annotations

from m11_helpers.tools.gpu_check.checks import Outcome, Skip, datasheet_chip


def check_matmul(ctx: dict) -> Outcome:
    import torch

    from m11_helpers.timing import time_it

    n, parts = 8192, []
    chip = datasheet_chip(torch.cuda.get_device_name(0))
    before = torch.backends.cuda.matmul.fp32_precision  # the allow_tf32 flags are deprecated after PyTorch 2.9
    for label, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                               ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
        a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
        t = time_it(lambda: a @ b, repeats=5, warmup=2, sync=torch.cuda.synchronize).median
        tflops = 2 * n**3 / t / 1e12
        peak = chip.peak_tflops.get(label) if chip else None
        parts.append(f"{label} {tflops:.0f} TFLOP/s" + (f" ({tflops / peak:.0%} of {peak:g})" if peak else ""))
    torch.backends.cuda.matmul.fp32_precision = before
    return Outcome("; ".join(parts) + (f" — datasheet: {chip.name}" if chip else " — no datasheet row for this GPU"))


def _tokens_per_s(cfg, dtype, batch: int) -> float:
    """Median tokens/s of full training steps (forward, backward, fused AdamW) of the GPT `cfg` on GPU 0."""
    import torch

    from m11_helpers.models import tiny_gpt
    from m11_helpers.timing import time_it

    torch.manual_seed(0)
    model = tiny_gpt(0, cfg=cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = time_it(step, repeats=5, warmup=2, sync=torch.cuda.synchronize).median
    return batch * cfg.seq_len / t


def check_train_step(ctx: dict) -> Outcome:
    import torch

    from m11_helpers.compute_budget import model_flops_utilization
    from m11_helpers.config import GPT2_SMALL, param_count

    chip = datasheet_chip(torch.cuda.get_device_name(0))
    n_params, batch, parts = param_count(GPT2_SMALL), 8, []
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        tokens_s = _tokens_per_s(GPT2_SMALL, dtype, batch)
        torch.cuda.empty_cache()
        peak = chip.peak_flops("bf16" if dtype else "fp32") if chip else None
        # model FLOPs with attention, 6N + 12·L·h·s per token (PaLM, App. B): the course's one MFU
        mfu = model_flops_utilization(tokens_s, GPT2_SMALL, 1, peak) if peak else None
        parts.append(f"{label} {tokens_s:,.0f} tok/s" + (f", MFU {mfu:.0%}" if mfu else ""))
    return Outcome(f"GPT-2 small ({n_params / 1e6:.0f}M), batch {batch}×{GPT2_SMALL.seq_len}: " + "; ".join(parts))


def check_sdpa(ctx: dict) -> Outcome:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = 1, 16, 8192, 64
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    available = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q[:, :, :256], k[:, :, :256], v[:, :, :256], is_causal=True)
            available.append(backend.name.lower())
        except RuntimeError:
            pass

    def peak_bytes(fn) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    def naive():
        scores = (q @ k.transpose(-2, -1)) / d**0.5  # (b, h, s, s): the matrix flash never stores
        mask = torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v

    if "flash_attention" not in available:
        raise Skip(f"no flash backend on this GPU (available: {', '.join(available)})")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = peak_bytes(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    plain = peak_bytes(naive)
    return Outcome(f"backends: {', '.join(available)}; 8k tokens, 16 heads, bf16: flash {flash / 2**20:,.0f} MiB "
                   f"vs naive {plain / 2**30:.1f} GiB ({plain / max(flash, 1):,.0f}×)")


def check_fp16_scaler(ctx: dict) -> Outcome:
    import torch

    from m11_helpers.models import tiny_gpt

    model = tiny_gpt(0).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
    x = torch.randint(0, 64, (4, 32), device="cuda")
    skipped = 0
    for step in range(4):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x, x)
        scaler.scale(loss).backward()
        if step == 1:  # a poisoned gradient: the scaler must skip this step and halve its scale
            next(model.parameters()).grad[0, 0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if all(torch.equal(a, p) for a, p in zip(before, model.parameters())):
            skipped += 1
            if scaler.get_scale() != scale / 2:
                raise AssertionError("the scale was not halved after an inf")
        opt.zero_grad(set_to_none=True)
    if skipped != 1:
        raise AssertionError(f"{skipped} steps skipped, expected exactly the poisoned one")
    return Outcome(f"fp16 autocast + GradScaler('cuda'): the inf step skipped, scale now {scaler.get_scale():g}")
