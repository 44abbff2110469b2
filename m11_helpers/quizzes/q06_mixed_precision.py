"""Lesson 06 quiz: shown by `quiz("06_mixed_precision")`. Its figures come from the helpers, so they match the lesson."""

import torch

from m11_helpers.activations import activation_bytes, activation_ratio
from m11_helpers.config import GPT3_175B, TINY_GPT, param_count
from m11_helpers.fp8_scaling import E4M3_MAX, dequantize, quantize
from m11_helpers.loss_scaling import update_scale
from m11_helpers.model_states import bytes_per_param, gradient_bytes
from m11_helpers.quantities import GB
from m11_helpers.quiz import Question

_P = param_count(GPT3_175B)  # the lesson's layouts are for the 7B; this quiz asks for GPT-3
_GRADS = {name: gradient_bytes(_P, name) / GB for name in ("autocast", "deepspeed")}
_BPP = {name: bytes_per_param(name)["total"] for name in ("autocast", "deepspeed", "pure-bf16")}
_RATIO = {b: activation_ratio(TINY_GPT, b, flash=True) for b in (2, 16)}  # the lesson plots 4 and 16
_A16 = activation_bytes(TINY_GPT, 16, flash=True, autocast=True)
_SCALE, _TRACK = 2.0**16, 0  # GradScaler's default start, then 4,000 overflow-free steps
for _ in range(4000):
    _SCALE, _TRACK = update_scale(_SCALE, _TRACK, found_inf=False)
_NORM, _MAX = 0.5, 1.0  # true gradient norm, clip threshold
_MX_BLOCK = [1.9, 0.003] + [0.5] * 30  # one MX block of a gradient: its largest entry, a small one, the rest
_MX = dequantize(*quantize(torch.tensor([_MX_BLOCK]), "mx"), "mx")[0, :2].tolist()  # what they become
_FLOOR = (_A16["total"] - _A16["weight_copies"]) / activation_bytes(TINY_GPT, 16, flash=True, dtype_bytes=4)["total"]

QUESTIONS = [
    Question("GPT-3 (175B) trains with torch.amp autocast (bf16) and plain DDP. You move it to DeepSpeed with bf16 "
             "enabled (ZeRO stage 0). What happens to the model-state bytes per parameter and to the gradient bytes "
             "each step all-reduces?",
             [f"Both halve: {_BPP['autocast'] // 2} B/param and {_GRADS['deepspeed']:.1f} GB",
              f"Bytes per parameter stay {_BPP['deepspeed']}; the gradients reduced go "
              f"{_GRADS['autocast']:.0f} → {_GRADS['deepspeed']:.0f} GB",
              "Nothing changes: both are 'mixed precision'",
              f"Bytes per parameter grow to 18; the gradients reduced stay {_GRADS['autocast']:.1f} GB"], 1,
             [f"Neither layout drops the FP32 master or Adam's FP32 moments: {_BPP['pure-bf16']} B/param is "
              "pure bf16, which stalls small updates.",
              "Right: autocast keeps FP32 parameters and FP32 gradients (4 + 4 + 8); DeepSpeed keeps bf16 "
              f"parameters and gradients next to an FP32 master (2 + 2 + 4 + 8). Same total, but DeepSpeed reduces "
              f"2 B × {_P / 1e9:.0f}B = {_GRADS['deepspeed']:.0f} GB instead of 4 B × {_P / 1e9:.0f}B: "
              "16-bit gradients: half the bytes on the wire (autocast gets there with DDP's bf16_compress_hook).",
              "The layouts hold different tensors: measured in the lesson, the gradients are float32 under autocast.",
              "18 B/param is Megatron-LM's bf16 default (FP32 main gradients), not DeepSpeed's."],
             transfer=True),
    Question("You switch a run from FP16 autocast to BF16 autocast and keep the GradScaler. What happens?",
             ["Training diverges: GradScaler only works with FP16",
              "It still trains: the scale grows while no overflow occurs, and skipped steps become rare; the scaler is "
              "unnecessary, not harmful",
              "Every step is skipped: BF16 gradients always overflow",
              "The scaler now clips the gradients"], 1,
             ["GradScaler multiplies and divides by a power of two whatever the dtype.",
              "Right: BF16 has FP32's exponent range, so small gradients do not flush to zero (0 % in the lesson's "
              "histogram) and scaling buys nothing; what BF16 lacks is precision, which the FP32 master repairs.",
              "BF16 overflows only beyond ~3.4e38, like FP32.",
              "Scaling and clipping are separate steps."],
             transfer=True),
    Question("GradScaler sees an inf in the gradients. What does it do?",
             ["Clips the gradient", "Skips the optimizer step and halves the scale",
              "Steps with the finite gradients only", "Raises an error"], 1,
             ["Clipping is separate and must come after unscale_.",
              "Yes: skip, back off ×0.5, reset the growth counter.",
              "No: one inf means the whole step is untrustworthy.", "No: overflow is expected now and then."]),
    Question(f"fp16 with GradScaler: after 4,000 overflow-free steps from the default 2¹⁶ the scale is "
             f"{_SCALE:,.0f}. Your loop calls clip_grad_norm_(params, {_MAX}) BEFORE scaler.unscale_(opt); the true "
             f"gradient norm is {_NORM}. What does the step apply?",
             [f"A gradient of norm {_MAX / _SCALE:.1e}: {_NORM * _SCALE / _MAX:,.0f}× smaller than the true one",
              f"The true gradient: its norm {_NORM} is under {_MAX}, nothing is clipped",
              f"A gradient of norm {_MAX}: clipped to the threshold",
              "Nothing: GradScaler skips a step whose gradients were clipped"], 0,
             [f"Right: clipping sees the scaled norm {_NORM} × {_SCALE:,.0f} = {_NORM * _SCALE:,.0f} and cuts it to "
              f"{_MAX}; scaler.step then divides by {_SCALE:,.0f}: {_MAX}/{_SCALE:,.0f} = {_MAX / _SCALE:.1e}. "
              "Call scaler.unscale_(opt) first.",
              "That compares the true norm; before unscale_ the gradients are still multiplied by the scale.",
              f"Clipped to {_MAX} while scaled, then divided by the scale in scaler.step.",
              "The scaler skips only on inf/NaN; a clipped gradient is finite."],
             transfer=True),
    Question(f"Under bf16 autocast, the tiny GPT's activations are {_RATIO[16]:.2f}× its FP32 activations at batch 16. "
             "You cut the micro-batch to 2. What happens to that ratio?",
             ["It stays the same: every activation is half the size", f"It rises, to {_RATIO[2]:.2f}×",
              "It falls towards 0.5", "It becomes 1: autocast stops casting"], 1,
             ["Not every activation is 16-bit, and not everything saved is an activation.",
              "Right: the bf16 copies of the weights that autocast saves for backward do not shrink with the batch, so "
              "they weigh more at a small batch (at batch 1 autocast even uses more memory than FP32).",
              f"Cutting the batch raises it; growing the batch lowers it, but only towards the {_FLOOR:.2f} floor, "
              "never to 0.5: the residual stream, the norms and the loss stay FP32.",
              "Autocast casts the same ops at every batch size."],
             transfer=True),
    Question("To save memory you store a model and AdamW's states in bf16 and drop the FP32 master copy. Which "
             "training suffers first?",
             ["A run with a large learning rate", "A run late in its schedule, with a small learning rate",
              "Neither: bf16 has FP32's range", "Only FP16 runs: bf16 needs no master"], 1,
             ["Large updates survive rounding.",
              "Right: an update smaller than half the bf16 spacing near the weight (2⁻⁹ to 2⁻⁸ of |w|) rounds away; "
              "the lesson measured a large share of updates lost and a loss that falls behind.",
              "Range is not the problem; precision (7 mantissa bits) is.",
              "bf16 has fewer mantissa bits than FP16: it needs the master more."]),
    Question(f"A 1×32 MXFP8 block of a gradient holds 1.9 (its largest entry), 0.003 and thirty entries of 0.5. Under the "
             f"OCP MX rule (scale 2^(⌊log₂ amax⌋ − 8), E4M3 elements saturating at ±{E4M3_MAX:.0f}), what are 1.9 "
             "and 0.003 stored back as?",
             ["1.9 and 0.003, exactly: a block has its own scale",
              f"{_MX[0]:.2f} and {_MX[1]:.5f}: the largest entry saturates, the small one keeps E4M3's precision",
              "1.9 and 0: one large entry flushes the small ones, as with one scale per tensor",
              "inf and 0.003: 1.9 / 2⁻⁸ overflows E4M3"], 1,
             ["E4M3 keeps 3 mantissa bits: only a few values are stored exactly, whatever the scale.",
              f"Right: ⌊log₂ 1.9⌋ = 0, so the scale is 2⁻⁸ (e8m0 byte 119); 1.9 / 2⁻⁸ = 486.4 is beyond {E4M3_MAX:.0f} "
              f"and saturates: {E4M3_MAX:.0f}·2⁻⁸ = {_MX[0]:.2f} ({_MX[0] / 1.9 - 1:+.1%}). 0.003 / 2⁻⁸ = 0.768, a "
              f"normal E4M3 number (≥ 2⁻⁶) rounded to 0.75: {_MX[1]:.5f}. The spec rounds the exponent down, so the "
              "top of the block can saturate; rounding it up (NVIDIA's MXFP8 pre-training recipe, Mishra et al. 2025) avoids that and "
              "costs one bit at the bottom.",
              "Within one block the ratio 1.9 / 0.003 ≈ 630 fits E4M3's range (2⁻⁹ … 448): nothing flushes. One "
              "scale per tensor fails when the outlier is thousands of times larger.",
              "E4M3 (fn) has no inf: the cast saturates (the spec requires it; the lesson's cast clamps first)."],
             transfer=True),
]
