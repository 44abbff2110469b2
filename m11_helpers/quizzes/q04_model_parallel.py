"""Lesson 04 quiz: shown by `quiz("04_model_parallel")`."""

from m11_helpers.quiz import Question

QUESTIONS = [
    Question("A 4-stage pipeline runs 8 micro-batches with GPipe. You switch it to 1F1B. What happens to the idle "
             "time and to stage 0's activation memory?",
             ["Idle time 27 % → 12 %; memory unchanged", "Idle time unchanged (27 %); stage 0 holds 4 micro-batches' "
              "activations instead of 8", "Both halve", "Idle time unchanged; memory unchanged: only the order differs"],
             1,
             ["No: both leave (p−1)/(m+p−1) = 3/11 = 27 % idle; only more micro-batches or interleaving shrink it.",
              "Right: 1F1B starts each backward as soon as it can, so stage s holds at most p−s micro-batches.",
              "The bubble does not move: fill and drain take the same ticks in both schedules.",
              "The order is what frees memory early: look at the in-flight counts the lesson measured."],
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
    Question("A model runs TP 8 inside a DGX A100 node (NVLink 3, one 25 GB/s HDR NIC per GPU). You spread the same "
             "TP 8 group over two nodes, 4 GPUs each. What happens to the time of each layer's all-reduces?",
             ["About the same: the bytes are the same", "About 3× longer (0.95 → 2.6 ms per layer): the ring crosses "
              "the network on 4 rails, 4 × 25 = 100 GB/s per GPU instead of NVLink's 300",
              "About 12× longer: every hop runs at one NIC's 25 GB/s", "Shorter: more links in parallel"], 1,
             ["Same bytes, but the ring now crosses InfiniBand, slower than NVLink.",
              "Right: NCCL runs one ring per NIC, so the 4 GPUs' 4 NICs carry the traffic together (lesson 02's "
              "comm_model.Fabric; the lesson's table). Still 3× slower on the heaviest traffic: Megatron-LM keeps "
              "TP inside a node (Narayanan et al. 2021, §3).",
              "That is the case with each TP rank on its own node (about 10× with latency); with 4 GPUs per node, "
              "4 rings share the work over 4 NICs.",
              "The NICs add up to less than NVLink: 100 GB/s against 300 per GPU."],
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
]
