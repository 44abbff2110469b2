"""gradient_accumulation.py: the same update as the big batch; DDP no_sync and accelerate.accumulate on real processes."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from m11_helpers.accumulation_limits import (
    accumulation_gap,
    contrastive_loss,
    grad_cache_backward,
    mse_loss,
    norm_mlp,
)
from m11_helpers.data import regression
from m11_helpers.gradient_accumulation import (
    accelerate_accumulation_run,
    accumulation_steps_for,
    accumulation_windows,
    ddp_accumulation_run,
    global_batch,
    token_weighted_losses,
    train_with_accumulation,
)
from m11_helpers.launch import launch
from m11_helpers.models import mlp


def test_batch_arithmetic():
    assert global_batch(4, 8, 64) == 2048
    assert accumulation_steps_for(2048, 4, 8) == 64
    assert accumulation_steps_for(1024, 8, 1) == 128
    with pytest.raises(ValueError, match="target_global_batch"):
        accumulation_steps_for(1000, 3, 2)
    with pytest.raises(ValueError, match="micro_batch"):
        global_batch(0, 1)
    assert accumulation_windows(10, 4) == [4, 4, 2]
    assert accumulation_windows(8, 4) == [4, 4]


def _reference(batches, windows, lr=0.1):
    """One step per window on the concatenated window: the large-batch training."""
    model = mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    i = 0
    for size in windows:
        x = torch.cat([b[0] for b in batches[i:i + size]])
        y = torch.cat([b[1] for b in batches[i:i + size]])
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        i += size
    return model


@pytest.mark.parametrize("n,k", [(8, 4), (10, 4), (3, 5), (7, 1)])
def test_accumulation_equals_large_batch_including_the_tail(n, k):
    x, y = regression(n=n * 4, seed=1).tensors
    batches = list(zip(x.split(4), y.split(4)))  # n micro-batches of 4
    model = mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = train_with_accumulation(model, opt, batches, k)
    assert len(losses) == len(accumulation_windows(n, k))
    ref = _reference(batches, accumulation_windows(n, k))
    assert_close(list(model.parameters()), list(ref.parameters()))
    assert all(p.grad is None for p in model.parameters())  # nothing left over for the next epoch


def test_token_weighted_losses_give_the_token_mean():
    g = torch.Generator().manual_seed(0)
    lengths = [[32, 3], [5, 20], [1, 1]]  # uneven: micro-batch means would weight tokens unequally
    losses, masks = [], []
    for lens in lengths:
        losses.append(torch.rand(2, 32, generator=g))
        masks.append(torch.stack([(torch.arange(32) < n).float() for n in lens]))
    got = sum(token_weighted_losses(losses, masks))
    every = torch.cat([l[m.bool()] for l, m in zip(losses, masks)])
    assert_close(got, every.mean())
    mean_of_means = sum((l * m).sum() / m.sum() for l, m in zip(losses, masks)) / len(losses)
    assert abs(mean_of_means - every.mean()) > 0.01


def _single_process_reference(k, steps=2, micro=4, world=2, seed=0, lr=0.1):
    x, y = regression(n=steps * k * micro * world, seed=seed).tensors
    model = mlp(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for xs, ys in zip(x.split(k * micro * world), y.split(k * micro * world)):
        opt.zero_grad()
        F.mse_loss(model(xs), ys).backward()
        opt.step()
    return list(model.parameters())


@pytest.mark.parametrize("no_sync", [True, False])
def test_ddp_accumulation_matches_reference_and_counts_allreduces(no_sync):
    k, steps = 3, 2
    out = launch(ddp_accumulation_run, k, steps=steps, no_sync=no_sync, num_processes=2, show_output=False)
    ref = _single_process_reference(k, steps)
    for r in out:
        assert r["allreduces"] == (steps if no_sync else steps * k)  # K-1 of every K skipped with no_sync
        assert_close(r["params"], [p.detach() for p in ref])


def test_accelerate_accumulate_matches_reference():
    k, steps = 3, 2
    out = launch(accelerate_accumulation_run, k, steps=steps, num_processes=2, show_output=False)
    ref = _single_process_reference(k, steps)
    for r in out:
        assert r["distributed_type"] == "DistributedType.MULTI_CPU"
        assert r["allreduces"] == steps
        assert_close(r["params"], [p.detach() for p in ref])


def test_accumulation_is_not_the_large_batch_when_the_loss_couples_samples():
    """BatchNorm and in-batch negatives break the equality; LayerNorm keeps it; GradCache restores it."""
    x, y = regression(n=64, seed=0).tensors
    bn = accumulation_gap(lambda: norm_mlp("batch"), mse_loss, x, y, 4)
    ln = accumulation_gap(lambda: norm_mlp("layer"), mse_loss, x, y, 4)
    assert bn["grads"] > 0.05 and bn["buffers"] > 0.05  # micro-batch statistics; running stats moved 4 times
    assert ln["grads"] < 1e-5 and ln["buffers"] == 0.0  # per-sample normalisation: exact
    b = x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))  # positive pairs (x_i, b_i)
    nce = accumulation_gap(lambda: norm_mlp("layer"), contrastive_loss, x, b, 4)
    assert nce["grads"] > 0.05  # 15 negatives per sample instead of 63
    big, cached = norm_mlp("layer"), norm_mlp("layer")
    loss = contrastive_loss(big, x, b)
    loss.backward()
    assert_close(grad_cache_backward(cached, x, b, 4), loss.detach())
    assert_close([p.grad for p in cached.parameters()], [p.grad for p in big.parameters()], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="k=5"):
        accumulation_gap(lambda: norm_mlp("layer"), mse_loss, x, y, 5)
    with pytest.raises(ValueError, match="norm"):
        norm_mlp("group")
