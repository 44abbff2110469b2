"""The course's running example: a 7B-style transformer, and exact parameter counts.

Every lesson's arithmetic (memory, FLOPs, communication) uses `RUNNING_EXAMPLE`, which has the
shape of Llama-2-7B (Touvron et al. 2023, Table 1 and the released config), so numbers compare
across lessons. `param_count` is exact: it reproduces Llama-2-7B's 6,738,415,616 parameters and
equals `sum(p.numel())` of the course's tiny GPT built from the same config.
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import one_of, positive_int, positive_real


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer's shape. "dim" always means a tensor dimension."""

    name: str
    vocab_size: int
    hidden: int  # h: model width
    layers: int  # L: number of transformer blocks
    heads: int  # a: attention heads
    ffn_hidden: int  # width of the MLP's inner layer
    seq_len: int  # s: training context length
    kv_heads: int | None = None  # grouped-query attention; None = heads
    gated_mlp: bool = False  # SwiGLU (3 matrices) instead of GELU (2 matrices)
    norm: str = "layernorm"  # "layernorm" (weight + bias) or "rmsnorm" (weight only)
    bias: bool = True  # biases in linear layers
    tied_embeddings: bool = True  # output head shares the token embedding
    learned_positions: bool = True  # a learned position table (GPT); False for RoPE (Llama)
    dropout: bool | None = None  # trains with dropout; None = by architecture (GPT yes, Llama no): see dropout_in()

    def __post_init__(self) -> None:
        for field in ("vocab_size", "hidden", "layers", "heads", "ffn_hidden", "seq_len"):
            positive_int(field, getattr(self, field))
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        one_of("norm", self.norm, ("layernorm", "rmsnorm"))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def dropout_in(cfg: TransformerConfig) -> bool:
    """Whether `cfg` trains with dropout: cfg.dropout, else GPT-style (GELU, LayerNorm) yes, Llama-style no.

    GPT-2/GPT-3 and Megatron's GPT use dropout 0.1 (Korthikanti et al. 2022 count its masks); Llama
    trains without (Touvron et al. 2023). The course's tiny models have no dropout layers.
    """
    if cfg.dropout is not None:
        return cfg.dropout
    return not cfg.gated_mlp and cfg.norm == "layernorm"


def param_count(cfg: TransformerConfig) -> int:
    """N = embeddings + L·(attention + MLP + 2 norms) + final norm + head, counted exactly."""
    h, kv = cfg.hidden, (cfg.kv_heads or cfg.heads) * cfg.head_dim
    norm = h * (2 if cfg.norm == "layernorm" else 1)
    b = 1 if cfg.bias else 0
    attention = h * h + 2 * h * kv + h * h + b * (h + 2 * kv + h)  # q, k, v, o (+ biases)
    n_in = 2 if cfg.gated_mlp else 1  # SwiGLU has a gate and an up projection
    mlp = (n_in + 1) * h * cfg.ffn_hidden + b * (n_in * cfg.ffn_hidden + h)
    per_layer = attention + mlp + 2 * norm
    embeddings = cfg.vocab_size * h + (cfg.seq_len * h if cfg.learned_positions else 0)
    head = 0 if cfg.tied_embeddings else cfg.vocab_size * h
    return embeddings + cfg.layers * per_layer + norm + head


def layer_params(cfg: TransformerConfig) -> int:
    """Parameters of one transformer layer: param_count with 2 layers minus with 1 (exact)."""
    return param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))


def layer_flops(cfg: TransformerConfig, tokens: float, context: int | None = None, causal: bool = True) -> float:
    """Forward FLOPs of one layer: 2·P_layer·tokens + 4·s·h·tokens (× ½ causal) (Narayanan et al. 2021, §5.1)."""
    positive_real("tokens", tokens)
    s = cfg.seq_len if context is None else positive_int("context", context)
    return 2 * layer_params(cfg) * tokens + 4 * s * cfg.hidden * tokens * (0.5 if causal else 1.0)


# Llama-2-7B's published shape (Touvron et al. 2023; HF config.json): 6,738,415,616 parameters.
LLAMA2_7B = TransformerConfig(
    name="Llama-2-7B", vocab_size=32000, hidden=4096, layers=32, heads=32, ffn_hidden=11008,
    seq_len=4096, gated_mlp=True, norm="rmsnorm", bias=False, tied_embeddings=False, learned_positions=False,
)

# GPT-3 175B (Brown et al. 2020, Table 2.1): d_model 12288, 96 layers, 96 heads, context 2048.
GPT3_175B = TransformerConfig(
    name="GPT-3 175B", vocab_size=50257, hidden=12288, layers=96, heads=96, ffn_hidden=4 * 12288, seq_len=2048,
)

# GPT-2 small (Radford et al. 2019): 124,439,808 parameters with tied embeddings.
GPT2_SMALL = TransformerConfig(
    name="GPT-2 small", vocab_size=50257, hidden=768, layers=12, heads=12, ffn_hidden=3072, seq_len=1024,
)

# The course's running example: the 7B-style model every lesson's arithmetic uses.
RUNNING_EXAMPLE = dataclasses.replace(LLAMA2_7B, name="M11-7B (Llama-2-7B shape)")

# The course's tiny GPT: the model every lesson *runs* (a training step in milliseconds on 1 thread).
TINY_GPT = TransformerConfig(
    name="tiny GPT", vocab_size=64, hidden=64, layers=4, heads=4, ffn_hidden=256, seq_len=32,
    dropout=False,  # models.TinyGPT has no dropout layers
)

# The course's tiny Llama (`models.tiny_llama`): SwiGLU, RMSNorm, RoPE, no bias, grouped-query attention
# (2 K/V heads for 4 query heads), no dropout. ffn 176 = Llama's ⌈(8/3)·h / 16⌉·16 (Touvron et al. 2023).
TINY_LLAMA = TransformerConfig(
    name="tiny Llama", vocab_size=64, hidden=64, layers=4, heads=4, kv_heads=2, ffn_hidden=176, seq_len=32,
    gated_mlp=True, norm="rmsnorm", bias=False, tied_embeddings=False, learned_positions=False, dropout=False,
)
