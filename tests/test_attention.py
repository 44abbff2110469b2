"""Tiled / FlashAttention-style attention against the naive reference; byte formulas against the paper."""

import pytest
import torch

from m11_helpers.activations import activation_bytes
from m11_helpers.attention import (
    A100_SRAM_BYTES,
    attention_matrix_bytes,
    flash_attention,
    flash_block_sizes,
    flash_hbm_elements,
    max_seq_len_for_budget,
    naive_attention,
    online_softmax_update,
    qkvo_bytes,
    saved_bytes_by_method,
    sdpa_kernels,
    standard_hbm_elements,
    tiled_attention,
)
from m11_helpers.config import RUNNING_EXAMPLE
from m11_helpers.op_trace import largest_intermediate, trace_dispatch


def qkv(B=2, H=2, T=19, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,bk", [(1, 1), (4, 7), (8, 8), (32, 32)])
def test_tiled_equals_naive(causal, bq, bk):
    q, k, v = qkv()
    torch.testing.assert_close(tiled_attention(q, k, v, bq, bk, causal), naive_attention(q, k, v, causal))


def test_matches_sdpa():
    q, k, v = qkv(dtype=torch.float32)
    for causal in (False, True):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(naive_attention(q, k, v, causal), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,bk", [(4, 7), (8, 8)])
def test_flash_gradients_equal_naive(causal, bq, bk):
    q, k, v = qkv()
    do = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(1))
    ref = torch.autograd.grad(naive_attention(q, k, v, causal), (q, k, v), do)
    out = flash_attention(q, k, v, bq, bk, causal)
    torch.testing.assert_close(out, naive_attention(q, k, v, causal))
    for g, r in zip(torch.autograd.grad(out, (q, k, v), do), ref):
        torch.testing.assert_close(g, r)


def test_online_update_one_block_equals_softmax_of_two():
    g = torch.Generator().manual_seed(0)
    s1, s2 = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    v1, v2 = torch.randn(4, 2, generator=g, dtype=torch.float64), torch.randn(5, 2, generator=g, dtype=torch.float64)
    m = torch.full((3, 1), float("-inf"), dtype=torch.float64)
    l, o = torch.zeros(3, 1, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.float64)
    m, l, o = online_softmax_update(m, l, o, s1, v1)
    m, l, o = online_softmax_update(m, l, o, s2, v2)
    s = torch.cat([s1, s2], 1)
    torch.testing.assert_close(o / l, s.softmax(-1) @ torch.cat([v1, v2]))
    torch.testing.assert_close(m, s.amax(-1, keepdim=True))
    torch.testing.assert_close(l, torch.exp(s - m).sum(-1, keepdim=True))


def test_fully_masked_block_gives_no_nan():
    m, l, o = torch.full((2, 1), float("-inf")), torch.zeros(2, 1), torch.zeros(2, 3)
    m2, l2, o2 = online_softmax_update(m, l, o, torch.full((2, 4), float("-inf")), torch.ones(4, 3))
    assert not torch.isnan(o2).any() and (l2 == 0).all()


def test_saved_bytes_naive_quadratic_flash_linear():
    a, b = saved_bytes_by_method(64), saved_bytes_by_method(128)
    assert b["flash (ours)"] == 2 * a["flash (ours)"]  # O(s): q, k, v, O and the logsumexp
    if any("flash" in op for op in sdpa_kernels(128)):  # SDPA's backend is the build's choice
        assert b["flash (ours)"] == b["sdpa"]  # saves exactly what PyTorch's own flash kernel saves
    assert b["naive"] / b["flash (ours)"] > 1.4 * a["naive"] / a["flash (ours)"]  # naive grows faster: s²


def test_byte_formulas_and_the_claim():
    # the claim "2× at 512, 8× at 2048, 32× at 8192" is s²/(4sd) with d = 64: linear in s
    for s, ratio in [(512, 2), (2048, 8), (8192, 32)]:
        assert attention_matrix_bytes(1, 1, s, 2) / qkvo_bytes(1, 1, s, 64, 2) == ratio
    assert attention_matrix_bytes(1, 32, 4096, 2) == 2**30  # the 7B running example: 1 GiB per layer
    s = max_seq_len_for_budget(2**30, 1, 32, 2)
    assert s == 4096 and attention_matrix_bytes(1, 32, s + 1, 2) > 2**30
    for budget in (1, 7.5, 1e3, 123_456_789):  # the largest s that fits, whatever the rounding of the square root
        s = max_seq_len_for_budget(budget, 2, 3, 4)
        assert (s == 0 or attention_matrix_bytes(2, 3, s, 4) <= budget) and attention_matrix_bytes(2, 3, s + 1, 4) > budget
    assert max_seq_len_for_budget(1, 2, 3, 4) == 0  # not even one token's scores fit


def test_hbm_model_theorem2():
    N, d, M = 1024, 64, A100_SRAM_BYTES // 2  # GPT-2 medium head dim, A100 SRAM 192 KiB in fp16 elements
    assert M == 98_304  # Dao et al. 2022, §2.1: 192 KB per SM
    assert standard_hbm_elements(N, d) == 4 * N * d + 4 * N * N
    assert flash_block_sizes(d, M) == (64, 384)
    ratio = standard_hbm_elements(N, d) / flash_hbm_elements(N, d, M)
    assert 5 < ratio < 12  # the paper measures 40.3 GB / 4.4 GB = 9.2× (Fig. 2, left)
    big = standard_hbm_elements(65536, d) / flash_hbm_elements(65536, d, M)
    assert abs(big - M / (3 * d * d)) < 0.5  # tends to M/(3d²): a constant, not O(N)
    # Algorithm 1 by hand, N = 8, d = 2, M = 16: B_c = ⌈16/8⌉ = 2, B_r = min(2, 2) = 2, T_c = 4
    init, kv, per_pass = 8 * 2 + 2 * 8, 2 * 8 * 2, 3 * 8 * 2 + 4 * 8  # line 2; K, V once; Q, O, ℓ, m per pass
    assert flash_hbm_elements(8, 2, 16) == init + kv + 4 * per_pass


def test_score_matrix_is_the_activation_models_s2_term():
    # the 7B's one s² tensor per layer (softmax output, bf16, no dropout) is what the kit's activation model counts
    kit = activation_bytes(RUNNING_EXAMPLE, 1)["breakdown"]["attention scores"]
    assert attention_matrix_bytes(1, RUNNING_EXAMPLE.heads, RUNNING_EXAMPLE.seq_len, 2) == kit == 2**30
    assert attention_matrix_bytes(3, 5, 7, 4) == 3 * 5 * 7 * 7 * 4  # b·h·s²·bytes for any shape


def test_sdpa_kernels_names_an_attention_kernel():
    ops = sdpa_kernels(32)
    assert ops and all("attention" in op for op in ops)


def test_trace_dispatch_sees_the_fused_kernel_and_the_matrix():
    q, k, v = qkv(B=1, H=2, T=32, D=8, dtype=torch.float32)
    sdpa = trace_dispatch(torch.nn.functional.scaled_dot_product_attention, q, k, v)
    assert any("scaled_dot_product" in op for op in sdpa.ops) and sdpa.largest_numel < 2 * 32 * 32
    naive = trace_dispatch(naive_attention, q, k, v)
    assert not any("scaled_dot_product" in op for op in naive.ops) and naive.largest_numel == 2 * 32 * 32
    torch.testing.assert_close(naive.out, sdpa.out)


def test_bad_input():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention(q, k, v, 0, 4)
    with pytest.raises(ValueError, match="q, k, v"):
        naive_attention(q, k[..., :3, :], v)
    with pytest.raises(ValueError, match="seq_len"):
        attention_matrix_bytes(1, 1, 0)
    with pytest.raises(ValueError, match="dtype_bytes"):
        attention_matrix_bytes(1, 1, 8, 3)
    with pytest.raises(ValueError, match="M"):
        flash_block_sizes(64, 8)


def test_largest_intermediate_sees_the_matrix():
    q, k, v = qkv(B=1, H=2, T=64, D=8)
    assert largest_intermediate(naive_attention, q, k, v)[0] == 2 * 64 * 64  # B·H·T·T (matmul may show it as (2, 64, 64))
    n, _ = largest_intermediate(tiled_attention, q, k, v, 16, 16)
    assert n == 1 * 2 * 64 * 8  # the output; no tile is bigger than (1, 2, 16, 16)
