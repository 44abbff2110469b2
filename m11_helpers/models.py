"""The models the course runs: a tiny GPT (nanoGPT-shaped), a tiny Llama and a small MLP.

All are deliberately small — a training step takes milliseconds on one CPU thread — so every
lesson can run them on several real processes on a laptop. Shapes: B batch, T time, C channels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from m11_helpers.config import TINY_GPT, TINY_LLAMA, TransformerConfig
from m11_helpers.validate import fraction, one_of, positive_int


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
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); with `dropout` p > 0, each branch dropped
    out before it is added (GPT-2's residual dropout, Radford et al. 2019): one mask per branch from torch's RNG."""

    def __init__(self, cfg: TransformerConfig, attention: str = "sdpa", dropout: float = 0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.dropout = fraction("dropout", dropout, allow_zero=True)  # 0: no mask, no random number drawn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self.attn(self.ln_1(x)))  # (B, T, C)
        return x + self._drop(self.mlp(self.ln_2(x)))  # (B, T, C)

    def _drop(self, y: torch.Tensor) -> torch.Tensor:
        return F.dropout(y, self.dropout, self.training) if self.dropout else y


class TinyGPT(nn.Module):
    """GPT with learned positions and tied embeddings; `param_count(cfg)` equals its numel exactly. `dropout` p: each
    block's residual dropout (0, the default: none; the capstone's resume test draws masks every step: lesson 11)."""

    def __init__(self, cfg: TransformerConfig = TINY_GPT, attention: str = "sdpa", dropout: float = 0.0):
        super().__init__()
        if cfg.gated_mlp or cfg.norm != "layernorm" or not cfg.tied_embeddings or not cfg.learned_positions:
            raise ValueError("cfg must describe a GPT: gated_mlp=False, norm='layernorm', tied embeddings, "
                             "learned positions")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, attention, dropout) for _ in range(cfg.layers))
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
    # m11: cpu-only - the weights are drawn on the CPU generator (the same on every machine), moved after
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(cfg, attention)


# ---------------------------------------------------------------------------------------------
# The tiny Llama: the running example's architecture (Llama-2/3) at the tiny GPT's size
# ---------------------------------------------------------------------------------------------


_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # SDPA's enable_gqa (torch 2.5)


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of RoPE's angles t·base^(−2i/d), each (seq_len, head_dim) (Su et al. 2021, §3.4.2; Llama's layout)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (d/2,)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, d): the rotate-half pairing (i, i + d/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + d/2) pair of x (B, nh, T, d) by its position's angle: x·cos + rotate_half(x)·sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin  # (B, nh, T, d)


class LlamaAttention(nn.Module):
    """Causal attention with RoPE and grouped-query K/V heads; q/k/v/o projections without bias (Llama)."""

    def __init__(self, cfg: TransformerConfig, attention: str = "sdpa"):
        super().__init__()
        one_of("attention", attention, ("sdpa", "naive"))
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads or cfg.heads, cfg.head_dim
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        self.attention = attention
        kv = self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.hidden, kv, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.hidden, kv, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        nh, nkv, d = self.heads, self.kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, nh, d).transpose(1, 2)  # (B, nh, T, d)
        k = self.k_proj(x).view(B, T, nkv, d).transpose(1, 2)  # (B, nkv, T, d)
        v = self.v_proj(x).view(B, T, nkv, d).transpose(1, 2)  # (B, nkv, T, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.attention == "sdpa":
            if nkv != nh and not _SDPA_GQA:  # torch < 2.5: no enable_gqa, repeat K/V for every query head
                k, v = (t.repeat_interleave(nh // nkv, dim=1) for t in (k, v))  # (B, nh, T, d)
            gqa = {"enable_gqa": True} if nkv != nh and _SDPA_GQA else {}
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)  # (B, nh, T, d)
        else:  # the textbook version: K/V repeated for every query head, the (T, T) scores materialised
            k, v = (t.repeat_interleave(nh // nkv, dim=1) for t in (k, v))  # (B, nh, T, d)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d)  # (B, nh, T, T); a scalar divisor is not saved
            causal = torch.full((T, T), float("-inf"), device=x.device).triu(1).to(att.dtype)  # (T, T), not saved
            y = (att + causal).softmax(dim=-1) @ v  # (B, nh, T, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)) (Shazeer 2020, "GLU Variants Improve Transformer"; Llama's MLP)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)


class LlamaBlock(nn.Module):
    """Pre-norm Llama block: x + attn(rmsnorm(x)), then x + swiglu(rmsnorm(x))."""

    def __init__(self, cfg: TransformerConfig, attention: str = "sdpa"):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.self_attn = LlamaAttention(cfg, attention)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    """Llama with RoPE, RMSNorm, SwiGLU and GQA, untied head; `param_count(cfg)` equals its numel exactly.

    The RoPE tables are non-persistent buffers (not parameters, not in the state dict).
    """

    def __init__(self, cfg: TransformerConfig = TINY_LLAMA, attention: str = "sdpa"):
        super().__init__()
        if not cfg.gated_mlp or cfg.norm != "rmsnorm" or cfg.tied_embeddings or cfg.learned_positions:
            raise ValueError("cfg must describe a Llama: gated_mlp=True, norm='rmsnorm', untied embeddings, "
                             "no learned positions")
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(LlamaBlock(cfg, attention) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)  # (T, d)
        self.register_buffer("rope_sin", sin, persistent=False)  # (T, d)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {self.cfg.seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # (T, d) views of the buffers
        x = self.embed_tokens(idx)  # (B, T, C)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def tiny_llama(seed: int = 0, cfg: TransformerConfig = TINY_LLAMA, attention: str = "sdpa") -> TinyLlama:
    """The course's tiny Llama, initialised from `seed` (the same weights on every rank)."""
    # m11: cpu-only - the weights are drawn on the CPU generator (the same on every machine), moved after
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyLlama(cfg, attention)
