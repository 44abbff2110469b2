"""Lesson 08 quiz: shown by `quiz("08_activation_checkpointing")`. Its figures come from the helpers, so they match the lesson."""

from m11_helpers.activation_checkpointing import fewest_checkpointed, partial_peak, sqrt_segments
from m11_helpers.activations import activation_bytes
from m11_helpers.config import RUNNING_EXAMPLE
from m11_helpers.quantities import GB
from m11_helpers.quiz import Question


def _gb(**kw) -> float:
    return activation_bytes(RUNNING_EXAMPLE, 1, **kw)["total"] / GB


# the lesson tabulates 4096 tokens (and its ×2); this quiz asks for 8192 and for ×4
_FLASH, _SEL = _gb(flash=True, seq_len=8192), _gb(flash=True, recompute="selective", seq_len=8192)
_FULL, _FULL_4S = _gb(flash=True, recompute="full"), _gb(flash=True, recompute="full", seq_len=16384)
_NONE, _NONE_4S = _gb(), _gb(seq_len=16384)

_L = RUNNING_EXAMPLE.layers
_b = activation_bytes(RUNNING_EXAMPLE, 1, flash=True, recompute="full")["per_layer"]  # a checkpointed block: its input
_B = activation_bytes(RUNNING_EXAMPLE, 1, flash=True)["per_layer"]  # a block that keeps everything
_BUDGET = 7 * GB
_N = fewest_checkpointed(_L, _b, _B, _BUDGET)
_FIRST, _LAST = partial_peak(_L, _N, _b, _B) / GB, partial_peak(_L, _N, _b, _B, first=False) / GB

QUESTIONS = [
    Question(f"The 7B trains with flash attention and no recomputation ({_FLASH:.2f} GB of activations per 8192-token "
             "sequence). You switch on Korthikanti et al.'s selective recomputation. What happens?",
             [f"Activations fall by about 70 %, to ~{0.3 * _FLASH:.1f} GB", f"Almost nothing: {_SEL:.2f} GB",
              "They fall to the layer inputs only", "They grow: recomputation needs buffers"], 1,
             ["The 70 % is GPT-3's s² term without flash; flash never stores the scores in the first place.",
              "Right: selective recomputation recomputes the core attention, whose s² scores flash already "
              "recomputes in its backward; only flash's small log-sum-exp goes "
              f"({_FLASH:.2f} − {_SEL:.2f} GB). Pick full recomputation instead.",
              "That is full recomputation.",
              "Selective recomputation never keeps more than it would without it."],
             transfer=True),
    Question(f"Same 7B, flash and full recomputation: {_FULL:.2f} GB at 4096 tokens. You grow the sequence 4×, to "
             "16,384 tokens. What do the activations become?",
             [f"About {_FULL_4S:.2f} GB", f"About {16 * _FULL:.1f} GB: attention is quadratic",
              f"{_FULL:.2f} GB: checkpointing makes memory independent of s", "It no longer fits anywhere"],
             0,
             [f"Right: every term kept is linear in s (the layer inputs, the output layer's log-probabilities): "
              f"4 × {_FULL:.2f} ≈ {_FULL_4S:.2f} GB. Without flash and without recomputation the s² scores dominate "
              f"instead ({_NONE:.1f} → {_NONE_4S:.1f} GB).",
              "Flash keeps no s² term, and full recomputation keeps only the layer inputs.",
              "Checkpointing keeps one input per layer, and each input has s rows.",
              "A few GB fit on any training GPU."],
             transfer=True),
    Question("The tiny GPT with textbook attention, every block checkpointed with PyTorch's selective checkpointing. "
             "You change the policy from 'save the Linear matmuls' (aten.mm/addmm) to 'save every matmul' (+ aten.bmm). "
             "What happens?",
             ["Nothing: bmm is not a matmul", "More memory kept — the (B, heads, T, T) scores and the attention output "
              "— and no attention matmul recomputed", "Less memory: fewer ops recomputed means fewer buffers",
              "Backward fails: bmm outputs cannot be cached"], 1,
             ["The textbook attention's q·kᵀ and softmax·v run as aten.bmm.",
              "Right (measured in the lesson): what a policy keeps is the outputs of the ops it names, and the score "
              "matrix is the s² term Korthikanti's selective recomputation exists to drop.",
              "What is kept grows; only the recomputed FLOPs shrink.",
              "Any op's output can be kept; that is what MUST_SAVE does."]),
    Question("Checkpointing every block should cost one extra forward: (1 + 2 + 1)/(1 + 2) = 1.33× the FLOPs. "
             "The lesson counts less. Why?",
             ["The FLOP counter misses the backward", "Only the blocks are re-run, not the embeddings, the head and the "
              "loss, and PyTorch stops re-running a block once it has rebuilt everything backward needs",
              "Recomputed FLOPs are cheaper", "The CPU caches the first forward's results"], 1,
             ["It counts forward, backward and the recomputation.",
              "Right: non-reentrant checkpoint's early stop skips each block's last matmul, whose output nothing in "
              "the backward needs; the output layer is never checkpointed.",
              "A FLOP is a FLOP; only where it runs changes its time.",
              "Nothing is cached: checkpointing keeps only each block's input."]),
    Question("Why is √L segments (Chen et al. 2016) not the memory optimum for a transformer?",
             ["Chen et al. were wrong", "A block's internals are many times its input, so more, smaller segments win",
              "PyTorch does not support segments", "Because of the optimizer state"], 1,
             ["Their analysis assumes every node costs the same.",
              "Right: the optimum is k = √(L·block/boundary), often every block.",
              "checkpoint_sequential does exactly that.", "Unrelated to activations."]),
    Question(f"The 7B's {_L} blocks (flash, one 4096-token sequence) each keep {_B / GB:.3f} GB, or only their input, "
             f"{_b / GB:.3f} GB, when checkpointed. {_BUDGET / GB:.0f} GB are left for the blocks' activations. The "
             "plan that recomputes least…",
             [f"checkpoints the first {_N} blocks", f"checkpoints the last {_N} blocks: the same memory",
              f"checkpoints all {_L}: checkpointing is all or nothing",
              f"uses Chen's √L: {sqrt_segments(_L)} segments"], 0,
             [f"Right: n·b + (L − n)·B ≤ budget gives n = {_N} (peak {_FIRST:.2f} GB), and the first blocks are the "
              "ones to checkpoint: backward meets them last, when the kept blocks are already freed.",
              f"The last blocks are rebuilt first, while every kept block is still alive: one block more at the "
              f"peak, {_LAST:.2f} GB > {_BUDGET / GB:.0f} GB.",
              f"It fits with {_N} of {_L}: each block left alone saves one recomputed forward.",
              "√L segments minimise memory when every layer costs the same; here the goal is the least recompute "
              "within a budget."],
             transfer=True),
]
