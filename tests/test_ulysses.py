"""Ulysses context parallelism on 4 real ranks: equal to full attention (forward and gradients), bytes against the ring."""

import pytest
import torch
import torch.nn.functional as F

from m11_helpers.context_parallel import ring_bytes_per_rank, shard_sequence, unshard_sequence
from m11_helpers.launch import launch
from m11_helpers.ulysses import check_heads, choose_cp, ulysses_bytes_per_rank

B, H, T, D = 1, 4, 16, 8


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(4)]  # q, k, v, dout


def _rank():
    import torch.distributed as dist

    from m11_helpers.context_parallel import ring_attention
    from m11_helpers.launch import rank_device
    from m11_helpers.ulysses import ulysses_attention

    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, fn in (("ulysses", ulysses_attention), ("ring", ring_attention)):
        q, k, v, do = (shard_sequence(t.to(rank_device()), rank, n).clone().requires_grad_(i < 3)
                       for i, t in enumerate(_inputs()))
        stats: dict = {}
        o = fn(q, k, v, causal=True, stats=stats)
        o.backward(do)
        out[name] = {"out": o.detach(), "grads": [t.grad for t in (q, k, v)], "stats": stats}
    try:
        ulysses_attention(*(torch.zeros(B, 2, T // n, D) for _ in range(3)))
    except ValueError as err:
        out["too_few_heads"] = str(err)
    return out


def test_ulysses_equals_full_attention_and_sends_less_than_the_ring():
    q, k, v, do = (t.clone().requires_grad_(i < 3) for i, t in enumerate(_inputs()))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.backward(do)
    results = launch(_rank, num_processes=4, timeout=60)
    for name in ("ulysses", "ring"):
        torch.testing.assert_close(unshard_sequence([r[name]["out"] for r in results]), ref.detach(), atol=1e-5, rtol=1e-5)
        for j, want in enumerate((q.grad, k.grad, v.grad)):
            got = unshard_sequence([r[name]["grads"][j] for r in results])
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"{name} grad {j}")
    s = results[1]["ulysses"]["stats"]
    want = ulysses_bytes_per_rank(T, 4, H * D, dtype_bytes=4)
    assert s["all_to_alls"] == 8 and s["bytes_sent"] == want["forward"] and s["bytes_sent_backward"] == want["backward"]
    ring = results[1]["ring"]["stats"]
    assert ring["bytes_sent"] == ring_bytes_per_rank(T, 4, H * D, dtype_bytes=4)["forward"]
    assert ring["bytes_sent"] == 2 * s["bytes_sent"]  # ring / Ulysses = N/2 at equal K/V width: 2 at N = 4
    assert "heads (2) must be a multiple" in results[0]["too_few_heads"]


def test_head_limit():
    check_heads(8, 4)
    with pytest.raises(ValueError, match="heads"):
        check_heads(6, 4)


def test_choose_ring_all_to_all_or_both():
    assert choose_cp(4, 8, 8) == {"ulysses": 4, "ring": 1, "kind": "ulysses"}  # fits in a node, enough heads
    assert choose_cp(16, 8, 8) == {"ulysses": 8, "ring": 2, "kind": "ulysses × ring"}  # USP: a2a in node, ring across
    assert choose_cp(16, 1, 8)["kind"] == "ring"  # multi-query attention: one K/V head, no all-to-all
    assert choose_cp(32, 8, 4) == {"ulysses": 4, "ring": 8, "kind": "ulysses × ring"}
    with pytest.raises(ValueError, match="kv_heads"):
        choose_cp(4, 0, 8)
