"""Lesson 07 quiz: shown by `quiz("07_gradient_accumulation")`. Its figures come from the helpers."""

from m11_helpers.config import GPT3_175B, param_count
from m11_helpers.gradient_accumulation import accumulation_steps_for, global_batch
from m11_helpers.model_states import gradient_bytes
from m11_helpers.quantities import GB
from m11_helpers.quiz import Question

_P175, _FSDP_N = param_count(GPT3_175B), 64  # the lesson measures 2 ranks and a tiny model
_FULL_GRADS = gradient_bytes(_P175, "fsdp2-mp")  # fp32 gradients: 4 B/param
_TARGET, _MICRO, _W1, _W2 = 1536, 4, 8, 48  # sequences per step, per micro-batch; GPUs before and after
_K1, _K2 = accumulation_steps_for(_TARGET, _MICRO, _W1), accumulation_steps_for(_TARGET, _MICRO, _W2)

QUESTIONS = [
    Question("You accumulate K = 8 micro-batches in fp16 with a GradScaler, and clip the gradient norm. When do you "
             "call scaler.unscale_(optimizer)?",
             ["After every micro-batch's backward, so each gradient is clipped unscaled",
              "Once, after the 8th backward and before clipping",
              "After clipping, just before scaler.step",
              "Never: scaler.step unscales, and clipping can use the scaled gradients"], 1,
             ["All 8 backward passes add into the same .grad at the same scale; the scaler refuses a second "
              "unscale_ before update() (and the sum is what must be clipped, not each part).",
              "Right: the K gradients share one scale, so divide it out once, when .grad holds the whole window, "
              "then clip the true global norm.",
              "Then the clip compares the scaled gradient (×scale) with max_norm: it clips almost every step.",
              "scaler.step does unscale if you have not, but only after your clip has cut the scaled gradient."],
             transfer=True),
    Question("Your accumulation loop forgets to divide each micro-loss by K = 8. You switch the optimizer from SGD to "
             "AdamW. What happens to the forgotten ÷K?",
             ["It still makes every update 8× too large",
              "It almost stops mattering: Adam divides by √v, so an 8× gradient gives nearly the same update",
              "It becomes worse: Adam squares the gradient",
              "AdamW's weight decay divides by K for you"], 1,
             ["That is SGD: its update is lr × g.",
              "Right: m/√v is scale-invariant (up to ε), so the bug hides; it still shows up as an 8× gradient norm, "
              "which changes what clipping at max_norm does.",
              "v is 64× larger but √v is 8×, and m is 8×: they cancel.",
              "Decoupled weight decay does not touch the gradient."], transfer=True),
    Question("A vision model with BatchNorm trains with batch 256. Memory runs out, so you use 4 accumulated "
             "micro-batches of 64. What changes?",
             ["Nothing: the accumulated gradient is the batch-256 gradient",
              "BatchNorm normalises with 64-sample statistics and updates its running statistics 4 times per step: "
              "a different gradient and different running stats",
              "Only the running statistics differ; the gradients are the same",
              "The step fails: BatchNorm needs the whole batch"], 1,
             ["Only for a loss that is a sum of per-sample terms; BatchNorm couples the samples of a micro-batch.",
              "Right: the lesson measured a gradient tens of percent off on a tiny model; LayerNorm (per sample) "
              "keeps accumulation exact.",
              "The gradient flows through the batch mean and variance, which now come from 64 samples.",
              "BatchNorm works on any batch of more than one sample."]),
    Question(f"GPT-3 (175B) trains under FSDP2 (ZeRO-3) on {_FSDP_N} GPUs with fp32 gradients and K = 8 micro-batches. "
             "To save communication you call set_requires_gradient_sync(False) on the first 7. Between micro-batches, "
             "each rank holds gradients of…",
             [f"{_FULL_GRADS / GB:.0f} GB: every parameter's, unsharded",
              f"{_FULL_GRADS / _FSDP_N / GB:.1f} GB: its 1/{_FSDP_N} shard, as with sync",
              f"{_FULL_GRADS / 2 / GB:.0f} GB: bf16, like the gathered parameters",
              "Nothing: FSDP2 frees each gradient after backward"], 0,
             [f"Right: the skipped reduce-scatter is what shards a gradient, so each rank accumulates the whole "
              f"model's: 4 B × {_P175 / 1e9:.0f}B = {_FULL_GRADS / GB:.0f} GB, more than any GPU holds (the lesson "
              "measured the same effect on 2 ranks). Reduce-scatter every micro-batch instead (DeepSpeed ZeRO-2/3 "
              "refuse no_sync for this reason).",
              f"That is with sync: {_FULL_GRADS / GB:.0f} GB / {_FSDP_N} after each reduce-scatter.",
              "The gradients are kept in the reduce dtype, fp32 here; only the parameters were gathered in bf16.",
              "They accumulate in the unsharded gradient until the 8th micro-batch's reduce-scatter."],
             transfer=True),
    Question("fp16, GradScaler, linear warm-up scheduler. The scaler skips 3 steps early in training; your loop "
             "calls scheduler.step() after every scaler.step(). What happens?",
             ["Nothing: a skipped step is invisible to the scheduler, as it should be",
              "The schedule runs 3 steps ahead of the weights: warm-up ends 3 updates early",
              "The scheduler skips too: it watches the optimizer",
              "The scale stops halving"], 1,
             ["scheduler.step() counts calls, not optimizer updates.",
              "Right: step the scheduler only when the scaler stepped (scale not lowered); Accelerate does the same "
              "with optimizer_step_was_skipped.",
              "LambdaLR counts its own calls; PyTorch only warns on the very first.",
              "The scale is the scaler's business; the scheduler does not touch it."]),
    Question("100 micro-batches per epoch, K = 8, and the loop steps when (i + 1) % 8 == 0. What happens to "
             "micro-batches 96–99?",
             ["They are skipped",
              "Their gradients stay in .grad and join the next epoch's first step (12 micro-batches summed)",
              "They step with the others", "PyTorch raises an error"], 1,
             ["They are backpropagated; only the step is missing.",
              "Right: step after the short last window too, averaged over its own size (4).",
              "Only if the loop also steps after the last micro-batch.", "Nothing checks it."]),
    Question("Padded sequences of uneven length, loss = mean over tokens. Which accumulation gives the large batch's "
             "loss?",
             ["Mean loss per micro-batch, divided by K",
              "Each micro-batch's summed token losses, divided by the window's total token count",
              "Mean loss per micro-batch, weighted by its number of sequences",
              "Any of them: they are equal"], 1,
             ["That weights a token of a short micro-batch more than one of a long micro-batch.",
              "Right: every token counts once, whatever micro-batch it sits in.",
              "Sequences are not tokens: still wrong when lengths differ.", "Measured in the lesson: they differ."]),
    Question(f"A run keeps a global batch of {_TARGET:,} sequences with micro-batches of {_MICRO} on {_W1} GPUs "
             f"(K = {_K1}). It moves to {_W2} GPUs with the same micro-batch and the same global batch. K becomes…",
             [str(_K2), str(_K1), str(_K1 * _W2 // _W1), "1: more GPUs replace accumulation"], 0,
             [f"Right: K = B / (micro · N) = {_TARGET} / ({_MICRO} × {_W2}) = {_K2}; the global batch "
              f"{_MICRO} × {_K2} × {_W2} = {global_batch(_MICRO, _K2, _W2):,} stays, so the hyper-parameters hold.",
              f"Keeping K = {_K1} grows the global batch to {global_batch(_MICRO, _K1, _W2):,}: a different training run.",
              "That multiplies K by the GPUs' ratio instead of dividing by it.",
              f"Only when micro · N reaches the global batch: {_MICRO} × {_W2} = {_MICRO * _W2} < {_TARGET}."],
             transfer=True),
]
