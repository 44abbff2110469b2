"""Lesson 03 quiz: shown by `quiz("03_data_parallel")`."""

from m11_helpers.config import GPT2_SMALL, param_count
from m11_helpers.data_parallel import MiB, pack_buckets, steps_and_examples
from m11_helpers.ddp_overlap import tensor_numels
from m11_helpers.quiz import Question

_P = param_count(GPT2_SMALL)  # the lesson's bucket timeline is a 3.7 MB model; this quiz, GPT-2 small
_BYTES = [4 * n for n in tensor_numels(GPT2_SMALL)]
_BUCKETS = pack_buckets(_BYTES)
_LAST, _WTE = sum(_BYTES[i] for i in _BUCKETS[-1]), max(_BYTES)
_B_NOISE, _FROM, _TO = 2000, 1024, 8192
_STEPS, _EXAMPLES = steps_and_examples(_TO, _B_NOISE)

QUESTIONS = [
    Question("A 3.7 MB model trains under `DistributedDataParallel(model)` with its default buckets. From iteration 1 "
             "on, how much of each step's all-reduce can start before backward ends?",
             ["None: 3.7 MB is under the 25 MiB cap, so it is one bucket",
              "About the first 1 MiB: the last layers' gradients, in DDP's small first bucket",
              "All of it: DDP all-reduces every gradient as soon as it is ready",
              "Half of it: DDP splits a model below the cap into two equal buckets"], 1,
             ["That is iteration 0 (one bucket) or an explicit bucket_cap_mb=25; by default the rebuilt buckets start "
              "with a 1 MiB one.",
              "Right: with bucket_cap_mb left at None the first bucket closes at 1 MiB, so the last layers' gradients "
              "go on the wire while backward computes the rest; the other 2.6 MB wait for backward's end.",
              "Gradients travel in buckets; a bucket starts only when all its gradients exist.",
              "Buckets close at a byte limit (1 MiB, then 25 MiB), not at a fraction of the model."]),
    Question(f"GPT-2 small ({_P / 1e6:.0f}M parameters, fp32 gradients) trains under DDP with its default buckets. "
             "From iteration 1 on, how many gradient bytes are still to be all-reduced when backward ends?",
             [f"{_LAST / MiB:.1f} MiB: the last bucket", "25 MiB at most: no bucket exceeds the cap",
              "1 MiB: DDP's small bucket", "None: every bucket overlaps backward"], 0,
             [f"Right: backward reaches the token embedding last, and one {_WTE / MiB:.0f} MiB tensor cannot be split, "
              f"so the last of the {len(_BUCKETS)} buckets holds it plus what was still open: {_LAST / MiB:.1f} MiB "
              "start only when backward ends (data_parallel.pack_buckets on the model's tensors). Tying the "
              "embedding to the head makes it ready last.",
              "A bucket closes only after the tensor that crosses the cap: a tensor larger than the cap overshoots it.",
              "The 1 MiB bucket is the first one all-reduced, the last layers' gradients; the question is the last.",
              "The last bucket becomes ready only when backward has produced its last gradient."], transfer=True),
    Question("In naive data parallelism you drop the broadcast at the start (each rank initialises with its own "
             "seed) but still average the gradients every step, with plain SGD. What happens to the replicas?",
             ["The all-reduce pulls them together within a few steps",
              "They stay apart by exactly their initial difference, for ever",
              "They drift further apart each step", "Nothing: averaging the gradients is all DP needs"], 1,
             ["The all-reduce averages gradients, never weights.",
              "Right: every rank adds the same averaged update to different weights, so the initial difference is "
              "kept exactly (and the gradients, computed at different weights, are not the full batch's either). "
              "DDP's constructor broadcasts for this reason.",
              "The updates are identical on every rank; the difference neither grows nor shrinks under plain SGD.",
              "The equation ∇L = (1/N) Σᵢ ∇Lᵢ assumes one set of weights on every rank."], transfer=True),
    Question("On 8 GPUs, you cut the per-GPU batch from 8 sequences to 1 (same model, same link). What happens to "
             "the share of the all-reduce that hides behind backward?",
             ["It grows: smaller batches communicate less", "It shrinks: backward is 8× shorter, the all-reduce is not",
              "Nothing: overlap does not depend on the batch", "It grows: more steps overlap more"], 1,
             ["The all-reduce moves the whole gradient whatever the batch.",
              "Right: the bytes are fixed by the model, the compute scales with tokens; the lab shows the efficiency "
              "falling.",
              "Hiding needs a backward at least as long as the all-reduce.",
              "Each step still has one backward to hide behind."]),
    Question("You forget sampler.set_epoch(epoch) with shuffle=True. What happens?",
             ["Training crashes", "Ranks get overlapping shards", "Every epoch repeats the same order",
              "Each rank shuffles differently"], 2,
             ["Nothing fails loudly: that is why it is a classic bug.",
              "The shards stay disjoint: all ranks draw the same permutation.",
              "Yes: the generator is seeded with seed + epoch, and epoch stays 0.",
              "All ranks use the same seed, so they agree on one order."]),
    Question("Going from 8 to 64 GPUs (batch 256 to 2048) with SGD, what does Goyal et al.'s recipe change, and "
             "when does it stop helping?",
             ["Nothing; never", "lr × 8, reached by a gradual warmup; past the critical batch size (the noise scale)",
              "lr × √8; never", "lr ÷ 8; past 1,024 GPUs"], 1,
             ["Then each epoch takes 8× fewer steps at the same lr: training falls behind.",
              "Yes: η = 0.1·kn/256 with a 5-epoch linear warmup; beyond B_noise a bigger batch mostly wastes samples "
              "(McCandlish et al. 2018).",
              "The square-root rule is for Adam-type optimizers (Malladi et al. 2022), not their SGD recipe.",
              "Bigger batches have less noise, so the step can be larger, not smaller."], transfer=True),
    Question(f"You measured a gradient noise scale B_noise ≈ {_B_NOISE:,} sequences. You grow data parallelism from a "
             f"global batch of {_FROM:,} to {_TO:,}. Against the fewest possible, how many steps and how many "
             "examples does training need now (McCandlish et al. 2018)?",
             [f"{_STEPS:.2f}× the fewest steps, {_EXAMPLES:.1f}× the fewest examples",
              f"{_TO // _FROM}× fewer steps, the same examples: the batch is {_TO // _FROM}× larger",
              f"{_EXAMPLES:.1f}× the fewest steps, {_STEPS:.2f}× the fewest examples",
              "The same steps: past B_noise a bigger batch changes nothing"], 0,
             [f"Right: S/S_min = 1 + B_noise/B = 1 + {_B_NOISE}/{_TO} = {_STEPS:.2f}, E/E_min = 1 + B/B_noise = "
              f"1 + {_TO}/{_B_NOISE} = {_EXAMPLES:.1f}: far past B_noise, the steps barely fall while the "
              "samples (and the GPU hours) grow almost with the batch.",
              "That is perfect scaling, which holds only well below B_noise.",
              "The two factors are swapped: it is the examples that grow with B/B_noise.",
              "Steps keep falling towards S_min, just ever more slowly."], transfer=True),
]
