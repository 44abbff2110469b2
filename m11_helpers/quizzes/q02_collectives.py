"""Lesson 02 quiz: shown by `quiz("02_collectives")`. Its figures come from the helpers, so they match the lesson."""

from m11_helpers import comm_model as cm
from m11_helpers.config import GPT3_175B, RUNNING_EXAMPLE, param_count
from m11_helpers.model_states import gradient_bytes
from m11_helpers.quantities import GB
from m11_helpers.quiz import Question

_P = param_count(RUNNING_EXAMPLE)
_N = 16  # the lesson counts 8 ranks; this quiz asks for 2 nodes of 8
_SENT = {layout: cm.ring_bytes_sent(gradient_bytes(_P, layout), _N) / GB for layout in ("autocast", "deepspeed")}
_FP32 = gradient_bytes(_P, "autocast")
_BIG = gradient_bytes(param_count(GPT3_175B), "autocast")  # the lesson times the 7B; this quiz, GPT-3's fp32 grads
_ONE = cm.cluster_allreduce_time(_BIG, 2, cm.ONE_NIC_H100)
_RAILS = cm.cluster_allreduce_time(_BIG, 2, cm.HGX_H100)
_NODES = 4  # the lesson compares the two at 2 nodes
_RING_OUT, _HIER_OUT = (cm.inter_node_bytes(1.0, _NODES, 8, a) for a in ("ring", "hierarchical"))  # × S
_FLAT = cm.ring_allreduce_time(_BIG, 16, cm.IB_400G.alpha, cm.IB_400G.beta)  # every hop at one NIC: the mistake

QUESTIONS = [
    Question("A 16-GPU data-parallel job (2 nodes of 8 H100) runs on nodes with ONE 400 Gb/s NIC each. You move it "
             "to HGX H100 nodes with one 400 Gb/s NIC per GPU. What happens to the ring all-reduce of the gradients?",
             [f"{_ONE:.1f} s → {_RAILS:.2f} s for GPT-3's (175B) fp32 gradients",
              f"{_FLAT:.2f} s either way: a ring runs at its slowest hop, one 400 Gb/s link",
              f"{_ONE:.1f} s → {_ONE / 2:.1f} s: only the two NICs at the node boundary count",
              "Slower: eight rings pay eight times the latency"], 0,
             ["Right: t ≈ 2(N−1)/N · S / B_node with S = 4 B × 175B = "
              f"{_BIG / GB:.0f} GB and N = 16: B_node = 50 GB/s with one NIC, 8 × 50 = 400 GB/s with one ring per NIC "
              "(a rail, each carrying 1/8 of S), so 8× faster; NVLink (450 GB/s) is not the limit until then.",
              "Each ring does run at one link's speed, but it carries only 1/8 of the data: 8 rings side by side.",
              "Every one of the 8 rings leaves the node through its own NIC.",
              "The rings run at the same time: their α steps overlap, they do not add up."],
             transfer=True),
    Question(f"DDP trains the 7B under torch.amp autocast on {_N} GPUs. You register a bf16 compression comm hook. "
             "What happens to the bytes each rank sends per step (ring all-reduce)?",
             [f"{_SENT['autocast']:.1f} GB → {_SENT['deepspeed']:.1f} GB",
              f"{_SENT['deepspeed']:.1f} GB → {_SENT['deepspeed']:.1f} GB: autocast already makes the gradients bf16",
              f"{_FP32 / GB:.1f} GB → {_FP32 / 2 / GB:.1f} GB",
              f"{_SENT['autocast']:.1f} GB → {_SENT['deepspeed'] / 2:.1f} GB"], 0,
             ["Right: autocast keeps fp32 parameters, so .grad is fp32 (4 B/param); the hook sends bf16 (2 B). "
              f"A ring sends 2(N−1)/N = {2 * (_N - 1) / _N:.2f}× the gradient bytes per rank: "
              f"{2 * (_N - 1) / _N:.2f} × {_FP32 / GB:.1f} GB → {2 * (_N - 1) / _N:.2f} × {_FP32 / 2 / GB:.1f} GB.",
              "autocast runs matmuls in bf16 but the parameters, and so their gradients, stay fp32.",
              "Those are the gradient sizes; each rank SENDS 2(N−1)/N of them in a ring all-reduce.",
              "bf16 halves the bytes once, not twice."],
             transfer=True),
    Question("An nccl-tests all-reduce on 8 GPUs reports algbw 200 GB/s. What is its busbw?",
             ["200 GB/s", "350 GB/s", "400 GB/s", "1600 GB/s"], 1,
             ["busbw multiplies algbw by 2(N−1)/N for all-reduce.",
              "Yes: 200 × 2·7/8 = 350 GB/s, comparable with NVLink's per-direction peak.",
              "That uses a factor 2; the exact factor is 2(N−1)/N = 1.75.",
              "busbw is per link, not summed over GPUs."]),
    Question("You grow a job from 8 to 1024 ranks on the same network. Which term of the ring all-reduce's time grows "
             "most?",
             ["The bandwidth term 2(N−1)/N·S·β", "The latency term 2(N−1)α", "Neither: the ring is O(1) in N",
              "Both grow linearly"], 1,
             ["It goes from 1.75 S·β to 1.998 S·β: barely moves.",
              "Yes: 14α → 2046α. For small messages that dominates, which is why libraries switch to trees (and "
              "hierarchical schemes) at scale.",
              "Only the bandwidth term is (nearly) constant.",
              "The bandwidth term is bounded by 2S·β."],
             transfer=True),
    Question(f"{_NODES} nodes of 8 GPUs, one NIC per node. You replace the flat ring all-reduce of S bytes by a "
             "hierarchical one (reduce-scatter in the node, all-reduce each GPU's 1/8 shard across nodes, all-gather "
             "in the node). The bytes each node sends to the network…",
             [f"fall to {_HIER_OUT / _RING_OUT:.3f}× the flat ring's", "fall to 1/8 of the flat ring's: only a 1/8 "
              "shard crosses", "stay the same: an all-reduce is an all-reduce",
              "double: there are three collectives instead of one"], 0,
             [f"Right: the flat ring leaves the node with 2(N−1)/N·S = 2·{_NODES * 8 - 1}/{_NODES * 8}·S; the "
              f"hierarchical one with 2(nodes−1)/nodes·S = 2·{_NODES - 1}/{_NODES}·S (8 shards of S/8): "
              f"{_HIER_OUT:.2f}/{_RING_OUT:.3f} = {_HIER_OUT / _RING_OUT:.3f}× the bytes (comm_model.inter_node_bytes). The gain shrinks as nodes grow; "
              "the steps fall from 2(N−1) to 2(g−1) + 2(nodes−1).",
              "Each GPU sends its 1/8, but all 8 GPUs of the node do: S/8 × 8 = S per pass.",
              "The pattern decides which links carry the bytes; the lesson counts them.",
              "The reduce-scatter and the all-gather stay on NVLink: no network bytes."],
             transfer=True),
]
