"""Expert parallelism on 4 real gloo ranks against the dense single-process MoE layer, with and without dropping.

One launch also runs the bias-balanced layer (moe_balance) and the lesson's own `long_context_runs.ep_run`.
"""

import math

import pytest
import torch
import torch.distributed as dist

from m11_helpers import expert_parallel as ep
from m11_helpers.expert_parallel import (
    ExpertParallelMoE,
    MoELayer,
    all_to_all_bytes,
    dp_all_reduce_bytes,
    expert_capacity,
    load_balancing_loss,
    route,
)
from m11_helpers.grading.observe import record_comm
from m11_helpers.launch import launch
from m11_helpers.long_context_runs import ep_run

H, E, K, TOKENS = 16, 8, 2, 64


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(TOKENS, H, generator=g, dtype=torch.float64), torch.randn(TOKENS, H, generator=g, dtype=torch.float64)


def _moe(cf):
    return MoELayer(H, E, top_k=K, ffn_hidden=24, capacity_factor=cf, seed=0, dtype=torch.float64)


def _on_ranks():
    r, n = dist.get_rank(), dist.get_world_size()
    x, w = _data()
    out = {}
    for cf in (None, 1.0, 0.5):
        moe = _moe(cf)
        layer = ExpertParallelMoE(moe)
        xl = x.chunk(n)[r].clone().requires_grad_()
        ep.COMM.clear()
        with record_comm() as log:
            y, aux = layer(xl)
            (y * w.chunk(n)[r]).sum().backward()
        dist.all_reduce(moe.router.weight.grad)  # the router is replicated: data-parallel gradient
        out[cf] = {"y": y.detach(), "dx": xl.grad, "aux": aux.item(), "router": moe.router.weight.grad,
                   "experts": {k: p.grad for k, p in layer.local.named_parameters()}, "comm": ep.COMM.table(),
                   "ops": log.ops(), "dropped": layer.last_dropped}
    moe, xs = _skewed()  # every token to rank 0's experts: ranks 1-3's experts get none
    xl = xs.chunk(n)[r].clone().requires_grad_()
    y, _ = ExpertParallelMoE(moe)(xl)
    (y * w.chunk(n)[r]).sum().backward()  # hung on ranks 1-3 when their empty experts left the graph
    out["skewed"] = {"y": y.detach(), "dx": xl.grad}
    out["biased"] = _ep_rank(None)  # DeepSeek-V3's bias under EP (moe_balance), in the same launch
    out["ep_run"] = ep_run((None, 1.0))  # the lesson's own run (long_context_runs), in the same launch
    return out


def _skewed():
    """A dropless layer whose router sends every token to experts 0 and 1 (rank 0's): feature 0 is 10 for all
    tokens, and its router weight +5 for those two experts, −5 for the rest."""
    moe = _moe(None)
    with torch.no_grad():
        moe.router.weight[:, 0] = torch.where(torch.arange(E) < E // 4, 5.0, -5.0)
    x, _ = _data()
    x[:, 0] = 10.0
    return moe, x


@pytest.fixture(scope="module")
def results():
    return launch(_on_ranks, num_processes=4, timeout=120, show_output=False)


@pytest.mark.parametrize("cf", [None, 1.0, 0.5])
def test_expert_parallel_equals_the_dense_layer(results, cf):
    moe = _moe(cf)
    x, w = _data()
    x.requires_grad_()
    y, aux = moe(x, groups=4)  # each rank's tokens are one capacity group
    (y * w).sum().backward()
    got = [r[cf] for r in results]
    torch.testing.assert_close(torch.cat([g["y"] for g in got]), y.detach())
    torch.testing.assert_close(torch.cat([g["dx"] for g in got]), x.grad)
    torch.testing.assert_close(got[0]["router"], moe.router.weight.grad)
    for rank, g in enumerate(got):
        for i in range(E // 4):
            torch.testing.assert_close(g["experts"][f"{i}.w2.weight"], moe.experts[rank * 2 + i].w2.weight.grad)
    assert sum(g["aux"] for g in got) / 4 == pytest.approx(aux.item())
    assert sum(g["dropped"] for g in got) == moe.last_dropped
    if cf is None:
        assert moe.last_dropped == 0


def test_ranks_whose_experts_get_no_token_still_run_backward(results):
    moe, x = _skewed()
    _, w = _data()
    x.requires_grad_()
    y, _ = moe(x, groups=4)
    (y * w).sum().backward()
    torch.testing.assert_close(torch.cat([r["skewed"]["y"] for r in results]), y.detach())
    torch.testing.assert_close(torch.cat([r["skewed"]["dx"] for r in results]), x.grad)


def test_dropping_grows_as_the_capacity_factor_shrinks(results):
    dropped = [sum(r[cf]["dropped"] for r in results) for cf in (None, 1.0, 0.5)]
    assert dropped[0] == 0 < dropped[1] < dropped[2]
    # at cf = 0.5 each expert takes ⌈0.5·2·16/8⌉ = 2 of a rank's 32 assignments: 16 kept, 16 dropped
    assert all(r[0.5]["dropped"] == 16 for r in results)


def test_dispatch_and_combine_are_all_to_all_single_and_bytes_are_counted(results):
    for r in results:
        ops = r[None]["ops"]
        assert set(ops) == {"all_to_all_single"} and len(ops) == 5  # counts, dispatch, combine, 2 × backward
        comm = r[None]["comm"]
        assert comm["all_to_all"]["calls"] == 4 and comm["all_to_all (counts)"]["calls"] == 1
        assert 0 < comm["all_to_all"]["wire"] < comm["all_to_all"]["payload"]  # the rows a rank keeps stay off the wire
        assert comm["all_to_all (counts)"]["wire"] == 3 / 4 * comm["all_to_all (counts)"]["payload"]


def test_capacity_route_and_aux_loss():
    assert expert_capacity(1024, 8, 1, 1.0) == 128  # tokens/E × cf (Switch §2.2)
    assert expert_capacity(1024, 8, 2, 1.25) == 320
    logits = torch.zeros(6, 3)
    logits[:, 0] = 5.0  # every token prefers expert 0
    r = route(logits, top_k=1, capacity=2)
    assert r.keep.flatten().tolist() == [True, True, False, False, False, False] and r.dropped == 4
    uniform = route(torch.eye(4).repeat(2, 1) * 3, top_k=1, capacity=None)  # 8 tokens, 2 per expert
    assert load_balancing_loss(uniform, alpha=1.0).item() == pytest.approx(
        4 * sum(0.25 * uniform.probs[:, i].mean().item() for i in range(4)))
    skewed = route(logits, top_k=1, capacity=None)
    assert load_balancing_loss(skewed, 1.0) > load_balancing_loss(uniform, 1.0)


def test_byte_formulas():
    assert all_to_all_bytes(4096, 4096, 2, 8, 2) == pytest.approx(4 * 2 * 4096 * 4096 * 2 * 7 / 8)
    assert dp_all_reduce_bytes(10**6, 4) == pytest.approx(3e6)  # bf16 gradients ("deepspeed"): 2·(3/4)·2 MB
    assert dp_all_reduce_bytes(10**6, 4, layout="megatron") == pytest.approx(6e6)  # Megatron's fp32 main grads
    assert all_to_all_bytes(10, 8, 1, 1) == 0


def test_bad_input():
    for call, name in [(lambda: expert_capacity(0, 8), "tokens"), (lambda: MoELayer(8, 4, top_k=5), "top_k"),
                       (lambda: MoELayer(8, 4, capacity_factor=-1.0), "capacity_factor"),
                       (lambda: all_to_all_bytes(1, 1, 1, 0), "world")]:
        with pytest.raises(ValueError, match=name):
            call()
    assert math.isclose(expert_capacity(10, 3, 1, 1.0), 4)


def _ep_rank(capacity_factor):
    import torch.distributed as dist

    from m11_helpers.expert_parallel import ExpertParallelMoE
    from m11_helpers.moe_balance import BiasedMoELayer, update_bias

    rank, n = dist.get_rank(), dist.get_world_size()
    x, t = _tokens()
    moe = BiasedMoELayer(16, 8, 2, capacity_factor=capacity_factor, seed=0)
    ep = ExpertParallelMoE(moe)
    for step in range(2):  # step 0 sets the bias from the global load; step 1 routes with it
        moe.zero_grad()
        y, _ = ep(x[rank::n])
        torch.nn.functional.mse_loss(y, t[rank::n]).backward()
        update_bias(moe.bias, moe.routing(x[rank::n]).experts, gamma=0.05)
    dist.all_reduce(moe.router.weight.grad)  # the router is replicated: its gradient is a sum over ranks
    return {"y": y.detach(), "bias": moe.bias.clone(), "router": moe.router.weight.grad,
            "experts": {i: [p.grad for p in ep.local[i - rank * ep.per_rank].parameters()]
                        for i in range(rank * ep.per_rank, (rank + 1) * ep.per_rank)}}


def _tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randn(32, 16, generator=g) + 2.0 * torch.randn(16, generator=g), torch.randn(32, 16, generator=g)


def test_bias_balanced_moe_expert_parallel_equals_one_process(results, cf=None):
    from m11_helpers.moe_balance import BiasedMoELayer, moe_step

    results = [r["biased"] for r in results]
    x, t = _tokens()
    moe = BiasedMoELayer(16, 8, 2, capacity_factor=cf, seed=0)
    chunks = [x[r::4] for r in range(4)]
    for step in range(2):
        moe.zero_grad()
        outs = [moe_step(moe, c, moe.bias, None)[0] for c in chunks]
        sum(torch.nn.functional.mse_loss(o, t[r::4]) for r, o in enumerate(outs)).backward()
        chosen = torch.cat([moe.routing(c).experts for c in chunks])
        load = torch.bincount(chosen.reshape(-1), minlength=8).float()
        moe.bias += 0.05 * torch.sign(load.mean() - load)
    assert moe.bias.abs().sum() > 0  # the bias really moved the routing
    for r, res in enumerate(results):
        torch.testing.assert_close(res["y"], outs[r].detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(res["bias"], moe.bias)  # every rank holds the same bias: global load
        torch.testing.assert_close(res["router"], moe.router.weight.grad, atol=1e-6, rtol=1e-5)
        for i, grads in res["experts"].items():
            for got, want in zip(grads, [p.grad for p in moe.experts[i].parameters()]):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cf", [None, 1.0])
def test_ep_run_equal_and_drops(cf, results):
    runs = [r["ep_run"] for r in results]
    for r in runs:
        assert max(r[cf][k] for k in ("diff_y", "diff_dx", "diff_expert_grad")) < 1e-12
    dropped = sum(r[cf]["dropped"] for r in runs)
    assert (dropped == 0) == (cf is None)
