"""FlashAttention's tiled backward (lesson 09) against autograd, with no (T, T) tensor at large T; FlexAttention on CPU."""

import pytest
import torch

from m11_helpers.attention import flash_attention, naive_attention, step_memory, tiled_attention
from m11_helpers.flash_backward import allocation_profile, flash_backward, largest_allocation
from m11_helpers.flex_masks import (
    block_sparsity,
    document_ids,
    document_mask,
    flex_document_attention,
    reference_document_attention,
)


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_backward_matches_autograd_through_full_attention(causal):
    g = torch.Generator().manual_seed(0)
    T = 72  # not a multiple of either block: ragged last tiles
    q, k, v = (torch.randn(2, 3, T, 16, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    o = naive_attention(q, k, v, causal=causal)
    do = torch.randn_like(o)
    ref = torch.autograd.grad(o, (q, k, v), do)
    with torch.no_grad():
        o_t, lse = tiled_attention(q, k, v, 16, 16, causal, return_lse=True)
        got = flash_backward(q, k, v, o_t, lse, do, block_q=16, block_k=32, causal=causal)
    for name, r, x in zip("qkv", ref, got):
        torch.testing.assert_close(x, r, msg=lambda m, n=name: f"d{n}: {m}")
    # the autograd.Function of m11_helpers.attention runs the same backward
    auto = torch.autograd.grad(flash_attention(q, k, v, 16, 16, causal), (q, k, v), do)
    for r, x in zip(ref, auto):
        torch.testing.assert_close(x, r)
    # a wrong answer is caught: forgetting D_i = rowsum(dO ∘ O) (using dP instead of dP − D)
    wrong = flash_backward(q.detach(), k.detach(), v.detach(), torch.zeros_like(o_t), lse, do, 16, 32, causal)
    assert not torch.allclose(wrong[0], ref[0])
    with pytest.raises(ValueError, match="lse"):
        flash_backward(q, k, v, o_t, lse[..., 0], do)


def test_no_tensor_of_t_by_t_exists_at_large_t_and_the_tracker_sees_one_in_full_attention():
    g = torch.Generator().manual_seed(1)
    T, D, blk = 2048, 16, 256  # (T, T) in fp32 = 16 MiB; one tile = 256 KiB
    q, k, v, do = (torch.randn(1, 1, T, D, generator=g) for _ in range(4))
    o, lse = tiled_attention(q, k, v, blk, blk, causal=True, return_lse=True)
    prof = allocation_profile(lambda: flash_backward(q, k, v, o, lse, do, blk, blk, causal=True))
    assert prof["largest"] <= max(blk * blk, T * D) * 4, prof  # a tile, or one gradient (T, D)
    assert prof["largest"] * 64 <= T * T * 4
    assert prof["peak_live"] < 8 * T * D * 4 + 8 * blk * blk * 4, prof  # dq, dk, dv, D and a few tiles
    # the same tracker does see the (T, T) matrix of full attention's backward (at a T that fits easily)
    small = [t[..., :512, :].clone().requires_grad_() for t in (q, k, v)]

    def full():
        return torch.autograd.grad(naive_attention(*small, causal=True), small, do[..., :512, :])
    assert largest_allocation(full) >= 512 * 512 * 4
    # the lesson's table (attention.step_memory): whole forward + backward through autograd, naive vs recomputing
    mem = step_memory(512, head_dim=16, block=128)
    naive, flash = mem["naive (autograd)"], mem["flash (recompute)"]
    assert naive["largest"] >= 512 * 512 * 4 > 8 * flash["largest"] and naive["peak_live"] > 4 * flash["peak_live"]


def test_flex_attention_document_mask_and_score_mod_match_the_dense_reference_on_cpu():
    doc = document_ids([100, 90, 66])  # three packed documents, T = 256
    assert document_mask(doc)[120].sum() == 21 and not document_mask(doc)[120, 99]
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    for causal, cap in ((True, None), (False, None), (True, 2.0)):
        out = flex_document_attention(q, k, v, doc, causal=causal, soft_cap=cap, block=64)
        torch.testing.assert_close(out, reference_document_attention(q, k, v, doc, causal, cap), atol=1e-5, rtol=1e-4)
    capped = flex_document_attention(q, k, v, doc, soft_cap=2.0, block=64)
    assert not torch.allclose(capped, reference_document_attention(q, k, v, doc, True, None), atol=1e-3)
    # tiles skipped: causal alone skips 6 of 16 (64-wide) tiles; the document mask skips 9
    assert block_sparsity(torch.zeros(256, dtype=torch.long), 64) == pytest.approx(6 / 16)
    assert block_sparsity(doc, 64) == pytest.approx(9 / 16)
    with pytest.raises(ValueError, match="doc"):
        flex_document_attention(q, k, v, doc[:-1])
