"""Lesson 06 quiz: shown by `quiz("06_mixed_precision")`. Its figures come from the helpers, so they match the lesson."""

from m11_helpers.activations import activation_bytes, activation_ratio
from m11_helpers.config import RUNNING_EXAMPLE, TINY_GPT, param_count
from m11_helpers.model_states import bytes_per_param, gradient_bytes
from m11_helpers.quantities import GB
from m11_helpers.quiz import Question

_P = param_count(RUNNING_EXAMPLE)
_GRADS = {name: gradient_bytes(_P, name) / GB for name in ("autocast", "deepspeed")}
_BPP = {name: bytes_per_param(name)["total"] for name in ("autocast", "deepspeed", "pure-bf16")}
_RATIO = {b: activation_ratio(TINY_GPT, b, flash=True) for b in (4, 16)}
_A16 = activation_bytes(TINY_GPT, 16, flash=True, autocast=True)
_FLOOR = (_A16["total"] - _A16["weight_copies"]) / activation_bytes(TINY_GPT, 16, flash=True, dtype_bytes=4)["total"]

QUESTIONS = [
    Question("A 7B model trains with torch.amp autocast (bf16) and plain DDP. You move it to DeepSpeed with bf16 "
             "enabled (ZeRO stage 0). What happens to the model-state bytes per parameter and to the gradient bytes "
             "each step all-reduces?",
             [f"Both halve: {_BPP['autocast'] // 2} B/param and {_GRADS['deepspeed']:.1f} GB",
              f"Bytes per parameter stay {_BPP['deepspeed']}; the gradients reduced halve, "
              f"{_GRADS['autocast']:.1f} → {_GRADS['deepspeed']:.1f} GB",
              "Nothing changes: both are 'mixed precision'",
              f"Bytes per parameter grow to 18; the gradients reduced stay {_GRADS['autocast']:.1f} GB"], 1,
             [f"Neither layout drops the FP32 master or Adam's FP32 moments: {_BPP['pure-bf16']} B/param is "
              "pure bf16, which stalls small updates.",
              "Right: autocast keeps FP32 parameters and FP32 gradients (4 + 4 + 8); DeepSpeed keeps bf16 "
              "parameters and gradients next to an FP32 master (2 + 2 + 4 + 8). Same total, but DeepSpeed reduces "
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
    Question("You move clip_grad_norm_(params, 1.0) to right after scaler.scale(loss).backward(), before "
             "scaler.unscale_(opt). What happens to the clipping?",
             ["Nothing", "The norm is of the *scaled* gradient (×65536 at the default scale), so almost every step is "
              "clipped far too hard", "Clipping turns infs into NaNs", "GradScaler refuses to step"], 1,
             ["The gradients are still multiplied by S.",
              "Yes: call scaler.unscale_(opt) before clipping, so the threshold applies to the true gradient.",
              "Not the issue here.", "It steps (unless inf), with a wrongly clipped gradient."],
             transfer=True),
    Question(f"Under bf16 autocast, the tiny GPT's activations are {_RATIO[16]:.2f}× its FP32 activations at batch 16. "
             "You cut the micro-batch to 4. What happens to that ratio?",
             ["It stays the same: every activation is half the size", f"It rises, to {_RATIO[4]:.2f}×",
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
              "bf16 has fewer mantissa bits than FP16: it needs the master more."],
             transfer=True),
]
