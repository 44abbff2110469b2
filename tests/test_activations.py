"""activations.py: Korthikanti et al.'s counts exactly, and the bytes autograd really saves in the course's tiny models.

Measured with `memory.track_saved_tensors` (every tensor saved for backward, deduplicated by storage,
parameters and buffers excluded). Where eager PyTorch on a CPU keeps something the model does not
count, the difference is named and counted exactly here:

- the tiny GPT's textbook attention builds its causal mask with `masked_fill`, which keeps the
  (s, s) bool mask: s² bytes per layer, whatever the batch (Megatron's fused softmax keeps none);
- eager `nn.RMSNorm` (composite on CPU) keeps the normalised input x̂ besides its input and rstd:
  one more residual-dtype (B, T, h) tensor per norm (a fused RMSNorm kernel keeps input and rstd);
- under autocast, the tiny Llama's separate q/k/v and gate/up projections each save their own
  16-bit copy of the same fp32 input (autocast caches casts of leaf tensors, i.e. weights, only):
  2 + 1 more copies per layer than fused projections (Megatron's linear_qkv and linear_fc1);
- CPU dropout runs the composite `x * noise` path, which keeps the mask in the input's dtype rather
  than the fused kernel's 1-byte bool: (dtype bytes − 1) more per mask element.
"""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from m11_helpers.activations import OUTSIDE_TERMS, TERMS, activation_bytes, activation_ratio
from m11_helpers.config import GPT3_175B, LLAMA2_7B, RUNNING_EXAMPLE, TINY_GPT, TINY_LLAMA, dropout_in, param_count
from m11_helpers.data import tokens
from m11_helpers.launch import launch
from m11_helpers.memory import track_saved_tensors
from m11_helpers.models import tiny_gpt, tiny_llama

B = 2  # micro-batch of the measured forwards
T = 32  # the tiny models' sequence length
AUTOCAST = [(False, 4), (True, 2)]  # (autocast on, dtype bytes of the matmul activations)

# ---------------------------------------------------------------------------------------------
# (a) the paper's own counts
# ---------------------------------------------------------------------------------------------


def test_gpt3_layer_is_sbh_34_plus_5as_over_h():
    s, b, h, a = GPT3_175B.seq_len, 1, GPT3_175B.hidden, GPT3_175B.heads
    assert dropout_in(GPT3_175B)  # GPT configs train with dropout: the paper's masks are counted
    got = activation_bytes(GPT3_175B, b, statistics=False)  # the paper ignores the fp32 norm statistics
    assert got["per_layer"] == 34 * s * b * h + 5 * a * s * s * b  # Korthikanti et al. 2022, §4.1, eq. 1
    assert round(got["per_layer"] / 1e9, 2) == 2.87  # 2.87 GB per layer per sequence (lesson 08)
    assert sum(got["breakdown"].values()) == got["per_layer"] and set(got["breakdown"]) == set(TERMS)
    assert got["breakdown"]["attention scores"] + got["breakdown"]["score dropout"] == 5 * a * s * s * b


@pytest.mark.parametrize("t", [2, 4, 8])
def test_table_2_rows_for_tensor_and_sequence_parallelism(t):
    # Korthikanti et al. 2022, Table 2 (per layer, b = 1): exact, since t divides h, a and s
    cfg, b = GPT3_175B, 1
    s, h, a = cfg.seq_len, cfg.hidden, cfg.heads
    sbh, s2 = s * b * h, 5 * a * s * s * b

    def per_layer(**kw):
        return activation_bytes(cfg, b, tp=t, statistics=False, **kw)["per_layer"]

    assert per_layer() == 10 * sbh + 24 * sbh // t + s2 // t  # sbh(10 + 24/t + 5as/(ht))
    assert per_layer(sequence_parallel=True) == 34 * sbh // t + s2 // t  # sbh(34/t + 5as/(ht))
    assert per_layer(recompute="selective") == 10 * sbh + 24 * sbh // t  # sbh(10 + 24/t)
    assert per_layer(recompute="selective", sequence_parallel=True) == 34 * sbh // t  # sbh(34/t)
    assert per_layer(recompute="full") == 2 * sbh  # the layer input, replicated over the TP group
    assert per_layer(recompute="full", sequence_parallel=True) == 2 * sbh // t  # sharded along s with SP


def test_full_recompute_keeps_2sbh_and_exact_mlp_terms():
    s, b, h, f = 4096, 1, LLAMA2_7B.hidden, LLAMA2_7B.ffn_hidden
    assert activation_bytes(GPT3_175B, 1, recompute="full")["per_layer"] == 2 * GPT3_175B.seq_len * GPT3_175B.hidden
    # a GELU MLP of the Llama shape keeps sbh·2(h + 2f)/h = 12.75 sbh: no truncation to 12
    gelu = activation_bytes(dataclasses.replace(LLAMA2_7B, gated_mlp=False), b)["breakdown"]
    assert gelu["mlp input"] + gelu["mlp inner"] == 2 * s * b * (h + 2 * f) == int(12.75 * s * b * h)
    swiglu = activation_bytes(LLAMA2_7B, b)["breakdown"]  # SwiGLU: input, gate, up, SiLU, product
    assert swiglu["mlp input"] + swiglu["mlp inner"] == 2 * s * b * (h + 4 * f)


def test_running_example_figures():
    # the figures lessons 04, 05, 06, 08 and 11 print through quantities.say (one activation model for every lesson)
    def gb(**kw):
        return round(activation_bytes(RUNNING_EXAMPLE, 1, **kw)["total"] / 1e9, 2)

    assert not dropout_in(RUNNING_EXAMPLE)  # Llama trains without dropout
    assert gb() == 55.08 and gb(flash=True) == 20.74 and gb(recompute="selective") == 20.73
    assert gb(recompute="full") == 1.67 and gb(recompute="full", flash=True) == 1.67
    a = activation_bytes(RUNNING_EXAMPLE, 1, recompute="full")
    assert a["layers"] == 32 * 2 * 4096 * 4096  # 1.07 GB of layer inputs; the output layer's fp32 log-probs add 0.52
    assert a["outside_breakdown"]["loss"] == 4 * 32000 * 4096 + 8 * 4096 + 4
    assert set(a["outside_breakdown"]) == set(OUTSIDE_TERMS)


# ---------------------------------------------------------------------------------------------
# (b) measured on the tiny GPT and the tiny Llama
# ---------------------------------------------------------------------------------------------


def _block_bytes(model: nn.Module, autocast: bool, fn=None) -> int:
    """Bytes one block's forward saves (its input requires grad, as inside the model)."""
    block = (model.blocks if hasattr(model, "blocks") else model.layers)[0]
    args = () if hasattr(model, "blocks") else (model.rope_cos[:T], model.rope_sin[:T])
    x = torch.randn(B, T, model.cfg.hidden, requires_grad=True)  # (B, T, C)
    with track_saved_tensors(model) as t, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        block(x, *args) if fn is None else fn(block, x)
    return t.bytes


def _rmsnorm_xhat(r: int, cfg) -> int:
    """Eager nn.RMSNorm's x̂, one per norm: checked against what a lone nn.RMSNorm saves."""
    norm = nn.RMSNorm(cfg.hidden)
    x = torch.randn(B, T, cfg.hidden, requires_grad=True)
    with track_saved_tensors(norm) as t:
        norm(x)
    assert t.bytes == 2 * 4 * B * T * cfg.hidden + 4 * B * T  # input, x̂ (both fp32) and rstd
    return r * B * T * cfg.hidden


@pytest.mark.parametrize("autocast, p", AUTOCAST)
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_tiny_gpt_block_measured(attention, autocast, p):
    got = _block_bytes(tiny_gpt(0, attention=attention), autocast)
    want = activation_bytes(TINY_GPT, B, flash=attention == "sdpa", dtype_bytes=p, autocast=autocast)
    mask = T * T if attention == "naive" else 0  # masked_fill's (s, s) bool mask
    assert got == want["per_layer"] + mask


@pytest.mark.parametrize("autocast, p", AUTOCAST)
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_tiny_llama_block_measured(attention, autocast, p):
    cfg = TINY_LLAMA
    assert cfg.kv_heads < cfg.heads  # grouped-query attention: flash keeps smaller K and V
    got = _block_bytes(tiny_llama(0, attention=attention), autocast)
    want = activation_bytes(cfg, B, flash=attention == "sdpa", dtype_bytes=p, autocast=autocast)
    r = 4  # the residual stream is fp32 in both runs (fp32 parameters)
    copies = 3 * p * B * T * cfg.hidden if autocast else 0  # q/k/v: 2 more copies, gate/up: 1 more
    assert got == want["per_layer"] + 2 * _rmsnorm_xhat(r, cfg) + copies
    flash_kv = activation_bytes(cfg, B, flash=True)["breakdown"]["q, k, v"]
    assert flash_kv < activation_bytes(cfg, B)["breakdown"]["q, k, v"]  # without flash K/V are repeated


@pytest.mark.parametrize("autocast, p", AUTOCAST)
@pytest.mark.parametrize("make, cfg", [(tiny_gpt, TINY_GPT), (tiny_llama, TINY_LLAMA)])
def test_whole_model_total_measured(make, cfg, autocast, p):
    x, y = tokens(B, seed=0).tensors  # (B, T) ids and targets
    model = make(0)
    with track_saved_tensors(model) as t, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(x, y)
    want = activation_bytes(cfg, B, flash=True, dtype_bytes=p, autocast=autocast)
    extra = 0
    if cfg.norm == "rmsnorm":  # every RMSNorm's x̂ (2 per layer + the final one), the autocast copies
        extra = (2 * cfg.layers + 1) * 4 * B * T * cfg.hidden + (cfg.layers * 3 * p * B * T * cfg.hidden
                                                                  if autocast else 0)
    assert t.bytes == want["total"] + extra


def _selective(block, x):  # Megatron's selective recompute: the core attention runs under checkpoint
    attn = block.attn
    C = x.shape[-1]
    q, k, v = attn.qkv(block.ln_1(x)).split(C, dim=2)  # 3 × (B, T, C)
    q, k, v = (t.view(B, T, attn.heads, C // attn.heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)

    def core(q, k, v):
        if attn.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return ((q @ k.transpose(-2, -1)) / math.sqrt(C // attn.heads)).masked_fill(~mask, float("-inf")).softmax(-1) @ v

    y = checkpoint(core, q, k, v, use_reentrant=False)  # (B, nh, T, hd)
    x = x + attn.proj(y.transpose(1, 2).reshape(B, T, C))
    return x + block.mlp(block.ln_2(x))


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_policies_measured(recompute, attention):
    model = tiny_gpt(0, attention=attention)
    fn = _selective if recompute == "selective" else (lambda block, x: checkpoint(block, x, use_reentrant=False))
    got = _block_bytes(model, False, fn)
    want = activation_bytes(TINY_GPT, B, recompute=recompute, flash=attention == "sdpa", dtype_bytes=4)
    assert got == want["per_layer"]  # the mask and every s² term are inside the checkpoint
    assert want["transient"] > 0


def _gpt_layer_with_dropout(block, x, p_drop=0.1):
    """The tiny GPT's block with the paper's three dropouts: attention probabilities, attention and MLP outputs."""
    attn = block.attn
    C = x.shape[-1]
    q, k, v = attn.qkv(block.ln_1(x)).split(C, dim=2)  # 3 × (B, T, C)
    q, k, v = (t.view(B, T, attn.heads, C // attn.heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = ((q @ k.transpose(-2, -1)) / math.sqrt(C // attn.heads)).masked_fill(~mask, float("-inf"))  # (B, nh, T, T)
    y = F.dropout(att.softmax(dim=-1), p_drop, training=True) @ v  # (B, nh, T, hd)
    x = x + F.dropout(attn.proj(y.transpose(1, 2).reshape(B, T, C)), p_drop, training=True)
    return x + F.dropout(block.mlp(block.ln_2(x)), p_drop, training=True)


@pytest.mark.parametrize("autocast, p", AUTOCAST)
def test_dropout_masks_measured(autocast, p):
    torch.manual_seed(0)
    got = _block_bytes(tiny_gpt(0, attention="naive"), autocast, _gpt_layer_with_dropout)
    want = activation_bytes(TINY_GPT, B, dropout=True, dtype_bytes=p, autocast=autocast)
    mask_elements = TINY_GPT.heads * T * T * B + 2 * B * T * TINY_GPT.hidden  # scores, attention and MLP outputs
    assert got == want["per_layer"] + T * T + (p - 1) * mask_elements  # CPU masks: input dtype, not bool


def test_weight_copies_and_ratio_explain_the_lessons_bf16_figures():
    # lesson 06 measured 0.62× at batch 16, lesson 11 0.76× at batch 4: the same model, the 16-bit weight
    # copies are batch-independent; without them the ratio is 0.58 (norms, statistics, loss stay fp32)
    assert round(activation_ratio(TINY_GPT, 16, flash=True), 2) == 0.62
    assert round(activation_ratio(TINY_GPT, 4, flash=True), 2) == 0.76
    a = activation_bytes(TINY_GPT, 4, flash=True, autocast=True)
    h, f, L, V = TINY_GPT.hidden, TINY_GPT.ffn_hidden, TINY_GPT.layers, TINY_GPT.vocab_size
    assert a["weight_copies"] == 2 * (L * (4 * h * h + 2 * h * f) + V * h)
    fp32 = activation_bytes(TINY_GPT, 4, flash=True, dtype_bytes=4)["total"]
    assert round((a["total"] - a["weight_copies"]) / fp32, 2) == 0.58


def _tp_block_bytes() -> int:
    import torch.distributed as dist

    from m11_helpers.tensor_parallel import TPBlock

    block = TPBlock(tiny_gpt(0).blocks[0], dist.get_rank(), dist.get_world_size())
    x = torch.randn(B, T, TINY_GPT.hidden, generator=torch.Generator().manual_seed(0), requires_grad=True)
    with track_saved_tensors(block) as t:
        block(x)
    return t.bytes


def test_tensor_parallel_block_measured_on_two_ranks():
    want = activation_bytes(TINY_GPT, B, flash=True, dtype_bytes=4, tp=2)["per_layer"]
    assert launch(_tp_block_bytes, num_processes=2, timeout=120, show_output=False) == [want, want]


def test_tiny_llama_is_a_llama():
    model = tiny_llama(0)
    assert sum(p.numel() for p in model.parameters()) == param_count(TINY_LLAMA)  # exact, GQA and untied head
    assert {n for n, _ in model.named_buffers()} == {"rope_cos", "rope_sin"} and not model.state_dict().keys() & {
        "rope_cos", "rope_sin"}  # RoPE tables: buffers, not parameters, not saved
    x, y = tokens(4, seed=0).tensors
    torch.testing.assert_close(model(x, y), tiny_llama(0, attention="naive")(x, y))  # SDPA + GQA = textbook
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    with pytest.raises(ValueError, match="Llama"):
        tiny_llama(0, TINY_GPT)


# ---------------------------------------------------------------------------------------------
# (c) bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, name", [({"recompute": "some"}, "recompute"), ({"dtype_bytes": 3}, "dtype_bytes"),
                                      ({"tp": 0}, "tp"), ({"tp": 3}, "tp"), ({"seq_len": 0}, "seq_len"),
                                      ({"flash": "yes"}, "flash"), ({"autocast": True, "dtype_bytes": 4}, "dtype_bytes"),
                                      ({"sequence_parallel": True, "tp": 2, "seq_len": 33}, "tp"),
                                      ({"dropout": 0.1}, "dropout")])
def test_bad_input(kw, name):
    with pytest.raises(ValueError, match=name):
        activation_bytes(TINY_GPT, 1, **kw)
    with pytest.raises(ValueError, match="micro_batch"):
        activation_bytes(TINY_GPT, 0)
