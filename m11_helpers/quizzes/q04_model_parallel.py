"""Lesson 04 quiz: shown by `quiz("04_model_parallel")`."""

from m11_helpers.comm_model import HGX_H100, group_link
from m11_helpers.config import RUNNING_EXAMPLE
from m11_helpers.hardware_specs import chip
from m11_helpers.overlap import tp_overlap
from m11_helpers.pipeline import bubble_fraction, schedule_order
from m11_helpers.pipeline_ticks import bubble_fraction as tick_bubble
from m11_helpers.pipeline_ticks import bubble_ticks, in_flight, replay, zb_h1_order
from m11_helpers.quiz import Question

_P, _M = 8, 24  # the lesson runs 4 stages × 8 micro-batches; this quiz, 8 × 24
_BUBBLE = bubble_fraction(_P, _M)  # GPipe and 1F1B alike
_HALF = bubble_fraction(_P, _M, "interleaved", 2)
_FLOPS = 0.5 * chip("H100 SXM").peak_flops("bf16")  # the lesson's A100 cluster, here HGX H100 nodes


def _tp_ms(link) -> float:
    return 1e3 * tp_overlap(RUNNING_EXAMPLE, 4096, 8, link, _FLOPS).comm_s  # 4 all-reduces per layer


_TP = {"nvlink": _tp_ms(HGX_H100.intra), "4 rails": _tp_ms(group_link(HGX_H100, 4)),
       "1 rail": _tp_ms(group_link(HGX_H100, 1))}
_NIC = group_link(HGX_H100, 4).gbs_per_direction

# The lesson replays 4 devices × 8 micro-batches; this quiz, 12 × 24, one layer per stage (F = B = W = 1 tick)
_ZP, _ZM = 12, 24
_ONE = replay([[("F" if k == "F" else "BW", s, i) for k, i, _ in order]
               for s, order in enumerate(schedule_order(_ZP, _ZM, "1f1b"))])
_ZB = replay(zb_h1_order(_ZP, _ZM))
_HELD_1F1B, _HELD_ZB = in_flight(_ONE)[_ZP - 1], in_flight(_ZB)[_ZP - 1]  # the last device's micro-batches in flight

QUESTIONS = [
    Question(f"An {_P}-stage pipeline runs {_M} micro-batches with GPipe. You switch it to 1F1B. What happens to "
             "the idle time and to stage 0's activation memory?",
             [f"Idle {_BUBBLE:.0%} → {_HALF:.0%}; memory unchanged",
              f"Idle unchanged ({_BUBBLE:.0%}); stage 0 holds {_P} micro-batches' activations instead of {_M}",
              f"Idle {_BUBBLE:.0%} → {_BUBBLE / 2:.0%}; stage 0 holds {_P} instead of {_M}",
              "Idle time unchanged; memory unchanged: only the order differs"], 1,
             [f"That is interleaving with 2 chunks per stage, (p−1)/(v·m + p−1) = {_P - 1}/{2 * _M + _P - 1}; 1F1B "
              "alone keeps the bubble and frees memory.",
              f"Right: both leave (p−1)/(m+p−1) = {_P - 1}/{_M + _P - 1} = {_BUBBLE:.0%} idle, and 1F1B starts "
              f"each backward as soon as it can, so stage s holds at most p − s micro-batches: {_P} on stage 0, "
              f"against GPipe's m = {_M}.",
              "The bubble does not move: fill and drain take the same ticks in both schedules.",
              "The order is what frees memory early: a micro-batch's activations go once its backward has run."],
             transfer=True),
    Question("In Megatron's MLP, why is the first linear layer split by columns and the second by rows?",
             ["It balances the parameters", "GeLU is elementwise, so it runs on the split output with no "
              "communication; the row split then needs one all-reduce", "Row-parallel layers are faster",
              "To avoid every all-reduce"], 1,
             ["Both splits hold the same number of parameters either way.",
              "Right: one all-reduce forward (g) and one backward (f) for the whole MLP.",
              "Speed per layer is the same; the pairing removes a synchronisation between the two layers.",
              "One all-reduce remains, forward and backward."]),
    Question("You write f (identity forward) but forget the all-reduce in its backward. The MLP's output is right. "
             "Which gradients are wrong?",
             ["None: the forward is right, so the gradients are too", "The shards' weight gradients",
              "The gradient flowing to the layers before the MLP: each rank passes back only its own share",
              "Only proj's bias gradient"], 2,
             ["The forward never sees f's backward: that is why the lesson checks gradients, not only outputs.",
              "Those are local: each shard's weight gradient is right without any communication.",
              "Right: x fanned out to every rank's shard, so its gradient is the sum over ranks; without f's "
              "all-reduce, every earlier layer trains on a partial gradient.",
              "proj's bias sits after g, where every rank already holds the whole gradient."],
             transfer=True),
    Question("A column-parallel layer's output is needed in full on every rank (say, for a loss). Which collective "
             "assembles it?",
             ["all-reduce", "all-gather", "reduce-scatter", "none: it is already full"], 1,
             ["Summing the slices adds unrelated features: the lesson measured that it equals nothing useful.",
              "Right: rank i holds the features [i·n/w, (i+1)·n/w); concatenating the slices rebuilds the output. "
              "Before a row-parallel layer, nothing is needed at all.",
              "That leaves each rank a slice of a sum, the opposite of what is needed.",
              "Each rank holds only its slice of the features."]),
    Question("The 7B runs TP 8 inside an HGX H100 node (NVLink 4, one 400 Gb/s NIC per GPU). You spread the same "
             "TP 8 group over two nodes, 4 GPUs each. What happens to the time of each layer's 4 all-reduces?",
             ["About the same: the bytes are the same",
              f"{_TP['nvlink']:.2f} → {_TP['4 rails']:.2f} ms per layer",
              f"{_TP['nvlink']:.2f} → {_TP['1 rail']:.2f} ms per layer", "Shorter: more links in parallel"], 1,
             ["Same bytes, but the ring now crosses InfiniBand, slower than NVLink.",
              f"Right: NCCL runs one ring per NIC, so the group's 4 GPUs per node drive 4 rails: {_NIC:.0f} GB/s "
              f"per GPU against NVLink's {HGX_H100.intra.gbs_per_direction:.0f}, "
              f"{HGX_H100.intra.gbs_per_direction / _NIC:.2f}× the bandwidth term (comm_model.group_link; the "
              "lesson's table did this for a DGX A100). Megatron-LM keeps TP inside a node (Narayanan et al. 2021, §3).",
              "That is one TP rank per node, every hop on one NIC's 50 GB/s; with 4 GPUs per node, 4 rings share the "
              "work over 4 NICs.",
              "The NICs add up to less than NVLink per GPU."],
             transfer=True),
    Question("Where does Megatron-LM place its three kinds of parallelism on a cluster of 8-GPU nodes?",
             ["Pipeline inside a node, data parallel across nodes", "Tensor parallel inside a node, pipeline "
              "across nodes, data parallel over copies of that whole model-parallel group",
              "Data parallel inside a node, tensor parallel across", "Anywhere: NCCL hides the difference"], 1,
             ["A common summary, but not Megatron's: the pipeline's point-to-point messages are the ones that can "
              "cross nodes, while TP's per-layer all-reduces need NVLink.",
              "Right (Narayanan et al. 2021, §3, Takeaways #1–#2; Megatron's rank order puts TP ranks adjacent).",
              "Data parallelism sends the least, once per step: it is the outer level.",
              "The lesson computed a 3× (two nodes of four GPUs) to 10× (one rank per node) gap per layer."]),
    Question(f"A {_ZP}-stage pipeline (one layer per stage, F = B = W) runs {_ZM} micro-batches with 1F1B. You switch to "
             "ZB-H1 (torch's ScheduleInterleavedZeroBubble, one stage per device). What happens to the bubble and to "
             "the last stage's activations?",
             [f"Bubble {tick_bubble(_ONE):.1%} → 0 %: the W's fill every gap",
              f"Bubble unchanged ({tick_bubble(_ONE):.1%}): B + W is the same backward, only cut in two",
              f"Bubble {tick_bubble(_ONE):.1%} → {tick_bubble(_ZB):.1%}; the last stage holds {_HELD_ZB} micro-batches' "
              f"activations instead of {_HELD_1F1B}",
              f"Bubble {tick_bubble(_ONE):.1%} → {tick_bubble(_ZB):.1%}; activations unchanged"], 2,
             ["Zero needs the V placement (ZB-V), and even then the fill stays: ZB-H1 keeps (p−1)(F+B−W) per device.",
              "Splitting is what lets W move: nothing waits for W, so it runs where the device would idle.",
              f"Right: idle per device (p−1)(F+B+W) = {bubble_ticks('1f1b', _ZP, _ZP, chunks=1):g} ticks → "
              f"(p−1)(F+B−W) = {bubble_ticks('zb1p', _ZP, _ZP, chunks=1):g} (Qi et al. 2024, §2.1), in a step of "
              f"{max(o.end for o in _ONE)} → {max(o.end for o in _ZB)} ticks. Device s holds back s W's to fill its "
              f"drain, and a W needs its micro-batch's activations: every device now holds {_HELD_ZB} in flight, "
              f"where 1F1B's last stage held {_HELD_1F1B}.",
              "A held-back W keeps its micro-batch's activations (W needs the layer's input): the bubble is paid for "
              "in memory, most on the later stages."],
             transfer=True),
]
