"""Lesson 02: the α–β model against its sources, and the ring collectives against one-process sums on real ranks."""

import math

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from m11_helpers import comm_model as cm
from m11_helpers.collectives import (
    backend_all_gather,
    backend_reduce_scatter,
    bandwidth_sweep,
    hierarchical_all_reduce,
    node_and_rail_groups,
    ring_all_gather,
    ring_all_reduce,
    ring_chunks,
    ring_reduce_scatter,
)
from m11_helpers.critical_path import message_depth, record_p2p
from m11_helpers.launch import launch, rank_device

# ----------------------------------------------------------------------------------------------
# The cost model (pure functions)
# ----------------------------------------------------------------------------------------------


def test_bus_factors_are_the_nccl_tests_definitions():
    # nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n, reduce-scatter / all-gather (n-1)/n, broadcast 1.
    assert cm.bus_factor("all_reduce", 8) == 2 * 7 / 8 == 1.75
    assert cm.bus_factor("reduce_scatter", 8) == cm.bus_factor("all_gather", 8) == 7 / 8
    assert cm.bus_factor("broadcast", 8) == cm.bus_factor("reduce", 8) == 1.0
    assert cm.busbw("all_reduce", 1e9, 0.5, 4) == pytest.approx(2e9 * 1.5)
    with pytest.raises(ValueError, match="collective"):
        cm.bus_factor("allreduce", 4)
    with pytest.raises(ValueError, match="n "):
        cm.bus_factor("all_reduce", 0)


def test_ring_sends_2_n_minus_1_over_n_and_latency_grows_with_n():
    # The claim: per-rank traffic 2(n-1)/n · S stays below 2S, while the latency term 2(n-1)α grows.
    S = 1e9
    assert [cm.ring_bytes_sent(S, n) / S for n in (2, 4, 8)] == [1.0, 1.5, 1.75]
    assert cm.ring_allreduce_time(0, 8, 1e-6, 1e-9) == pytest.approx(14e-6)
    assert cm.ring_allreduce_time(S, 8, 0, 1e-9) == pytest.approx(1.75)
    # Patarasuk & Yuan's lower bound 2(n-1)/n·S·β is met exactly when α = 0.
    assert cm.ring_allreduce_time(S, 1024, 0, 1e-9) < 2.0


def test_message_depth_counts_a_serialized_ring_n_times_a_concurrent_one():
    n = 4  # traces as record_p2p writes them: one step of a ring, then N-1 of them
    right, left = [(r + 1) % n for r in range(n)], [(r - 1) % n for r in range(n)]
    concurrent = [[("send", right[r]), ("recv", left[r])] * (n - 1) for r in range(n)]
    serialized = [concurrent[0]] + [[("recv", left[r]), ("send", right[r])] * (n - 1) for r in range(1, n)]
    assert message_depth(concurrent) == n - 1 and message_depth(serialized) == n * (n - 1)
    assert message_depth([[], []]) == 0 and message_depth([[("recv", 1)], [("recv", 0)]]) == 0  # nothing sent


def test_tree_and_crossover_agree():
    alpha, beta = 5e-6, 1 / 50e9
    assert cm.tree_allreduce_time(1e6, 8, alpha, beta) == pytest.approx(6 * (alpha + 1e6 * beta))
    # a switch that adds (NVLS, SHARP): S up and S down once; below the ring for n > 2, a tie on bytes at n = 2
    assert cm.in_network_allreduce_time(1e6, 8, alpha, beta) == pytest.approx(2 * alpha + 1e6 * beta)
    assert cm.in_network_allreduce_time(1e9, 2, 0, beta) == pytest.approx(cm.ring_allreduce_time(1e9, 2, 0, beta))
    for n in (4, 8, 72):
        assert cm.in_network_allreduce_time(1e9, n, alpha, beta) < cm.ring_allreduce_time(1e9, n, alpha, beta)
        assert cm.in_network_allreduce_time(0, n, alpha, beta) < cm.ring_allreduce_time(0, n, alpha, beta)
    for n in (4, 8, 16, 64):
        s = cm.crossover_bytes(n, alpha, beta)
        assert s > 0
        assert cm.ring_allreduce_time(s, n, alpha, beta) == pytest.approx(cm.tree_allreduce_time(s, n, alpha, beta))
        assert cm.explore(n, s / 2, alpha, beta)["winner"] == "tree"
        assert cm.explore(n, s * 2, alpha, beta)["winner"] == "ring"
    # n = 4: S* = α(3-2) / (β(2-3/4)) = 0.8 α/β
    assert cm.crossover_bytes(4, alpha, beta) == pytest.approx(0.8 * alpha / beta)
    assert cm.crossover_bytes(2, alpha, beta) == 0.0  # ring never loses with two ranks
    with pytest.raises(ValueError, match="beta"):
        cm.crossover_bytes(4, alpha, 0)


def test_fit_recovers_alpha_and_beta():
    n, alpha, beta = 4, 2e-4, 1 / 1.5e9
    sizes = [2**k for k in range(10, 27, 2)]
    times = [cm.ring_allreduce_time(s, n, alpha, beta) * (1.02 if i % 2 else 0.98) for i, s in enumerate(sizes)]
    a, b = cm.fit_alpha_beta(sizes, times, n)
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1)
    with pytest.raises(ValueError, match="sizes and seconds"):
        cm.fit_alpha_beta([1, 2], [1.0], n)


def test_seven_b_gradient_on_nvlink_is_tens_of_milliseconds():
    from m11_helpers.config import RUNNING_EXAMPLE, param_count
    from m11_helpers.model_states import gradient_bytes

    psi = param_count(RUNNING_EXAMPLE)
    S = gradient_bytes(psi, "deepspeed")  # bf16 gradients (ZeRO §3.1 layout)
    assert S == 2 * psi and gradient_bytes(psi, "autocast") == 4 * psi  # torch.amp reduces fp32 gradients
    t = cm.ring_allreduce_time(S, 8, cm.NVLINK_H100.alpha, cm.NVLINK_H100.beta)
    assert t == pytest.approx(2 * 7 / 8 * S / 450e9, rel=1e-3) and 0.05 < t < 0.06
    assert cm.ring_bytes_sent(S, 8) / 1e9 == pytest.approx(23.6, abs=0.05)  # lesson 05 prints the same figure


def test_half_bandwidth_size_is_where_busbw_is_half_the_peak():
    alpha, beta = 5e-6, 1 / 50e9
    for n in (2, 8, 1024):
        s = cm.half_bandwidth_bytes(n, alpha, beta)
        assert s == pytest.approx(n * alpha / beta)
        t = cm.ring_allreduce_time(s, n, alpha, beta)
        assert cm.busbw("all_reduce", s, t, n) == pytest.approx(0.5 / beta)  # Hockney's n½
    assert cm.half_bandwidth_bytes(1024, alpha, beta) == pytest.approx(256e6)  # 1024 ranks: 256 MB to reach half
    with pytest.raises(ValueError, match="beta"):
        cm.half_bandwidth_bytes(4, alpha, 0)


def test_rails_make_the_inter_node_ring_eight_times_faster():
    hgx, one = cm.HGX_H100, cm.ONE_NIC_H100
    assert (hgx.rails, one.rails) == (8, 1)
    assert hgx.network_bandwidth() == 400e9 and one.network_bandwidth() == 50e9  # 8 × 400 Gb/s vs 1
    assert hgx.rail_link().bandwidth == cm.IB_400G.bandwidth  # one NIC per GPU: each GPU's rail is one port
    assert one.rail_link().bandwidth == pytest.approx(50e9 / 8)  # eight GPUs share one port
    S = 27e9
    flat_one = cm.cluster_allreduce_time(S, 2, one)
    flat_hgx = cm.cluster_allreduce_time(S, 2, hgx)
    assert flat_one == pytest.approx(2 * 15 / 16 * S / 50e9 + 30 * 5e-6)  # the old "per 400 Gb/s hop" figure
    assert flat_hgx == pytest.approx(2 * 15 / 16 * S / 400e9 + 30 * 5e-6)  # NIC-bound (400 < 450 GB/s NVLink)
    assert flat_one / flat_hgx == pytest.approx(8, rel=1e-2)
    # one node: no network at all, a ring over NVLink
    assert cm.cluster_allreduce_time(S, 1, hgx) == cm.ring_allreduce_time(S, 8, cm.NVLINK_H100.alpha, cm.NVLINK_H100.beta)
    assert cm.inter_node_bytes(S, 1, 8) == 0.0


def test_hierarchical_moves_fewer_bytes_across_nodes_and_takes_fewer_steps():
    hgx, one = cm.HGX_H100, cm.ONE_NIC_H100
    S = 27e9
    # per node on the network: 2(N-1)/N·S for the flat ring, 2(nodes-1)/nodes·S hierarchical (half at 2 nodes)
    assert cm.inter_node_bytes(S, 2, 8, "ring") == pytest.approx(2 * 15 / 16 * S)
    assert cm.inter_node_bytes(S, 2, 8, "hierarchical") == pytest.approx(S)
    # network-bound (one NIC): hierarchical wins; with 8 rails the flat ring is NIC-efficient already and the
    # hierarchical's NVLink phases (not overlapped with the network in this model) make it slower
    assert cm.cluster_allreduce_time(S, 2, one, "hierarchical") < cm.cluster_allreduce_time(S, 2, one, "ring")
    assert cm.cluster_allreduce_time(S, 2, hgx, "hierarchical") > cm.cluster_allreduce_time(S, 2, hgx, "ring")
    # latency: 2(N-1) ring steps vs 2(g-1) + 2(nodes-1); at 1024 GPUs and 1 KB the hierarchical wins
    assert cm.cluster_allreduce_time(1e3, 128, hgx, "hierarchical") < cm.cluster_allreduce_time(1e3, 128, hgx) / 5
    with pytest.raises(ValueError, match="algorithm"):
        cm.cluster_allreduce_time(S, 2, hgx, "tree")
    with pytest.raises(ValueError, match="nics"):
        cm.Fabric("broken", 8, cm.NVLINK_H100, cm.IB_400G, 0, "none")


# ----------------------------------------------------------------------------------------------
# The ring on real processes, against a single-process reference
# ----------------------------------------------------------------------------------------------

SIZES = (1, 5, 12, 1000)  # below n, not divisible by n, divisible, larger


def _inputs(rank, numel):
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * rank + numel)).to(rank_device())  # (numel,)


def _run_all(sizes):
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for numel in sizes:
        x = _inputs(rank, numel)
        before = x.clone()
        rs = ring_reduce_scatter(x)
        assert torch.equal(x, before), "ring_reduce_scatter must not modify its input"
        ag = ring_all_gather(rs, numel)
        ar = ring_all_reduce(x.clone())
        piped = ring_all_gather(ring_reduce_scatter(x, segments=3), numel, segments=2)  # pipelined pieces
        ref = x.clone()
        dist.all_reduce(ref)
        out[numel] = {"rs": rs, "ag": ag, "ar": ar, "dist_ar": ref, "piped": piped}
        if numel % n == 0:  # the backend's reduce-scatter / all-gather need equal chunks
            b_rs = x.new_empty(numel // n)
            backend_reduce_scatter(b_rs, x)
            b_ag = x.new_empty(numel)
            backend_all_gather(b_ag, rs)
            out[numel] |= {"dist_rs": b_rs, "dist_ag": b_ag}
    trace = []
    with record_p2p() as p2p:  # the course's ring, its messages in program order (lesson 02's concurrency check)
        ring_all_reduce(torch.zeros(4 * n, device=rank_device()), trace=trace)
    return out, trace, p2p


@pytest.mark.parametrize("n", [3, 4])
def test_ring_collectives_equal_single_process_sums_and_the_backend(n):
    results = launch(_run_all, SIZES, num_processes=n, show_output=False)
    assert message_depth([p2p for *_, p2p in results]) == 2 * (n - 1)  # concurrent steps: one message time each
    results = [r[:2] for r in results]
    for numel in SIZES:
        total = sum(_inputs(r, numel) for r in range(n))  # the one-process reference
        parts = torch.tensor_split(total, n)
        for rank, (out, _) in enumerate(results):
            got = out[numel]
            assert_close(got["rs"], parts[rank], rtol=1e-5, atol=1e-5)
            assert_close(got["ag"], total, rtol=1e-5, atol=1e-5)
            assert_close(got["ar"], total, rtol=1e-5, atol=1e-5)
            assert_close(got["piped"], got["ag"], rtol=0, atol=0)  # same sums in the same order
            assert_close(got["ar"], got["dist_ar"], rtol=1e-5, atol=1e-5)
            if "dist_rs" in got:
                assert_close(got["rs"], got["dist_rs"], rtol=1e-5, atol=1e-5)
                assert_close(got["ag"], got["dist_ag"], rtol=0, atol=0)  # all-gather only copies
    # The schedule: 2(n-1) steps per rank, every chunk sent once per phase, neighbours agree.
    traces = [t for _, t in results]
    for rank, trace in enumerate(traces):
        assert len(trace) == 2 * (n - 1)
        for phase in ("reduce-scatter", "all-gather"):
            steps = [s for s in trace if s["phase"] == phase]
            assert len({s["sent"] for s in steps}) == n - 1  # n-1 distinct chunks: (n-1)/n of the data
        for step, entry in enumerate(trace):
            left = traces[(rank - 1) % n][step]
            assert entry["received"] == left["sent"]  # what arrives is what the left neighbour sent


def _sweep_and_guarded_ops():
    # The non-deprecated names must not warn (pytest turns FutureWarning into an error in the ranks too).
    n = dist.get_world_size()
    dev = rank_device()
    backend_reduce_scatter(torch.empty(2, device=dev), torch.ones(2 * n, device=dev))
    backend_all_gather(torch.empty(2 * n, device=dev), torch.ones(2, device=dev))
    return bandwidth_sweep([64, 4096], budget_s=0.01, max_iters=2)


def _hierarchical(gpus_per_node, numel):
    from m11_helpers.grading.observe import record_comm

    rank = dist.get_rank()
    with pytest.raises(ValueError, match="gpus_per_node"):
        node_and_rail_groups(dist.get_world_size() + 1)  # refused before any group is made
    node, rail = node_and_rail_groups(gpus_per_node)
    x = _inputs(rank, numel)
    before = x.clone()
    with record_comm() as log:
        out = hierarchical_all_reduce(x, node, rail)
    return out, torch.equal(x, before), [(e.op, e.group, e.nbytes) for e in log.events]


@pytest.mark.parametrize("nodes,g", [(2, 2), (3, 2)])
def test_hierarchical_all_reduce_equals_one_process_sum_and_crosses_nodes_with_a_shard(nodes, g):
    n, numel = nodes * g, 12
    results = launch(_hierarchical, g, numel, num_processes=n, show_output=False)
    total = sum(_inputs(r, numel) for r in range(n))  # the one-process reference
    for rank, (out, untouched, events) in enumerate(results):
        assert_close(out, total, rtol=1e-5, atol=1e-5)
        assert untouched
        node = tuple(range(rank // g * g, rank // g * g + g))
        rail = tuple(range(rank % g, n, g))
        assert [(op, grp) for op, grp, _ in events] == [("reduce_scatter_single", node), ("all_reduce", rail),
                                                        ("all_gather_single", node)]
        assert events[1][2] == numel * 4 // g  # only the 1/g shard crosses nodes


def _ring_trace_of_powers_of_two():
    trace = []
    ring_all_reduce(torch.full((dist.get_world_size(),), 2.0 ** dist.get_rank(), device=rank_device()), trace=trace)
    return trace


def test_the_ring_picture_is_drawn_from_the_ranks_own_data():
    import matplotlib

    matplotlib.use("Agg")
    from m11_helpers.collectives_plots import plot_ring, plot_scaling

    traces = launch(_ring_trace_of_powers_of_two, num_processes=3, show_output=False)
    fig = plot_ring(traces)
    last = fig.axes[-1]  # after the all-gather every chunk of every rank holds all three ranks' data
    assert sorted(t.get_text() for t in last.texts) == ["012"] * 9
    assert [ax.get_title() for ax in fig.axes[1:]] == ["RS step 0", "RS step 1", "AG step 0", "AG step 1"]
    ax = plot_scaling({"1 KB": 1e3}, [2, 4, 8], cm.IB_400G)
    assert len(ax.get_lines()) == 2 and ax.get_lines()[0].get_ydata()[0] == 1.0


def test_sweep_checks_results_and_reports_rows():
    rows = launch(_sweep_and_guarded_ops, num_processes=2, show_output=False)[0]
    assert [(r["impl"], r["bytes"]) for r in rows] == [("ring (ours)", 64), ("backend", 64),
                                                       ("ring (ours)", 4096), ("backend", 4096)]
    assert all(r["seconds"] > 0 and r["n"] == 2 for r in rows)


def test_bad_input_is_refused_with_the_parameter_named():
    with pytest.raises(ValueError, match="flat"):
        ring_chunks(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="n must"):
        ring_chunks(torch.zeros(4), 0)
    from m11_helpers.collectives import _segments

    with pytest.raises(ValueError, match="segments"):
        _segments(torch.zeros(4), 0)
    assert _segments(torch.zeros(4), None) == 1 and _segments(torch.zeros(2**22), None) == 16
    assert [c.numel() for c in ring_chunks(torch.zeros(10), 4)] == [3, 3, 2, 2]
    assert math.isclose(sum(c.numel() for c in ring_chunks(torch.zeros(3), 4)), 3)


def test_lab_and_links_report_consistent_numbers():
    res = cm.explore(8, 2**20, 5e-6, 1 / 50e9)  # what the α–β explorer shows
    assert res["ring_s"] == pytest.approx(cm.ring_allreduce_time(2**20, 8, 5e-6, 1 / 50e9))
    assert res["tree_s"] == pytest.approx(cm.tree_allreduce_time(2**20, 8, 5e-6, 1 / 50e9))
    assert res["winner"] == ("ring" if 2**20 > res["crossover_bytes"] else "tree")
    assert 0 < res["ring_latency_share"] < 1
    assert cm.explore(8, 2**20, 0.0, 1 / 50e9)["winner"] == "ring"  # no latency: the tree never wins
    assert cm.NVLINK_H100.beta == pytest.approx(1 / 450e9) and cm.IB_400G.bandwidth == 50e9
    with pytest.raises(ValueError, match="bandwidth"):
        cm.Link("broken", 0, "none")


def test_fit_without_latency_returns_alpha_zero():
    sizes = [2**k for k in range(10, 24, 2)]
    a, b = cm.fit_alpha_beta(sizes, [cm.ring_allreduce_time(s, 4, 0.0, 1e-9) for s in sizes], 4)
    assert a == pytest.approx(0.0, abs=1e-12) and b == pytest.approx(1e-9, rel=1e-6)
