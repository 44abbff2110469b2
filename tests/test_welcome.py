"""Lesson 00: the averaged-gradient formula on real processes, and the shared models/config/data/quiz."""

import pytest
import torch

from m11_helpers.config import (
    GPT2_SMALL,
    GPT3_175B,
    LLAMA2_7B,
    RUNNING_EXAMPLE,
    TINY_GPT,
    TransformerConfig,
    param_count,
)
from m11_helpers.data import regression, tokens
from m11_helpers.launch import LaunchError, launch
from m11_helpers.models import mlp, tiny_gpt
from m11_helpers.quiz import Question, QuizState, as_markdown
from m11_helpers.welcome import (
    data_parallel_gradient,
    failing_rank,
    full_batch_gradient,
    hello,
    shard,
    shard_gradient,
)


@pytest.mark.parametrize("world", [2, 4])
def test_averaged_gradient_equals_the_full_batch_gradient(world):
    full = full_batch_gradient(batch_size=64, seed=0)
    ranks = launch(data_parallel_gradient, 64, 0, num_processes=world, show_output=False)
    for g in ranks:
        torch.testing.assert_close(g, full)
    assert all(torch.equal(g, ranks[0]) for g in ranks)  # all-reduce leaves identical copies


def test_the_shard_gradients_average_to_the_full_batch_gradient_in_one_process():
    full = full_batch_gradient(batch_size=64, seed=0)
    parts = [shard_gradient(i, 4, batch_size=64, seed=0) for i in range(4)]
    torch.testing.assert_close(sum(parts) / 4, full)
    assert all((p - full).abs().max() > 1e-4 for p in parts)  # each shard alone is off: the noise the plot shows


def test_hello_reports_every_rank_and_the_sum():
    out = launch(hello, num_processes=4, show_output=False)
    assert [r["rank"] for r in out] == [0, 1, 2, 3]
    assert {r["all_reduce_sum"] for r in out} == {6.0}
    assert {r["backend"] for r in out} == {"gloo"}


def test_failing_rank_is_named():
    with pytest.raises(LaunchError, match="rank 2 of 4 failed") as info:
        launch(failing_rank, 2, num_processes=4, show_output=False)
    assert "empty batch" in info.value.failures[2]


def test_shard_covers_the_batch_and_rejects_bad_input():
    parts = [shard(12, r, 3) for r in range(3)]
    assert [list(range(12))[p] for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="divisible by world_size"):
        shard(10, 0, 4)
    with pytest.raises(ValueError, match="rank must be in"):
        shard(8, 4, 4)


def test_param_count_matches_published_models():
    assert param_count(LLAMA2_7B) == 6_738_415_616  # Llama-2-7B, Touvron et al. 2023
    assert param_count(GPT2_SMALL) == 124_439_808  # GPT-2 small (HF `gpt2`, tied head)
    assert 174e9 < param_count(GPT3_175B) < 176e9  # "175B" (Brown et al. 2020, Table 2.1)
    assert param_count(RUNNING_EXAMPLE) == param_count(LLAMA2_7B)


def test_param_count_equals_the_tiny_gpt_numel():
    model = tiny_gpt()
    unique = {id(p): p for p in model.parameters()}  # the tied head is counted once
    assert sum(p.numel() for p in unique.values()) == param_count(TINY_GPT)


def test_config_rejects_bad_shapes():
    with pytest.raises(ValueError, match="divisible by heads"):
        TransformerConfig("x", vocab_size=10, hidden=10, layers=1, heads=3, ffn_hidden=4, seq_len=4)
    with pytest.raises(ValueError, match="layers must be an integer >= 1"):
        TransformerConfig("x", vocab_size=10, hidden=8, layers=0, heads=2, ffn_hidden=4, seq_len=4)


def test_models_are_seeded_and_train():
    a, b = tiny_gpt(seed=3), tiny_gpt(seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    x, y = tokens(n=64, seed=0).tensors
    opt = torch.optim.AdamW(a.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = a(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    torch.testing.assert_close(tiny_gpt(attention="naive")(x[:2]), tiny_gpt(attention="sdpa")(x[:2]))
    assert torch.equal(mlp(seed=1)[0].weight, mlp(seed=1)[0].weight)


def test_data_is_deterministic():
    assert torch.equal(regression(seed=5).tensors[0], regression(seed=5).tensors[0])
    x, y = tokens(n=8, seed=1).tensors
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_quiz_scores_first_attempts():
    qs = [Question("2+2?", ["3", "4"], 1, ["no", "yes"]), Question("1+1?", ["2", "3"], 0, ["yes", "no"])]
    state = QuizState(qs)
    assert state.pick(0, 0) == (False, "no")
    assert state.pick(0, 1) == (True, "yes")  # a second try teaches but does not score
    state.pick(1, 0)
    assert state.score == 1 and state.score_line() == "Score: 1 / 2 (answered 2)"
    assert "**Q1. 2+2?**" in as_markdown(qs)
    with pytest.raises(ValueError, match="answer must be an index"):
        Question("?", ["a", "b"], 2, ["", ""])
    with pytest.raises(ValueError, match="feedback must have one entry per option"):
        Question("?", ["a", "b"], 0, [""])
