"""Lesson 05 quiz: shown by `quiz("05_zero_fsdp")`. Its figures come from the helpers, so they match the lesson."""

from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.model_states import bytes_per_param, model_state_bytes
from m11_helpers.quantities import GB, GiB
from m11_helpers.quiz import Question
from m11_helpers.zero import min_gpus

_P = param_count(RUNNING_EXAMPLE)
_Z2 = {n: model_state_bytes(_P, "deepspeed", n, 2)["total"] / GB for n in (8, 16)}
_W = bytes_per_param("deepspeed")["weights"] * _P / GB  # bf16 weights, replicated under ZeRO-2
_Z3_16 = model_state_bytes(_P, "deepspeed", 16, 3)["total"] / GB  # what ZeRO-3 would hold
_100B = 100_000_000_000
_FEWEST = min_gpus(_100B, 40 * GiB, 3)
_BLOCK, _DEPTH, _BLOCKS = 0.35, 2, 48  # GB of bf16 parameters per block; blocks prefetched ahead; blocks
_HELD = (1 + _DEPTH) * _BLOCK  # the block computing + the ones in flight: (1 + depth) × block

QUESTIONS = [
    Question(f"The 7B trains with ZeRO-2 on 8 GPUs ({_Z2[8]:.1f} GB of model states per GPU). You double to 16 "
             "GPUs. What happens to the model states per GPU?",
             [f"They halve, to {_Z2[8] / 2:.1f} GB", f"They fall to {_Z2[16]:.1f} GB",
              f"They stay at {_Z2[8]:.1f} GB", f"They fall to {_Z3_16:.1f} GB"], 1,
             ["Only the sharded parts halve.",
              f"Right: 2Ψ + 14Ψ/N. The {_W:.1f} GB of bf16 weights stay whole on every GPU; only gradients and "
              "optimizer state are split further. That floor is why ZeRO-2 saves 4.3× at N = 8 and never more than 8×.",
              "Gradients and optimizer state are divided by N: they shrink.",
              "That is ZeRO-3 (16Ψ/N): ZeRO-2 keeps the weights replicated."],
             transfer=True),
    Question("You switch FSDP2 from reshard_after_forward=True to False. What changes?",
             ["Nothing: it is a performance hint", "One all-gather per step less (3Ψ → 2Ψ), but every block's full "
              "parameters stay alive from forward to backward", "Less memory and less communication",
              "Gradients are no longer reduce-scattered"], 1,
             ["The lesson measured both: the traffic counter and the live memory differ.",
              "Right: measured in the lesson, 1Ψ less all-gathered and about 4 blocks' worth more memory held "
              "after forward: ZeRO-2-like memory for the parameters during the step.",
              "It trades memory for communication: more of one, less of the other.",
              "Gradients are reduce-scattered either way; only the parameters' second all-gather goes."]),
    Question(f"FSDP on a {_BLOCKS}-block model, {_BLOCK:.2f} GB of bf16 parameters per block (fp32 master shards, "
             f"MixedPrecisionPolicy(param_dtype=bf16)). You prefetch {_DEPTH} blocks ahead in forward and backward. "
             "At most how many GB of gathered parameters does a GPU hold at once?",
             [f"{_BLOCK:.2f} GB: one block at a time", f"{_HELD:.2f} GB", f"{2 * _HELD:.2f} GB",
              f"{_BLOCKS * _BLOCK:.1f} GB: every block"], 1,
             ["That is no prefetch: each gather waited as soon as it is issued, nothing overlaps.",
              f"Right: the block computing plus the {_DEPTH} whose gathers are in flight, (1 + {_DEPTH}) × "
              f"{_BLOCK:.2f} GB, in forward and again in backward (exercise 5.4 measures yours). Prefetch buys "
              "overlap with blocks of memory; reshard_after_forward=False would hold every block instead.",
              "That counts the blocks in fp32: cast before the gather, they travel and live in bf16.",
              "That is unbounded prefetch, or one fully_shard around the whole model."],
             transfer=True),
    Question("ZeRO-2 shards the gradients. How many bytes does it communicate per step, compared with DDP?",
             ["The same, 2Ψ: it reduce-scatters the gradients and all-gathers the updated weights",
              "More: it all-reduces the gradients and then all-gathers the weights, 3Ψ",
              "Half: each rank only sends its shard", "N times more"], 0,
             ["Right (ZeRO §5.2, §7.2.1): DDP's all-reduce is itself a reduce-scatter plus an all-gather; ZeRO puts "
              "the optimizer step between the two. 'ZeRO-2 uses all-reduce' is a common mistake.",
              "ZeRO-2 never all-reduces: no rank needs the whole summed gradient.",
              "Every rank still receives all Ψ updated weights in the all-gather.",
              "Collective volume per rank does not grow with N."]),
    Question("You wrap the whole model in one fully_shard call instead of one per block. What happens to the "
             "parameter memory during forward?",
             ["Nothing: the parameters are sharded either way", "It rises to the whole model's parameters: they "
              "are gathered together before the first layer and freed only after the last",
              "It falls: one all-gather instead of many", "Forward fails: FSDP2 needs one call per block"], 1,
             ["At rest, yes; but ZeRO-3 saves memory *during* the step by gathering one unit at a time.",
              "Right: the unit of fully_shard is the unit of gathering. One unit = the whole model unsharded while "
              "it computes, the memory ZeRO-3 was meant to save.",
              "Fewer, larger collectives, but the peak is what decides whether it fits.",
              "It runs; the nesting only decides what is gathered together."],
             transfer=True),
    Question("The 7B trains with ZeRO-3. You grow the job from 8 to 64 GPUs with the same micro-batch per GPU. "
             "What happens to the activation memory per GPU?",
             ["It falls 8×, like the model states", "It stays the same: data parallelism never shards activations",
              "It grows: more ranks, more buffers", "It falls to zero: ZeRO-3 shards everything"], 1,
             ["Only model states are divided by N.",
              "Right: each rank keeps the activations of its own micro-batch. Shrinking them takes recomputation "
              "(lesson 08) or tensor/sequence parallelism (lessons 04 and 12).",
              "Activation memory depends on the micro-batch and the model, not on N.",
              "'Everything' is parameters, gradients and optimizer state: model states, not activations."],
             transfer=True),
    Question("A 100B-parameter model, mixed-precision Adam, ZeRO-3, no offload, on GPUs with 40 GB of HBM. "
             "How many GPUs does it need at least (model states only)?",
             ["8: 400 GB / 8 = 50 GB … almost", "10", str(_FEWEST), "None: ZeRO-3 cannot fit it"], 2,
             ["400 GB counts fp32 weights only; Adam training needs 16 bytes per parameter, 1.6 TB.",
              "That would be 160 GB per GPU.",
              f"Right: 1.6 TB over 40 GiB (42.9e9 B) GPUs is {_100B * 16 / (40 * GiB):.2f}: round up. With "
              "decimal GB the answer would be 40 — the 7 % GB/GiB gap changes the count.",
              "ZeRO-3 divides all 16 bytes by N: enough GPUs always fit the states."]),
]
