"""The unfused LayerNorm/GELU chain equals the library one; its traffic model counts what it should."""
import pytest
import torch

from m11_helpers.fusion import (
    chain_inputs,
    fused_traffic_bytes,
    gelu_tanh_unfused,
    group_traffic,
    kernel_graph,
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


def test_graph_names_views_and_in_place():
    a = torch.ones(3, 4)
    g = kernel_graph(lambda t: (t.t() * 2).sum(0), a, names=("a",))
    assert [(k.op, k.reads, k.writes) for k in g.kernels] == [("mul.Tensor", ("a",), ("t1",)),
                                                              ("sum.dim_IntList", ("t1",), ("t2",))]  # t(): no kernel
    assert g.outputs == ("t2",) and g.nbytes == {"a": 48, "t1": 48, "t2": 12}
    g = kernel_graph(lambda t: t.mul_(2), a.clone(), names=("a",))
    assert g.kernels[0].writes == ("a",)  # in place: the result is the input's memory
    g = kernel_graph(lambda t: t * t, a, names=("a",))
    assert g.kernels[0].reads == ("a",)  # x * x reads x once


def test_group_traffic_between_eager_and_one_kernel():
    x, w, b, bias = chain_inputs(64, 32)
    g = kernel_graph(ln_bias_gelu_unfused, x, w, b, bias, names=("x", "w", "b", "bias"))
    n = len(g.kernels)
    assert n == 19
    eager = group_traffic(g, [[i] for i in range(n)])
    assert eager == traffic_bytes(ln_bias_gelu_unfused, x, w, b, bias)
    assert group_traffic(g, [list(range(n))]) == fused_traffic_bytes(x, w, b, bias)
    # LayerNorm (kernels 0-8) as one kernel, + bias and GELU (9-18) as another: t9 = LN(x) is written once, read once
    two = group_traffic(g, [list(range(9)), list(range(9, n))])
    assert two == fused_traffic_bytes(x, w, b, bias) + 2 * x.numel() * 4
    # the centred x (t2) is read by two later groups: written once, read by each
    split = group_traffic(g, [[0, 1], [2, 3, 4, 5], list(range(6, n))])
    t = g.nbytes
    assert split == (t["x"] + t["t2"]) + (t["t2"] + t["t5"]) + (t["t2"] + t["t5"] + 3 * 128 + t["t19"])
    lib = kernel_graph(ln_bias_gelu_library, x, w, b, bias)
    assert group_traffic(lib, [[0], [1], [2]]) == traffic_bytes(ln_bias_gelu_library, x, w, b, bias)
    with pytest.raises(ValueError, match="groups"):
        group_traffic(g, [[0, 2], [1]])


def test_bad_input():
    with pytest.raises(ValueError, match="rows"):
        chain_inputs(0, 4)
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, torch.ones(1), repeats=0)
    with pytest.raises(ValueError, match="tensors"):
        fused_traffic_bytes()
    with pytest.raises(ValueError, match="names"):
        kernel_graph(lambda t: t, torch.ones(1), names=("a", "b"))
