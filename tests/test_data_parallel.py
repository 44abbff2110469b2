"""Lesson 03: data parallelism against a single-process reference, on real gloo processes."""


import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close
from torch.utils.data import DistributedSampler

from m11_helpers.config import GPT2_SMALL, RUNNING_EXAMPLE, TINY_GPT, param_count
from m11_helpers.data_parallel import (
    BUCKET_MLP,
    MiB,
    bucket_limits,
    noise_scale,
    pack_buckets,
    scaled_lr,
    shard_indices,
    steps_and_examples,
    train_regression,
    warmup_lr,
)
from m11_helpers.ddp_buckets import BUCKET_INPUT, BUCKET_MODELS, ddp_bucket_assignment, ready_order
from m11_helpers.ddp_overlap import (
    bucket_params,
    ddp_step_time,
    hidden_fraction,
    overlap_end,
    record_timeline,
    tensor_numels,
)
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


def test_bucket_limits_first_bucket_only_by_default():
    assert bucket_limits() == (2**20, 25 * 2**20)  # dist._DEFAULT_FIRST_BUCKET_BYTES, _DEFAULT_BUCKET_CAP_MB
    assert bucket_limits(25) == (25 * MiB, 25 * MiB)  # written out, the small first bucket is gone
    assert bucket_limits(0.5) == (MiB // 2, MiB // 2)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        bucket_limits(0)


def test_pack_buckets_reverse_order_closing_once_the_limit_is_reached():
    q = 3 * MiB // 4
    assert pack_buckets([q] * 4, 1) == [[3, 2], [1, 0]]  # 1.5 MiB >= 1 MiB: buckets overshoot the cap
    assert pack_buckets([MiB] * 3, 1) == [[2], [1], [0]]  # exactly the limit closes
    assert pack_buckets([500_000, 1_020_000, 10_000, 10_000], 1) == [[3, 2, 1, 0]]  # MiB, not 10⁶ bytes
    assert pack_buckets([1, 2, 3], 1) == [[2, 1, 0]]
    assert pack_buckets([], None) == []
    assert pack_buckets([q] * 4, 1, order=[0, 1, 2, 3]) == [[0, 1], [2, 3]]  # the order gradients became ready
    with pytest.raises(ValueError, match="order"):
        pack_buckets([1, 2], 1, order=[0, 0])
    with pytest.raises(ValueError, match="nbytes"):
        pack_buckets([-1], 1)


def test_pack_buckets_first_bucket_of_one_mib_by_default():
    nbytes = [4 * n for n in (131072, 512, 262144, 512, 262144, 512, 262144, 512, 8192, 16)]  # BUCKET_MLP
    assert pack_buckets(nbytes) == [[9, 8, 7, 6], [5, 4, 3, 2, 1, 0]]  # 1.03 MiB, then the other 2.51 MiB
    assert pack_buckets(nbytes, 25) == [list(range(9, -1, -1))]  # explicit 25: one bucket, nothing overlaps
    # the 7B: every matrix exceeds 25 MiB and is its own bucket, the norm weights ride along: 7 × 32 + 2
    assert len(pack_buckets([4 * n for n in tensor_numels(RUNNING_EXAMPLE)])) == 226


def test_tensor_numels_add_up_to_param_count():
    for cfg in (RUNNING_EXAMPLE, GPT2_SMALL, TINY_GPT):
        assert sum(tensor_numels(cfg)) == param_count(cfg)
    assert len(tensor_numels(RUNNING_EXAMPLE)) == 291  # embedding, 32 × (7 matrices + 2 norms), norm, head


def _ddp_runs():
    """DDP on BUCKET_MLP at three bucket settings: the comm hook's timeline and DDP's own logging of its buckets."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from m11_helpers.models import mlp

    runs = {cap: record_timeline(cap, iterations=3, batch=16) for cap in (None, 25, 0.25)}
    logged = {}
    for cap in (None, 25, 0.25):
        ddp = DDP(mlp(BUCKET_MLP)) if cap is None else DDP(mlp(BUCKET_MLP), bucket_cap_mb=cap)
        for _ in range(3):  # rebuilt at the start of iteration 1; logged once it has run
            ddp(torch.randn(4, BUCKET_MLP[0])).sum().backward()
        data = ddp._get_ddp_logging_data()
        logged[cap] = [[int(i) for i in b.split()] for b in data["rebuilt_per_bucket_param_indices"].split(",")]
        del ddp
    x = torch.randn(4, BUCKET_INPUT)
    zoo = {(name, cap): ddp_bucket_assignment(make(), x, cap) for name, make in BUCKET_MODELS.items()
           for cap in (None, 1)}  # models that are not a chain: the rebuilt buckets follow the ready order
    return runs, logged, zoo


def test_pack_buckets_and_the_timeline_match_a_real_ddp():
    runs, logged, zoo = launch(_ddp_runs, num_processes=2, show_output=False)[0]
    nbytes = [4 * n for n in runs[None]["numels"]]
    for cap, run in runs.items():
        its = run["iterations"]
        assert len(its[0]["buckets"]) == 1  # iteration 0: one bucket; DDP rebuilds them after it
        predicted = pack_buckets(nbytes, cap)
        assert bucket_params(its[1]) == bucket_params(its[2]) == logged[cap] == predicted, cap
        assert sum(n for _, n, *_ in its[2]["buckets"]) == sum(run["numels"])
    assert [len(pack_buckets(nbytes, cap)) for cap in runs] == [2, 1, 4]
    later = runs[0.25]["iterations"][2]
    assert later["buckets"][0][2] < max(later["grads"])  # bucket 0 starts before the last gradient is computed
    assert hidden_fraction(later) > 0 and hidden_fraction(runs[25]["iterations"][2]) < 0.1  # one bucket: nothing hides
    for (name, cap), real in zoo.items():  # pack_buckets in the order one process's hooks saw: a real DDP's buckets
        model = BUCKET_MODELS[name]()
        params, ready = list(model.parameters()), ready_order(model, torch.randn(4, BUCKET_INPUT))
        trained = [i for i, p in enumerate(params) if p.requires_grad]  # a frozen layer is in no bucket
        local = pack_buckets([4 * params[i].numel() for i in trained], cap, order=[trained.index(i) for i in ready])
        assert [[trained[j] for j in b] for b in local] == real, (name, cap)
        assert all(p.grad is None for p in params)  # ready_order leaves no gradient behind
    assert ready_order(BUCKET_MODELS["head first"](), torch.randn(2, BUCKET_INPUT))[:2] == [1, 0]  # registered first
    assert zoo["two paths", None] == [[9, 8, 3, 2], [1, 0, 7, 6, 5, 4]]  # the branch computed last is ready first
    assert zoo["odd widths", None] == [[5, 4, 3, 2, 1], [0]]  # 1,048,384 bytes: past 10⁶, short of 1 MiB
    assert zoo["frozen stem", None] == [[9, 8, 7, 6], [5, 4, 3, 2]]


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
    as_list = ddp_step_time(1, 2, 4e9, 8, [1e9] * 4, 0.0, 1e-9, overlap=True)  # bucket sizes instead of a count
    assert as_list == pytest.approx(yes)
    late = ddp_step_time(1, 2, 4e9, 8, [0.5e9, 3.5e9], 0.0, 1e-9, overlap=True)  # a big last bucket
    assert late["exposed_comm_s"] == pytest.approx(2 * 7 / 8 * 3.5)  # it is ready only when backward ends
    with pytest.raises(ValueError, match="buckets"):
        ddp_step_time(1, 2, 4e9, 8, [1e9], 0.0, 1e-9)  # sizes must add up to grad_bytes


def test_hidden_fraction():
    it = {"grads": [0.0, 1.0, 2.0], "buckets": [(0, 1, 0.5, 1.5, [1]), (1, 1, 2.0, 3.0, [0])]}
    assert hidden_fraction(it) == pytest.approx(0.5)
