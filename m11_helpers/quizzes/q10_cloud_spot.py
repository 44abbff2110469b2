"""Lesson 10 quiz: shown by `quiz("10_cloud_spot")`. Its figures come from the helpers, so they match the lesson."""

from m11_helpers.cloud import failures_per_hour, spot_cost, young_interval
from m11_helpers.comm_model import bus_factor
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.quiz import Question

_TAU = {d: young_interval(d, 3 * 3600) / 60 for d in (120, 30)}  # minutes, M = 3 h
_GPUS, _DELTA = 2048, 180  # the lesson tabulates 8, 512, 4,096 and 16,384 GPUs, δ = 2 min
_MTBF = 3600 / failures_per_hour(_GPUS)  # seconds
_YOUNG = young_interval(_DELTA, _MTBF) / 60  # minutes
_RATE = 2  # preemptions per hour; the lesson tabulates 0.1, 1 and 4
_ONE = spot_cost(100, 1.0, discount=0.7, preemptions_per_hour=_RATE, checkpoint_seconds=120, restart_seconds=300)
_OLD_OD = 100 + 120 / 3600 * (int(100 * 60 / _ONE["interval_minutes"]))  # on-demand charged spot's checkpoints
_OLD = 1 - _ONE["spot_hours"] * 0.3 / _OLD_OD

_SITES, _H, _INNER = 4, 100, 1000  # the lesson ran 4 ranks of the tiny GPT, H = 1, 4, 8, for 8 steps
_S = 4 * param_count(RUNNING_EXAMPLE) / 1e9  # GB: one fp32 copy of the 7B example's parameters
_WIRE = _INNER // _H * bus_factor("all_reduce", _SITES) * _S  # GB a site sends: rounds × 2(N−1)/N × S

QUESTIONS = [
    Question(f"Your run checkpoints at Young's interval: δ = 2 min, M = 3 h, so every {_TAU[120]:.1f} min. An "
             "asynchronous save cuts what training waits for to δ = 30 s. What happens to the best interval?",
             ["Nothing: an async save is free, keep the interval", f"It halves, to {_TAU[30]:.1f} min",
              f"It falls 4×, to {_TAU[120] / 4:.1f} min", "It doubles: cheaper saves can be rarer"], 1,
             ["A save that costs less makes more of them worth writing: the interval moves.",
              "Right: τ = √(2δM) grows with the square root of δ: 4× cheaper saves, half the interval, and "
              "half the work lost per failure.",
              "τ is proportional to √δ, not to δ.",
              "The other way round: cheaper checkpoints are worth writing more often."],
             transfer=True),
    Question("A 4-rank FSDP2 run saved with torch.distributed.checkpoint is preempted; only 2 GPUs are free now. "
             "You restart it on 2 ranks with the same global batch. What happens?",
             ["It fails: the checkpoint's mesh has 4 ranks",
              "It resumes: each new rank reads the slices of each tensor its shards cover; the losses continue to "
              "within float-summation tolerance, not bit for bit",
              "It resumes bit for bit, exactly as on 4 ranks",
              "Rank 0 must first gather the whole checkpoint into one file"], 1,
             ["That is what a rank-0 torch.save of the DTensor shards does: its tensors are tied to the 4-rank mesh.",
              "Right: the .metadata maps every tensor slice to a file, so any world size loads it (measured in the "
              "lesson: within 1e-5). Two ranks sum the gradients in another order, so not bitwise.",
              "A different number of ranks adds the partial gradients in a different order: a few ulp apart.",
              "No gather: each rank reads only what its new shards need."]),
    Question(f"Spot at {_RATE} preemptions per hour, 70 % discount, 2-minute checkpoints, 5-minute restarts, against "
             "an on-demand run that nothing interrupts. What does spot save on 100 hours of work?",
             ["70 %: the discount", f"{_OLD:.1%}", f"{_ONE['saving']:.1%}", "Nothing: it costs more"], 2,
             ["The list discount, before any preemption is paid for.",
              "That charges the on-demand run spot's checkpoint every "
              f"{_ONE['interval_minutes']:.1f} min; an uninterrupted run needs none.",
              f"Right: spot checkpoints every √(2δM) = √(2 × 2 min × 30 min) = {_ONE['interval_minutes']:.1f} min and "
              f"needs {_ONE['spot_hours']:.1f} h (Daly's model) for 100 h of work; at 30 % of the price that is "
              f"{_ONE['spot_hours'] * 0.3:.1f} against 100: {_ONE['saving']:.1%} less.",
              "Not at this rate: the break-even rate is higher (exercise 10.3)."], transfer=True),
    Question("The spike guard caught a NaN at step 7 and rolled back to the step-6 checkpoint. You rerun from there "
             "without skipping any batch. What happens?",
             ["The NaN is gone: a rollback resets whatever caused it",
              "The same NaN at step 7: the same weights, optimizer state, RNG and batch give the same step",
              "A NaN at a random later step", "Training diverges at once"], 1,
             ["Nothing changed: the resumed run is bit-identical to the first one.",
              "Right: resume is deterministic, so you must change something: skip the batches (PaLM) or lower the "
              "learning rate (OPT-175B).",
              "Nothing random differs: every RNG state was restored.",
              "The step-6 weights were good: step 6 runs as before."]),
    Question("With dcp.async_save, what does the training loop still wait for at each checkpoint?",
             ["Nothing", "The copy of its state into CPU memory; the files are written in the background",
              "Every file and the metadata on disk", "Rank 0 gathering the full state dict"], 1,
             ["The state must be copied before the next step changes it.",
              "Right: the staging copy is the δ training pays (a fraction of a synchronous save in the course's "
              "benchmark); a checkpoint is complete only when its metadata lands.",
              "That is dcp.save, the synchronous one.",
              "DCP never gathers: each rank writes its own shards."]),
    Question(f"An on-demand job on {_GPUS:,} GPUs fails at Llama 3's rate of unexpected interruptions (Dubey et al. "
             f"2024: 419 in 54 days on 16,384 GPUs). A synchronous checkpoint takes {_DELTA // 60} min. Young's "
             "interval is about…",
             [f"{_YOUNG:.0f} min", f"{(_DELTA * _MTBF) ** 0.5 / 60:.0f} min", f"{_MTBF / 3600:.1f} h: once per MTBF",
              f"{young_interval(_DELTA, 3600 / failures_per_hour(16_384)) / 60:.0f} min, as on 16,384 GPUs"], 0,
             [f"Right: λ = {_GPUS:,} × 419 / (54 × 24 h × 16,384) = {failures_per_hour(_GPUS):.4f}/h, so M = "
              f"{_MTBF / 60:,.0f} min; τ = √(2δM) = √(2 × {_DELTA // 60} × {_MTBF / 60:,.0f}) = {_YOUNG:.0f} min.",
              "That is √(δM): Young's optimum has the factor 2, τ = √(2δM).",
              "Checkpointing once per MTBF loses half an MTBF of work per failure on average: far more than "
              "the saves cost.",
              "M grows as the job shrinks: 8× fewer GPUs, 8× the MTBF, √8× the interval."], transfer=True),
    Question(f"{_SITES} sites train the course's 7B example with DiLoCo, H = {_H}, all-reducing fp32 "
             f"pseudo-gradients with a ring after each round. Over {_INNER:,} inner steps, how much does each "
             "site send over the network?",
             [f"{_WIRE:,.0f} GB", f"{_WIRE / bus_factor('all_reduce', _SITES):,.0f} GB",
              f"{_WIRE * _H / 1000:,.0f} TB", f"{_WIRE / _H:,.1f} GB"], 0,
             [f"Right: {_INNER:,} / {_H} = {_INNER // _H} rounds, each one all-reduce of S = 4 B × "
              f"{param_count(RUNNING_EXAMPLE) / 1e9:.2f}B = {_S:.1f} GB, of which a ring sends 2(N−1)/N = "
              f"{bus_factor('all_reduce', _SITES):.2f} × S per site: {_INNER // _H} × {bus_factor('all_reduce', _SITES):.2f}"
              f" × {_S:.1f} GB.",
              "That is the payload (the tensor each site hands to the all-reduce); a ring puts 2(N−1)/N of it on "
              "the wire per site.",
              "That is data parallel: one gradient all-reduce every step, H times DiLoCo's traffic.",
              "Divided by H twice: the H is already in the number of rounds."], transfer=True),
]
