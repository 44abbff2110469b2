"""Seeded synthetic data: nothing is downloaded, and every run sees the same numbers."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import TensorDataset

from m11_helpers.config import TINY_GPT
from m11_helpers.validate import positive_int


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch so a notebook's outputs are the same on every run."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def regression(n: int = 256, d_in: int = 16, d_out: int = 4, noise: float = 0.1, seed: int = 0) -> TensorDataset:
    """y = tanh(x W) + noise: a task the course MLP learns in a few dozen steps."""
    for name, v in (("n", n), ("d_in", d_in), ("d_out", d_out)):
        positive_int(name, v)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)  # (n, d_in)
    w = torch.randn(d_in, d_out, generator=g) / d_in**0.5
    y = torch.tanh(x @ w) + noise * torch.randn(n, d_out, generator=g)  # (n, d_out)
    return TensorDataset(x, y)


def tokens(n: int = 512, seq_len: int = TINY_GPT.seq_len, vocab: int = TINY_GPT.vocab_size, seed: int = 0) -> TensorDataset:
    """Sequences from a fixed random Markov chain (so there is structure to learn); targets are inputs shifted by one."""
    positive_int("n", n)
    positive_int("seq_len", seq_len)
    if positive_int("vocab", vocab) < 2:
        raise ValueError(f"vocab must be an integer >= 2, got {vocab!r}")
    g = torch.Generator().manual_seed(seed)
    # Each token has 4 likely successors: a low-entropy language the tiny GPT can learn quickly.
    successors = torch.randint(0, vocab, (vocab, 4), generator=g)  # (vocab, 4)
    seqs = torch.empty(n, seq_len + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(seq_len):
        choice = torch.randint(0, 4, (n,), generator=g)
        seqs[:, t + 1] = successors[seqs[:, t], choice]
    return TensorDataset(seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous())  # (n, T), (n, T)
