"""Lesson 11 quiz: shown by `quiz("11_capstone")`. Its figures come from the helpers, so they match the lesson."""

from m11_helpers.capstone_gpu import predict_gpu_run
from m11_helpers.capstone_plan import Flags, plan_run
from m11_helpers.config import RUNNING_EXAMPLE
from m11_helpers.quantities import GB, GiB, value
from m11_helpers.quiz import Question

_R = RUNNING_EXAMPLE
_DDP = predict_gpu_run(_R, 8, parallel="ddp")  # autocast
_REC = predict_gpu_run(_R, 16, ac=True)  # the lesson plans 8 GPUs; this question, 16
_FLASH = predict_gpu_run(_R, 16, flash=True)
_FLASH8 = predict_gpu_run(_R, 8, flash=True)
_FSDP = predict_gpu_run(_R, 8)  # FSDP2 + bf16, no flash
_COPIES = value("7b.autocast_weight_copies") / GB
_K = 8  # the lesson's grid has K = 1, 2, 4
_K1, _KK = plan_run(Flags("fsdp2"), 2), plan_run(Flags("fsdp2", accum=_K), 2)
_HALF = plan_run(Flags("fsdp2", bf16=True), 2)["activations"] / _K1["activations"]

QUESTIONS = [
    Question(f"The 7B trains with DDP + bf16 autocast on 8 × H100 (80 GiB) and does not fit: "
             f"{_DDP['states'] / GB:.0f} GB of model states + {_DDP['activations'] / GB:.0f} GB of activations per "
             "GPU. Which ONE lever makes it fit?",
             ["Full activation recomputation", "Gradient accumulation with K = 8",
              "FSDP2 (ZeRO-3) with bf16 parameters", "Twice as many GPUs, still DDP"], 2,
             ["Recomputation shrinks the activations, but the model states alone exceed 80 GiB on every rank.",
              f"Accumulation shrinks activations per micro-batch; DDP still replicates the {_DDP['states'] / GB:.0f} GB "
              "of states.",
              f"Right: the states shrink to {_FLASH8['states'] / GB:.1f} GB per GPU, and bf16 parameters keep the "
              f"activations in 16 bits ({_FSDP['activations'] / GB:.0f} GB): it fits, tightly.",
              "Data parallelism replicates the model states: more DDP ranks never lower them."]),
    Question(f"FSDP2 + bf16 + full recomputation plans {_REC['total'] / GiB:.1f} GiB per GPU for the 7B on 16 × H100. "
             "You turn recomputation off and use PyTorch's fused attention (SDPA: FlashAttention on an H100) instead. "
             "What happens to the plan?",
             [f"It still fits, at {_FLASH['total'] / GiB:.1f} GiB, and each step needs a quarter less compute",
              "It no longer fits: without recomputation every layer keeps its 4096 × 4096 attention scores",
              "Nothing changes: the attention kernel does not affect memory",
              "Memory is unchanged, only the step gets faster"], 0,
             ["Right: the fused kernel never stores the a·s² scores (Dao et al. 2022), so one sequence keeps "
              f"{_FLASH['activations'] / GiB:.1f} GiB beside {_FLASH['states'] / GiB:.1f} GiB of states (16Ψ/16): "
              f"{_FLASH['total'] / GiB:.1f} GiB — and 6Ψ instead of 8Ψ FLOPs per token.",
              "The scores are exactly what the fused kernel does not store: it recomputes them block by block.",
              "Textbook attention keeps 32 heads × 4096² scores per layer; the fused kernel keeps a log-sum-exp.",
              "The saving is memory first: tens of GB per sequence."], transfer=True),
    Question(f"The reference script runs FSDP2 with --accum 1 on 2 ranks. You set --accum {_K} at the same global batch. "
             "Per rank and step, what happens to the activations kept and to the elements communicated?",
             ["Both stay the same: the global batch did not change",
              f"Activations ÷ {_K}; elements × {_KK['comm_elements'] / _K1['comm_elements']:.1f}",
              f"Activations ÷ {_K}; elements ÷ {_K}", f"Activations unchanged; elements × {_K}"], 1,
             [f"Activations are kept per micro-batch, and a micro-batch is now 1/{_K} of the rank's share.",
              f"Right: every micro-batch all-gathers the weights again (forward and backward), the reduce-scatter "
              f"still runs once: {_K1['comm_elements']:,} → {_KK['comm_elements']:,} elements (capstone_plan.plan_run, "
              "which the lesson measured exact for K = 2). "
              "set_requires_gradient_sync skips the reduce-scatters, not the all-gathers: the shards must be "
              "gathered for every forward and backward.",
              "Skipping the gradient sync saves reduce-scatters; the all-gathers grow with K.",
              f"Each micro-batch is 1/{_K} the size, and so are its activations."], transfer=True),
    Question("You move a run from DDP + bf16 autocast to FSDP2 with MixedPrecisionPolicy(param_dtype=bf16). What "
             f"happens to the bf16 weight copies autocast kept from forward to backward ({_COPIES:.1f} GB for the 7B)?",
             ["They grow: FSDP2 keeps a bf16 copy of every shard as well",
              "They disappear as a model-wide cost: FSDP2 gathers each block's bf16 weights just before it runs and "
              "frees them after, so at most a block or two exist at a time",
              "Nothing changes: both are bf16 mixed precision", "They move to the CPU"], 1,
             ["The shards stay fp32 (the optimizer's copy); bf16 exists only as the gathered, temporary one.",
              "Right: the per-block gather replaces the cast cache, and with bf16 parameters the residual stream, "
              f"norms and matmul inputs are 16-bit too — about half the fp32 activations (measured: {_HALF:.2f} on the tiny GPT).",
              "Autocast casts per op and keeps the casts for backward; FSDP2 casts once per gather and frees them.",
              "Neither keeps weight copies on the CPU (that would be offload, another lever)."], transfer=True),
    Question("Your preemption-safe loop saves the model and the optimizer when the ranks agree to stop, and resumes "
             "from them — but not the learning-rate scheduler. The run warms up over 100 steps and is preempted at "
             "step 500. What does the resumed run do?",
             ["Exactly what the uninterrupted run would have done",
              "It warms up again from a tiny learning rate and follows the cosine from its start: a different run "
              "from then on, which a bitwise comparison catches at the first resumed step",
              "It crashes on load", "It skips the batches it already saw"], 1,
             ["The scheduler's step count is state the next step depends on, like AdamW's moments.",
              "Right: a fresh scheduler starts at step 0. Save everything the next step depends on — model, "
              "optimizer, scheduler, data position, every rank's RNG — and check a resume bit for bit.",
              "Loading a checkpoint that lacks the scheduler works; the scheduler simply starts over.",
              "The data position is the step count here: it resumes at the right batch, with the wrong learning rate."],
             transfer=True),
]
