"""Lesson 03: data parallelism against a single-process reference, on real gloo processes."""


import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close
from torch.utils.data import DistributedSampler

from m11_helpers.data_parallel import (
    noise_scale,
    pack_buckets,
    scaled_lr,
    shard_indices,
    steps_and_examples,
    train_regression,
    warmup_lr,
)
from m11_helpers.ddp_overlap import ddp_step_time, hidden_fraction, overlap_end, record_timeline
from m11_helpers.launch import launch

# ------------------------------------------------------------------------------ sampler


@pytest.mark.parametrize("n,world", [(10, 4), (12, 4), (7, 3), (5, 1), (3, 4)])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shard_indices_match_distributed_sampler(n, world, shuffle, drop_last):
    for epoch in (0, 3):
        for rank in range(world):
            ref = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=7,
                                     drop_last=drop_last)
            ref.set_epoch(epoch)
            got = shard_indices(n, rank, world, shuffle=shuffle, seed=7, epoch=epoch, drop_last=drop_last)
            assert got == list(ref)


def test_padding_repeats_the_first_indices_and_covers_everything():
    shards = [shard_indices(10, r, 4) for r in range(4)]
    assert shards == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]  # 2 padded: samples 0 and 1 seen twice
    assert sorted(i for s in shards for i in s) == sorted(list(range(10)) + [0, 1])


def test_forgetting_set_epoch_repeats_the_order():
    e0 = shard_indices(16, 0, 2, shuffle=True, epoch=0)
    assert shard_indices(16, 0, 2, shuffle=True, epoch=0) == e0  # no set_epoch: the same order every epoch
    assert shard_indices(16, 0, 2, shuffle=True, epoch=1) != e0


def test_shard_indices_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        shard_indices(10, 4, 4)
    with pytest.raises(ValueError, match="world_size"):
        shard_indices(10, 0, 0)


# ------------------------------------------------------------------------------ buckets


def test_pack_buckets_at_most_cap_in_reverse_order():
    assert pack_buckets([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert pack_buckets([10, 2, 3], 4) == [[2], [1], [0]]  # 10 > cap: its own bucket
    assert pack_buckets([1, 2, 3], 100) == [[2, 1, 0]]
    for b in pack_buckets([3, 5, 2, 7, 1, 1, 4], 8):
        assert len(b) == 1 or sum([3, 5, 2, 7, 1, 1, 4][i] for i in b) <= 8


def test_pack_buckets_ddp_rule_closes_once_cap_is_reached():
    assert pack_buckets([4, 4, 4, 4], 6, close_at_cap=True) == [[3, 2], [1, 0]]  # 8 >= 6: overshoots
    with pytest.raises(ValueError, match="cap_bytes"):
        pack_buckets([1], 0)


def _ddp_bucket_numels(cap_mb):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.models import mlp

    model = mlp((16, 64, 64, 64, 4))
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    seen = []

    def hook(state, bucket):
        seen.append((bucket.index(), bucket.buffer().numel()))
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    out = []
    for _ in range(2):
        seen.clear()
        ddp(torch.randn(8, 16)).sum().backward()
        out.append([n for _, n in sorted(seen)])
    numels = [p.numel() for p in model.parameters()]
    del ddp
    return out, numels


def test_pack_buckets_matches_real_ddp_buckets():
    cap_mb = 0.02
    (first, later), numels = launch(_ddp_bucket_numels, cap_mb, num_processes=2, show_output=False)[0]
    assert first == [sum(numels)]  # iteration 0: one bucket; DDP rebuilds them after it
    cap = int(cap_mb * 1024 * 1024)
    expected = [sum(numels[i] for i in b) for b in pack_buckets([4 * n for n in numels], cap, close_at_cap=True)]
    assert later == expected and len(later) > 1


# ------------------------------------------------------------------------------ training, three ways


def _train_both(**kw):
    from m11_helpers.models import mlp

    own = torch.cat([p.detach().flatten() for p in mlp(seed=dist.get_rank()).parameters()])
    return own, train_regression("naive", **kw), train_regression("ddp", **kw)


@pytest.mark.parametrize("world", [2, 4])
def test_naive_and_ddp_match_one_process(world):
    kw = dict(steps=4, global_batch=32, lr=0.1, momentum=0.9)
    ref = train_regression("single", **kw)
    ranks = launch(_train_both, num_processes=world, show_output=False, **kw)
    assert not torch.equal(ranks[0][0], ranks[1][0])  # without a broadcast, replicas would start apart
    for _, *runs in ranks:
        for r in runs:  # every replica, naive or DDP, ends with the single process's weights
            assert_close(r["grad0"], ref["grad0"], rtol=1e-5, atol=1e-6)
            assert_close(r["params"], ref["params"], rtol=1e-5, atol=1e-6)
            assert_close(torch.tensor(r["losses"]), torch.tensor(ref["losses"]), rtol=1e-5, atol=1e-6)


def test_global_batch_must_divide():
    with pytest.raises(Exception, match="global_batch"):
        launch(train_regression, "ddp", steps=1, global_batch=30, num_processes=4, show_output=False)


# ------------------------------------------------------------------------------ overlap timeline


def test_timeline_iteration0_one_bucket_then_many_started_during_backward():
    its = launch(record_timeline, 0.1, iterations=2, num_processes=2, show_output=False)[0]
    assert len(its[0]["buckets"]) == 1
    later = its[1]["buckets"]
    assert len(later) > 3
    assert sum(n for _, n, _, _ in later) == sum(n for _, n, _, _ in its[0]["buckets"])
    assert later[0][2] < max(its[1]["grads"])  # bucket 0 starts before the last gradient is computed
    assert hidden_fraction(its[1]) > 0 and hidden_fraction(its[0]) < 0.1  # one bucket: nothing to hide behind


# ------------------------------------------------------------------------------ formulas


def test_goyal_linear_scaling_worked_example():
    assert scaled_lr(256) == pytest.approx(0.1)
    assert scaled_lr(8192) == pytest.approx(3.2)  # Goyal et al. 2017: kn = 8192 -> η = 3.2
    assert scaled_lr(256, base_lr=0.1, base_batch=32) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="batch"):
        scaled_lr(0)


def test_warmup_ramps_linearly_from_eta_to_k_eta():
    lr = [warmup_lr(t, base_lr=0.1, scale=32, warmup_steps=5) for t in range(8)]
    assert lr[0] == pytest.approx(0.1) and lr[5] == pytest.approx(3.2) and lr[7] == pytest.approx(3.2)
    assert lr[1] - lr[0] == pytest.approx(lr[2] - lr[1])
    assert warmup_lr(0, base_lr=0.1, scale=8, warmup_steps=0) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="step"):
        warmup_lr(-1, base_lr=0.1, scale=8, warmup_steps=5)


def test_noise_scale_recovers_a_known_trace_and_norm():
    g2, tr = 4.0, 100.0  # E|G_B|² = |G|² + tr(Σ)/B (McCandlish et al. 2018, eq. A.1)
    out = noise_scale(g2 + tr / 10, g2 + tr / 100, 10, 100)
    assert out["G2"] == pytest.approx(g2) and out["trace_sigma"] == pytest.approx(tr)
    assert out["B_simple"] == pytest.approx(25.0)
    s, e = steps_and_examples(25.0, 25.0)
    assert (s, e) == (pytest.approx(2.0), pytest.approx(2.0))  # B = B_noise: 2× the minimum of both


def test_overlap_model():
    assert overlap_end([1, 2, 3], [0.5, 0.5, 0.5]) == pytest.approx(3.5)
    assert overlap_end([1, 1, 1], [1, 1, 1]) == pytest.approx(4.0)
    no = ddp_step_time(1, 2, 4e9, 8, 4, 0.0, 1e-9, overlap=False)
    yes = ddp_step_time(1, 2, 4e9, 8, 4, 0.0, 1e-9, overlap=True)
    assert no["comm_s"] == pytest.approx(2 * 7 / 8 * 4)  # ring: 2(n−1)/n · S·β
    assert no["step_s"] == pytest.approx(3 + 7.0)
    assert yes["step_s"] == pytest.approx(1 + 0.5 + 7.0)  # comm-bound: starts at 0.5, runs 7 s back to back
    fast = ddp_step_time(1, 2, 4e6, 8, 4, 0.0, 1e-9, overlap=True)
    assert fast["step_s"] == pytest.approx(3 + 7e-3 / 4)  # compute-bound: only the last bucket shows
    assert 0 < yes["efficiency"] <= 1
    with pytest.raises(ValueError, match="buckets"):
        ddp_step_time(1, 2, 4e6, 8, 0, 0.0, 1e-9)


def test_hidden_fraction():
    it = {"grads": [0.0, 1.0, 2.0], "buckets": [(0, 1, 0.5, 1.5), (1, 1, 2.0, 3.0)]}
    assert hidden_fraction(it) == pytest.approx(0.5)
