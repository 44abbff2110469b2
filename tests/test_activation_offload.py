"""Lesson 08: what save_on_cpu moves to the host (the weights too), and an offload hook that moves activations only."""

import dataclasses

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from m11_helpers.activation_costs import measure_step
from m11_helpers.activation_offload import offload_hooks, record_offload, save_on_cpu_hooks
from m11_helpers.config import TINY_GPT
from m11_helpers.data import tokens
from m11_helpers.live_memory import warm_up
from m11_helpers.memory import saved_activation_bytes
from m11_helpers.models import tiny_gpt

X, Y = tokens(4, seed=0).tensors  # (4, 32)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    warm_up()
    yield
    torch.set_num_threads(before)


def _saved_weight_bytes(model):
    # a Linear saves weight.t() (a view of its weight), a LayerNorm its weight and bias; the embeddings save ids only
    return sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear)) + \
        sum((m.weight.numel() + m.bias.numel()) * 4 for m in model.modules() if isinstance(m, nn.LayerNorm))


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_save_on_cpu_copies_the_weights_and_our_hook_does_not(attention):
    model = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=2), attention)
    model(X, Y).backward()
    ref = _grads(model)
    exact = saved_activation_bytes(model, X, Y)
    logs = {}
    for name, (pack, unpack) in (("save_on_cpu", save_on_cpu_hooks()), ("ours", offload_hooks(model))):
        model.zero_grad(set_to_none=True)
        with record_offload(pack, unpack, model) as log:
            step = measure_step(model, lambda m, i, t: m(i, t), X, Y, host=log.host_bytes)
        assert_close(_grads(model), ref)
        assert log.activations_left == [] and log.activation_bytes == exact
        assert step["retained"] == X.numel() * 8 * 2  # on the device: only the token ids the step itself holds
        logs[name] = log
    assert logs["save_on_cpu"].param_bytes_copied == _saved_weight_bytes(model)
    assert logs["ours"].param_bytes_copied == 0
    assert logs["save_on_cpu"].copied_bytes == logs["ours"].copied_bytes + _saved_weight_bytes(model)
    assert logs["ours"].copied_bytes >= exact  # a storage saved by two ops is copied twice


def test_record_offload_sees_a_pass_through_hook_and_save_on_cpu_without_pinning():
    model = tiny_gpt(0, dataclasses.replace(TINY_GPT, layers=1))
    for pack, unpack in ((lambda t: t, lambda t: t), save_on_cpu_hooks(pin_memory=False)):  # .cpu() on a CPU: itself
        with record_offload(pack, unpack, model) as log:
            model(X, Y).backward()
        assert log.copied_bytes == 0 and log.activations_left and log.host_bytes() == 0
    with pytest.raises(ValueError, match="pack"):
        with record_offload(None, None):
            pass
