"""Activation memory of a transformer, term by term: the one model every lesson prints from.

    a = activation_bytes(RUNNING_EXAMPLE, 1, flash=True)     # the 7B, 1 × 4096 tokens, bf16
    a["per_layer"], a["total"], a["breakdown"]              # bytes; breakdown = what each tensor costs

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4) count
what one GPT layer keeps for backward: sbh(34 + 5as/h) bytes at 16-bit with 1-byte dropout masks.
This module generalises their count term by term, from the `TransformerConfig`:

- MLP: GELU keeps fc input, GELU input, GELU output (h + 2f values per token); SwiGLU keeps its input,
  the gate and up outputs, the SiLU output and their product (h + 4f).
- norms keep their input; LayerNorm also its fp32 mean and rstd, RMSNorm its fp32 rstd ("statistics",
  which the paper ignores as small: statistics=False reproduces the paper).
- attention keeps its input, Q, K, V, the output (the projection's input) and, without flash, the
  softmax output a·s² per sequence. With GQA, flash keeps K and V with kv_heads heads; without flash,
  implementations repeat K/V for every query head before the score matmul (Megatron's core attention,
  HF's repeat_kv) and those copies are what is kept. Flash keeps the fp32 log-sum-exp per row instead
  of any s² term (Dao et al. 2022, §3.1).
- dropout (GPT: yes, Llama: no; `config.dropout_in`) adds 1-byte masks: one per attention-output and
  MLP-output element, and, without flash, the score mask and the dropped-out scores (a·s² each).
- autocast=True models torch.amp autocast with fp32 parameters: the residual stream, norm inputs and
  layer inputs stay fp32 (4 B), matmul inputs are kept as 16-bit copies, and every matmul weight's
  16-bit copy is saved too ("weight copies": batch-independent, freed with the graph).
- recompute: "selective" recomputes the core attention (§4.2): its s² terms, and flash's log-sum-exp;
  "full" keeps only each layer's input (§4.3).
- tp > 1 divides the tensor-parallel region (Q, K, V, scores, attention output, MLP inner) by t;
  sequence_parallel also shards the norms, layer inputs and dropout masks along s (§4.2.2, Table 2).

Exact integer arithmetic throughout. Measured exactly against `m11_helpers.memory.track_saved_tensors`
on the course's tiny GPT and tiny Llama (tests/test_activations.py, with each implementation detail of
eager PyTorch that differs named and counted there).
"""

from __future__ import annotations

from m11_helpers.config import TransformerConfig, dropout_in
from m11_helpers.validate import one_of, positive_int

__all__ = ["RECOMPUTE", "TERMS", "OUTSIDE_TERMS", "activation_bytes", "activation_ratio"]

RECOMPUTE = ("none", "selective", "full")
# per-layer terms, in the order a table shows them
TERMS = ("layer input", "norm inputs", "norm statistics", "attention input", "q, k, v", "attention scores",
         "score dropout", "softmax statistics", "attention output", "mlp input", "mlp inner", "dropout masks",
         "weight copies")
OUTSIDE_TERMS = ("token ids", "embedding dropout", "final norm", "head input", "head weight copy", "loss")
STAT = 4  # bytes of one fp32 statistic (LayerNorm mean/rstd, RMSNorm rstd, flash log-sum-exp)
IDS = 8  # bytes of one int64 token id (saved by the embedding's and the loss's backward)


def _check(cfg: TransformerConfig, micro_batch, seq_len, recompute, flash, dtype_bytes, tp, sequence_parallel,
           autocast, statistics) -> tuple[int, int, int, int]:
    b = positive_int("micro_batch", micro_batch)
    s = positive_int("seq_len", cfg.seq_len if seq_len is None else seq_len)
    one_of("recompute", recompute, RECOMPUTE)
    for name, v in (("flash", flash), ("sequence_parallel", sequence_parallel), ("autocast", autocast),
                    ("statistics", statistics)):
        one_of(name, v, (False, True))
    p = one_of("dtype_bytes", dtype_bytes, (2, 4))  # 16-bit or fp32 activations
    if autocast and p != 2:
        raise ValueError(f"dtype_bytes must be 2 with autocast=True (autocast computes in bf16/fp16), got {p}")
    t = positive_int("tp", tp)
    kv = cfg.kv_heads or cfg.heads
    for name, n in (("heads", cfg.heads), ("kv_heads", kv), ("ffn_hidden", cfg.ffn_hidden)) + (
            (("seq_len", s),) if sequence_parallel else ()):
        if n % t:
            raise ValueError(f"tp must divide {name} ({n}) so each rank holds an equal shard, got tp={t}")
    return b, s, p, t


def activation_bytes(cfg: TransformerConfig, micro_batch: int, *, seq_len: int | None = None,
                     recompute: str = "none", flash: bool = False, dtype_bytes: int = 2, tp: int = 1,
                     sequence_parallel: bool = False, dropout: bool | None = None, autocast: bool = False,
                     statistics: bool = True) -> dict:
    """Per layer sbh(34 + 5as/h) for a 16-bit GPT with dropout, generalised term by term (Korthikanti et al. 2022, §4).

    Returns bytes: "per_layer", "layers" (= L × per_layer), "outside" (embedding, final norm, output layer
    and loss: token ids, the final norm's input, the head's input, fp32 log-probabilities 4·s·b·V/t, targets),
    "total" (= layers + outside), "transient" (what exists on top of total while backward recomputes one layer),
    "weight_copies" (autocast's 16-bit weight copies within total), and "breakdown" / "outside_breakdown"
    (bytes per term; see TERMS, OUTSIDE_TERMS).
    """
    b, s, p, t = _check(cfg, micro_batch, seq_len, recompute, flash, dtype_bytes, tp, sequence_parallel, autocast,
                        statistics)
    drop = dropout_in(cfg) if dropout is None else one_of("dropout", dropout, (False, True))
    m = 1 if drop else 0  # bytes of a dropout mask element (a bool)
    r = 4 if autocast else p  # the residual stream: fp32 under autocast (the parameters' dtype)
    h, f, a, d, L = cfg.hidden, cfg.ffn_hidden, cfg.heads, cfg.head_dim, cfg.layers
    kv = cfg.kv_heads or cfg.heads
    tokens = s * b  # tokens this rank sees in the tensor-parallel region
    rep = (s // t if sequence_parallel else s) * b  # tokens of the replicated region (sharded along s with SP)
    a_t, kv_t, f_t = a // t, kv // t, f // t  # heads, K/V heads and MLP width on one tensor-parallel rank
    norm_stats = (2 if cfg.norm == "layernorm" else 1) * STAT if statistics else 0  # per token, per norm
    kv_kept = kv_t if flash else a_t  # without flash, K and V are repeated to every query head
    mlp_inner = (4 if cfg.gated_mlp else 2) * f_t  # SwiGLU: gate, up, SiLU(gate), product; GELU: input, output
    w_attn = h * (a * d + 2 * kv * d) + a * d * h  # q, k, v, o projection weights
    w_mlp = (3 if cfg.gated_mlp else 2) * h * f
    full, selective = recompute == "full", recompute == "selective"
    s2 = not flash and recompute == "none"  # the score matrices are kept (not recomputed, not flash)
    terms = dict.fromkeys(TERMS, 0)
    if full:  # §4.3: only the layer's input survives the forward; everything else is recomputed
        terms["layer input"] = r * h * rep
    else:
        terms.update({
            "norm inputs": 2 * r * h * rep,
            "norm statistics": 2 * norm_stats * rep,
            "attention input": p * h * rep,
            "q, k, v": p * (a_t + 2 * kv_kept) * d * tokens,
            "attention scores": p * a_t * s * tokens if s2 else 0,  # softmax output, (b, a, s, s)
            "score dropout": (m + p) * a_t * s * tokens if s2 and drop else 0,  # mask + dropped-out scores
            "softmax statistics": STAT * a_t * tokens if flash and statistics and not selective else 0,  # lse
            "attention output": p * a_t * d * tokens,
            "mlp input": p * h * rep,
            "mlp inner": p * mlp_inner * tokens,
            "dropout masks": 2 * m * h * rep,  # after the attention and after the MLP
            "weight copies": p * (w_attn + w_mlp) // t if autocast else 0,
        })
    per_layer = sum(terms.values())
    head_tokens = rep  # the final norm and the head's input are in the replicated region
    outside = {
        "token ids": IDS * tokens + (IDS * s if cfg.learned_positions else 0),  # + the position ids (b-independent)
        "embedding dropout": m * h * rep,
        "final norm": (r * h + (norm_stats if statistics else 0)) * head_tokens,
        "head input": p * h * head_tokens,
        "head weight copy": p * -(-cfg.vocab_size // t) * h if autocast else 0,  # vocab-parallel head
        "loss": STAT * -(-cfg.vocab_size // t) * tokens + IDS * tokens + STAT,  # fp32 log-probs, targets, weight
    }
    transient = 0  # full: one layer rebuilt during its backward; selective: one layer's core attention
    if recompute != "none":
        kept = activation_bytes(cfg, micro_batch, seq_len=s, flash=flash, dtype_bytes=p, tp=t, autocast=autocast,
                                sequence_parallel=sequence_parallel, dropout=drop, statistics=statistics)
        transient = kept["per_layer"] - (terms["layer input"] if full else per_layer)
    return {"per_layer": per_layer, "layers": L * per_layer, "outside": sum(outside.values()),
            "total": L * per_layer + sum(outside.values()), "transient": transient,
            "weight_copies": L * terms["weight copies"] + outside["head weight copy"],
            "breakdown": terms, "outside_breakdown": outside}


def activation_ratio(cfg: TransformerConfig, micro_batch: int, **kw) -> float:
    """total(bf16 autocast) / total(fp32): what mixed precision does to activations (not 0.5: norms stay fp32)."""
    return (activation_bytes(cfg, micro_batch, dtype_bytes=2, autocast=True, **kw)["total"]
            / activation_bytes(cfg, micro_batch, dtype_bytes=4, **kw)["total"])
