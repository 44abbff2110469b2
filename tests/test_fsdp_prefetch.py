"""FSDP by hand with prefetch on 4 real ranks: equal to one process, gathers issued ahead and waited just in time,
bf16 on the wire before the gather, fp32 reduce-scatter, and the memory prefetching costs."""

import sys

import pytest
import torch

from m11_helpers.fsdp_prefetch import PrefetchFSDP, batch, make_layers, reference_grads, run_prefetch, shard_numel
from m11_helpers.gather_watch import watch_gathers
from m11_helpers.launch import launch

CONFIGS = [(0, "float32"), (2, "float32"), (2, "bfloat16"), (1, "bfloat16")]


@pytest.fixture(scope="module")
def runs():
    return launch(run_prefetch, CONFIGS, num_processes=4, timeout=120)


def test_equal_to_one_process(runs):
    x, y = batch()
    for r in runs[0]:
        dtype = torch.float32 if r["dtype"] == "float32" else torch.bfloat16
        loss, grads = reference_grads(make_layers(), x, y, dtype)
        tol = 1e-6 if dtype == torch.float32 else 2e-3  # bf16: the same casts, summed in another order
        assert r["loss"] == pytest.approx(loss, abs=tol)
        for got, want in zip(r["grads"], grads):
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    for rank_runs in runs[1:]:  # every rank holds the same full gradient after the gather
        for a, b in zip(rank_runs, runs[0]):
            assert all(torch.equal(g, h) for g, h in zip(a["grads"], b["grads"]))


def test_prefetch_order_depth_and_wire(runs):
    for r in runs[0]:
        k, log = r["prefetch"], r["log"]
        assert r["max_ahead"] == k and r["peak_full_layers"] == 1 + k
        for phase, step, layers in (("forward", 1, range(4)), ("backward", -1, range(3, -1, -1))):
            compute = {i: log.index(("compute", i, phase)) for i in layers}
            for i in layers:
                for j in range(1, k + 1):  # the next k layers' gathers are issued before layer i computes
                    if 0 <= i + step * j < 4:
                        assert log.index(("issue", i + step * j, phase)) < compute[i], (phase, i, j)
                if 0 <= i + step < 4:  # ... and waited only after it: just before their own use
                    assert log.index(("wait", i + step, phase)) > compute[i]
                if 0 <= i + step * (k + 1) < 4:  # never more than k ahead
                    assert log.index(("issue", i + step * (k + 1), phase)) > compute[i]
        wire = {kind: {d for kd, _, d in r["wire"] if kd == kind} for kind in ("all_gather", "reduce_scatter")}
        assert wire["all_gather"] == {torch.float32 if r["dtype"] == "float32" else torch.bfloat16}
        assert wire["reduce_scatter"] == {torch.float32}
        # gather_watch (what exercise 5.4's check sees, from outside the code) reads the same as the module's own log
        seen = r["watched"]
        assert seen["ahead"] == (k, k) and seen["alive"] == 1 + k and seen["gathers"] == 8
        assert seen["sync"] == seen["unwaited"] == 0 and seen["dtypes"] == (wire["all_gather"], {torch.float32})


def test_memory_prefetch_costs_and_bf16_saves(runs):
    by = {(r["prefetch"], r["dtype"]): r for r in runs[0]}
    assert by[(2, "float32")]["forward_peak"] > by[(0, "float32")]["forward_peak"]  # layers gathered ahead
    assert by[(2, "bfloat16")]["forward_peak"] < by[(2, "float32")]["forward_peak"]  # half the bytes gathered
    for r in runs[0]:
        assert r["backward_peak"] > r["forward_peak"] > 0


def test_bad_input():
    assert shard_numel(10, 4) == 3
    with pytest.raises(ValueError, match="prefetch"):
        PrefetchFSDP(make_layers(), prefetch=3)
    with pytest.raises(ValueError, match="compute_dtype"):
        PrefetchFSDP(make_layers(), prefetch=1, compute_dtype="float8")
    with pytest.raises(ValueError, match="layers"):
        PrefetchFSDP([], prefetch=1)


def test_watch_chains_and_restores_the_profiler_it_found():
    calls = []
    outer = lambda frame, event, arg: calls.append(event)  # noqa: E731 - a profiler already installed (forbid, a debugger)
    sys.setprofile(outer)
    try:
        with watch_gathers() as w:
            torch.zeros(2).sum()
        assert sys.getprofile() is outer and calls  # the outer profiler kept seeing calls inside the block
    finally:
        sys.setprofile(None)
    assert w.gathers() == w.max_in_flight() == w.unwaited == 0 and w.dtypes("reduce_scatter") == set()
