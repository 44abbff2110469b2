"""The unfused LayerNorm/GELU chain equals the library one; its traffic model counts what it should."""
import pytest
import torch

from m11_helpers.fusion import (
    chain_inputs,
    fused_traffic_bytes,
    gelu_tanh_unfused,
    kernel_traffic,
    layernorm_unfused,
    ln_bias_gelu_library,
    ln_bias_gelu_unfused,
    time_fn,
    traffic_bytes,
)


def test_unfused_equals_library():
    x, w, b, bias = chain_inputs(64, 32)
    torch.testing.assert_close(ln_bias_gelu_unfused(x, w, b, bias), ln_bias_gelu_library(x, w, b, bias),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gelu_tanh_unfused(x), torch.nn.functional.gelu(x, approximate="tanh"))
    torch.testing.assert_close(layernorm_unfused(x, w, b), torch.nn.functional.layer_norm(x, (32,), w, b),
                               rtol=1e-5, atol=1e-5)


def test_traffic_counts():
    x, w, b, bias = chain_inputs(64, 32)
    n = x.numel() * 4
    calls = kernel_traffic(lambda t: t * 2.0, x)
    assert [(c.read, c.written) for c in calls] == [(n, n)]  # one kernel: read x, write x·2
    assert fused_traffic_bytes(x, w, b, bias) == 2 * n + 3 * 32 * 4
    unf, lib = traffic_bytes(ln_bias_gelu_unfused, x, w, b, bias), traffic_bytes(ln_bias_gelu_library, x, w, b, bias)
    fused = fused_traffic_bytes(x, w, b, bias)
    assert len(kernel_traffic(ln_bias_gelu_unfused, x, w, b, bias)) >= 15
    assert len(kernel_traffic(ln_bias_gelu_library, x, w, b, bias)) == 3
    assert 15 < unf / fused < 20 and 2.5 < lib / fused < 3.5


def test_bad_input():
    with pytest.raises(ValueError, match="rows"):
        chain_inputs(0, 4)
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, torch.ones(1), repeats=0)
    with pytest.raises(ValueError, match="tensors"):
        fused_traffic_bytes()
