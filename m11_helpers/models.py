"""The models the course runs: a tiny GPT (nanoGPT-shaped) and a small MLP.

Both are deliberately small — a training step takes milliseconds on one CPU thread — so every
lesson can run them on several real processes on a laptop. Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from m11_helpers.config import TINY_GPT, TransformerConfig
from m11_helpers.validate import one_of, positive_int


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TransformerConfig, attention: str = "sdpa"):
        super().__init__()
        one_of("attention", attention, ("sdpa", "naive"))
        self.heads, self.attention = cfg.heads, attention
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        else:  # the textbook version: materialises the (T, T) score matrix per head
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, nh, T, T)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v  # (B, nh, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: TransformerConfig, attention: str = "sdpa"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """GPT with learned positions and tied embeddings; `param_count(cfg)` equals its numel exactly."""

    def __init__(self, cfg: TransformerConfig = TINY_GPT, attention: str = "sdpa"):
        super().__init__()
        if cfg.gated_mlp or cfg.norm != "layernorm" or not cfg.tied_embeddings or not cfg.learned_positions:
            raise ValueError("cfg must describe a GPT: gated_mlp=False, norm='layernorm', tied embeddings, "
                             "learned positions")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # weight tying (Press & Wolf 2017), as in GPT-2
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {self.cfg.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, vocab)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def _init_weights(m: nn.Module) -> None:
    # GPT-2's initialisation: N(0, 0.02) weights, zero biases.
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


def mlp(sizes: tuple[int, ...] = (16, 64, 64, 4), seed: int = 0) -> nn.Sequential:
    """A small MLP: Linear → ReLU → … → Linear, initialised from `seed` so every rank builds the same one."""
    if len(sizes) < 2:
        raise ValueError(f"sizes must be at least two layer widths, got {sizes!r}")
    for i, s in enumerate(sizes):
        positive_int(f"sizes[{i}]", s)
    g = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(a, b)
        with torch.no_grad():
            bound = 1 / math.sqrt(a)
            lin.weight.uniform_(-bound, bound, generator=g)
            lin.bias.uniform_(-bound, bound, generator=g)
        layers += [lin] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def tiny_gpt(seed: int = 0, cfg: TransformerConfig = TINY_GPT, attention: str = "sdpa") -> TinyGPT:
    """The course's tiny GPT, initialised from `seed` (the same weights on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(cfg, attention)
