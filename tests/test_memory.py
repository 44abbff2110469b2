"""memory.py: saved-activation bytes are exact, deduplicated by storage, parameters excluded."""

import pytest
import torch
from torch import nn

from m11_helpers.memory import format_bytes, saved_activation_bytes, track_saved_tensors


def test_linear_saves_its_input_not_its_weight():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16)  # no grad needed on x: addmm saves it for the weight's gradient
    assert saved_activation_bytes(lin, x) == 4 * 16 * 4


def test_views_and_repeated_saves_count_once():
    x = torch.randn(10, 10, requires_grad=True)

    def f(x):
        y = x.exp()  # saves its output y
        return (y * y).sum() + y.view(100).sin().sum()  # y saved again (mul), a view of y (sin)

    with track_saved_tensors() as t:
        f(x)
    assert t.saves > t.count  # several saves, fewer unique storages
    assert t.bytes == 100 * 4 * t.count
    assert t.count == 1  # all share y's storage


def test_excludes_parameters_of_exclude_argument():
    w = nn.Parameter(torch.randn(8, 8))
    x = torch.randn(2, 8, requires_grad=True)  # so that mm saves both operands
    assert saved_activation_bytes(lambda x: x @ w, x) == 2 * 8 * 4  # x counted, a Parameter never
    plain = torch.randn(8, 8, requires_grad=True)
    assert saved_activation_bytes(lambda x: x @ plain, x) == 2 * 8 * 4 + 8 * 8 * 4
    assert saved_activation_bytes(lambda x: x @ plain, x, exclude=[plain]) == 2 * 8 * 4


def test_linear_in_batch_and_deterministic():
    from m11_helpers.data import tokens
    from m11_helpers.models import tiny_gpt

    model = tiny_gpt(0)
    x, y = tokens(8, seed=0).tensors
    a = saved_activation_bytes(model, x, y)
    assert a == saved_activation_bytes(model, x, y)
    assert a == pytest.approx(2 * saved_activation_bytes(model, x[:4], y[:4]), rel=0.01)


def test_no_grad_saves_nothing_and_bad_input():
    lin = nn.Linear(4, 4)
    with torch.no_grad(), track_saved_tensors(lin) as t:
        lin(torch.randn(2, 4))
    assert t.bytes == 0
    with pytest.raises(ValueError, match="fn_or_model"):
        saved_activation_bytes(3)
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(10) == "10 B"
