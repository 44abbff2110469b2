"""FP8 scaling recipes (lesson 06): the MX reference is bit-exact and catches the wrong scales; errors on real tensors."""

import pytest
import torch

from m11_helpers.fp8_lab import error_table, fp8_gemm_speedup, fp8_gemm_times, model_tensors
from m11_helpers.fp8_scaling import (
    E4M3,
    E4M3_MAX,
    dequantize,
    fp8_matmul,
    matmul_error,
    mx_quantize_reference,
    quant_error,
    quantize,
    saturating_cast,
)
from m11_helpers.hardware_specs import chip


def _hostile(seed=0):
    """Blocks of 32 spanning many binades, one all-zero block, one whose amax/X lands in (448, 512)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 128, generator=g) * torch.logspace(-6, 6, 8)[:, None]  # (8, 128)
    x[0, :32] = 0.0
    x[1, 32:64] = torch.linspace(-1, 1, 32)
    x[1, 40] = 500.0 / 256  # block amax 1.95: X = 2^(0 − 8), amax/X = 500 > 448 → saturates
    return x


def test_mx_reference_is_bit_exact_and_the_wrong_scales_are_caught():
    x = _hostile()
    q_ref, s_ref = mx_quantize_reference(x)
    q, s = quantize(x, "mx")
    assert torch.equal(q.view(torch.uint8), q_ref)  # the vectorised recipe agrees byte for byte
    assert torch.equal(s_ref.view(torch.float8_e8m0fnu).float(), s)  # e8m0 bytes are torch's own e8m0 dtype
    assert torch.equal(torch.log2(s), torch.log2(s).round())  # powers of two
    assert s[0, 0] == 2.0 ** -127 and (q[0, :32].float() == 0).all()  # the zero block: smallest scale, zeros
    assert q[1, 40].float() == E4M3_MAX  # saturated, not NaN
    assert not torch.isnan(q.float()).any()
    # wrong answer 1: one power-of-two scale for the whole tensor
    _, e = torch.frexp(x.abs().amax())
    per_tensor = saturating_cast(x / 2.0 ** (e - 1 - 8))
    assert not torch.equal(per_tensor.view(torch.uint8), q_ref)
    # wrong answer 2: a per-block amax/448 scale (not a power of two): elements differ, scales are not e8m0
    q_np2, s_np2 = quantize(x, "deepseek")  # 1×128 amax/448; the 1×32 version differs as well:
    xb = x.reshape(8, 4, 32)
    q32 = saturating_cast(xb / (xb.abs().amax(-1, keepdim=True).clamp(min=1e-30) / E4M3_MAX)).reshape(8, 128)
    assert not torch.equal(q32.view(torch.uint8), q_ref) and not torch.equal(q_np2.view(torch.uint8), q_ref)


def test_dequantize_round_trips_within_e4m3_rounding_and_bad_input_is_refused():
    x = _hostile(1)[2:6]  # binades 1e-3 … 1e1, no special blocks
    for recipe in ("tensorwise", "rowwise", "mx", "deepseek"):
        q, s = quantize(x, recipe)
        assert q.dtype == E4M3 and q.shape == x.shape
        rel = ((dequantize(q, s, recipe) - x) / x).abs()
        assert rel.median() < 2.0 ** -4, recipe
    with pytest.raises(ValueError, match="recipe"):
        quantize(x, "blockwise")
    with pytest.raises(ValueError, match="groups"):
        quantize(torch.ones(4, 48), "mx")
    with pytest.raises(ValueError, match="block"):
        mx_quantize_reference(torch.ones(4, 48))


def test_fp8_matmul_is_the_dequantised_product_and_bf16_is_closer():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 256, generator=g), torch.randn(256, 128, generator=g)  # (M, K), (K, N)
    for recipe in ("tensorwise", "rowwise", "mx"):
        qa, sa = quantize(a, recipe)
        qb, sb = quantize(b.t().contiguous(), recipe)
        ref = dequantize(qa, sa, recipe) @ dequantize(qb, sb, recipe).t()
        torch.testing.assert_close(fp8_matmul(a, b, recipe), ref, rtol=1e-5, atol=1e-4)
    err = matmul_error(a, b)
    assert err["bf16"] < 0.01 < min(err[r] for r in ("tensorwise", "rowwise", "mx", "deepseek")) < 0.1


def test_error_table_on_the_course_model_ranks_the_recipes_under_an_outlier():
    tensors = model_tensors(steps=2, batch=4)
    degraded = error_table(tensors)
    hot = degraded["activation + outlier (injected)"]
    assert hot["tensorwise"] > 2 * hot["rowwise"] and hot["rowwise"] > hot["mx"]  # finer groups save entries
    assert hot["tensorwise"] > 10 * degraded["activation"]["tensorwise"]
    assert degraded["activation"]["mx"] > degraded["activation"]["rowwise"]  # MX's floor scale saturates some
    for name, t in tensors.items():
        assert quant_error(t, "rowwise")["typical_error"] < 2.0 ** -4, name


def test_fp8_pays_only_for_large_gemms():
    h100 = chip("H100 SXM")
    assert fp8_gemm_speedup(h100, 512, 1024, 256) < 1 < fp8_gemm_speedup(h100, 8192, 8192, 8192) < 2
    assert fp8_gemm_speedup(h100, 8192, 8192, 8192, cast_bytes_per_element=0) == pytest.approx(2, rel=1e-3)
    t = fp8_gemm_times(h100, 4096, 4096, 4096)
    assert t["casts"] == pytest.approx(2 * 4096 * 4096 * 5 / h100.bandwidth)
    with pytest.raises(ValueError, match="fp8"):
        fp8_gemm_speedup(chip("A100 SXM 80GB"), 1024, 1024, 1024)
