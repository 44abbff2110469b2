"""Lesson 12 quiz: shown by `quiz("12_long_context_moe")`."""

from m11_helpers.comm_model import HGX_H100
from m11_helpers.hsdp import hsdp_vs_fsdp
from m11_helpers.quiz import Question
from m11_helpers.ulysses import choose_cp, ulysses_bytes_per_rank

_NODES, _G = 4, HGX_H100.gpus  # the lesson compares 8 nodes; this quiz, 4
_N = _NODES * _G
_X = hsdp_vs_fsdp(1.0, _NODES, HGX_H100)  # per GPU, bytes per byte of parameters (= gradients here)
_GAIN = _X["fsdp_inter_bytes"] / _X["hsdp_inter_bytes"]
_NODE_MISTAKE = _X["fsdp_inter_bytes"] * _G / _X["hsdp_inter_bytes"]  # a node's FSDP bytes against one GPU's HSDP
_CP = choose_cp(16, 4, 8)  # 16 CP ranks on two 8-GPU nodes, 4 K/V heads (the lesson's table: other cases)
# a rank's bf16 all-to-alls per layer: its Ulysses group holds T/ring positions; q and out 32·128 wide, k and v 4·128
_U = ulysses_bytes_per_rank(262144 // _CP["ring"], _CP["ulysses"], 1)["per_all_to_all"] * (2 * 4096 + 2 * 512) / 2**20

QUESTIONS = [
    Question("Megatron sequence parallelism replaces each tensor-parallel all-reduce with a reduce-scatter and an "
             "all-gather. Compared with plain TP on the same t ranks, the bytes each rank sends per layer…",
             ["halve", "stay the same (all-reduce = reduce-scatter + all-gather)", "double",
              "grow with the sequence length squared"], 1,
             ["A reduce-scatter alone is half an all-reduce, but SP needs the matching all-gather too.",
              "Right: we counted 196,608 B for both (fp64 tensors). Only Megatron's re-gather in backward (to store ÷t) adds one "
              "all-gather per column-parallel linear.",
              "No: the same two halves of a ring all-reduce, run at different places.",
              "SP's messages are b·s·h elements, linear in s."]),
    Question("You switch a causal ring attention over 8 ranks from contiguous chunks to the zigzag layout. "
             "What happens to the busiest rank's attention work?",
             ["nothing: each rank still sees the whole sequence",
              "it drops from 8 blocks to (2·8+1)/4 = 4.25 blocks' worth: every rank does the same",
              "it doubles, because each rank now holds two chunks",
              "it halves on every rank, the total work halves too"], 1,
             ["Each rank sees every K/V block, but the causal mask makes most of rank 0's blocks empty with "
              "contiguous chunks: the work is not the same.",
              "Right: contiguous rank r computes r + 1 blocks (rank 7: 8); zigzag gives every rank 2N + 1 = 17 "
              "quarter-blocks, i.e. 4.25 blocks. The ring's step time follows the busiest rank.",
              "Two half-length chunks hold the same tokens as one chunk.",
              "The total work is the same (the causal triangle); zigzag only shares it out evenly."],
             transfer=True),
    Question("A MoE layer routes top-2 of 8 experts with capacity factor 1.0 and a badly balanced router. You "
             "raise the capacity factor to 2.0. Which is true?",
             ["fewer tokens are dropped, and each expert's buffer (and its compute and all-to-all padding) doubles",
              "nothing changes: capacity only matters at inference",
              "more tokens are dropped, because experts now wait longer",
              "the auxiliary load-balancing loss doubles"], 0,
             ["Right: C = ⌈cf·k·T/E⌉ doubles; we measured drops falling from ~10 % of assignments to 0. Fixed-size "
              "buffers (Switch, GShard) pay for that headroom in memory, FLOPs and bytes.",
              "Capacity is a training-time buffer size: tokens over it get no expert output.",
              "A larger buffer can only keep more assignments.",
              "The aux loss depends on the router's choices and probabilities, not on the capacity."]),
    Question(f"HSDP on {_NODES} nodes of {_G} H100 (8 rails; shard inside a node, replicate across) instead of FSDP "
             f"over all {_N} GPUs, parameters and gradients S bytes each. Per GPU and step, the bytes crossing the "
             "inter-node network…",
             ["are the same: both move every gradient once",
              f"shrink by about {_GAIN:.2f}×", f"shrink by about {_NODE_MISTAKE:.1f}×", "drop to zero"], 1,
             ["FSDP's all-gathers and reduce-scatter all cross nodes; HSDP keeps them on NVLink.",
              f"Right (lesson 02's rail model): HSDP all-reduces each GPU's 1/{_G} gradient shard across nodes, "
              f"2·({_NODES - 1}/{_NODES})·S/{_G}; FSDP runs 2 all-gathers and a reduce-scatter over {_N} ranks, "
              f"3·({_N - 1}/{_N})·S/{_G} (each node's share split over its {_G} rails): "
              f"{3 * (_N - 1) / _N:.3f}/{2 * (_NODES - 1) / _NODES:.3f} = {_GAIN:.2f}. The price is {_G}× more "
              "parameter memory per GPU than FSDP.",
              "That counts a whole node's bytes against one GPU's: NCCL's flat ring leaves a node once per ring, "
              f"and it runs one ring per NIC, each carrying 1/{_G} of S.",
              "The gradient shards still have to be averaged across replicas."],
             transfer=True),
    Question("The overlap arithmetic says FSDP over 64 H100s on 8-rail nodes hides behind compute above ~1,200 tokens "
             "per GPU (7B, bf16, 40 % MFU). You move to GPUs with twice the FLOP/s and the same network. The "
             "threshold…",
             ["halves", "stays the same", "doubles", "depends only on the model size"], 2,
             ["Faster compute finishes sooner, leaving less time to hide the same bytes.",
              "The bytes per layer are unchanged but the compute time per token halves.",
              "Right: tokens ≥ (N−1)/N·P·b·F/(B·FLOPs per token): F doubles, so does the threshold (and with one "
              "NIC per node, B is 8× smaller: ~7,500 tokens).",
              "P cancels: both the compute and the all-gather of a layer scale with its parameters."],
             transfer=True),
    Question("A model with 32 query heads and 4 K/V heads (grouped-query attention) trains at 256K tokens with "
             "context parallelism over 16 GPUs: two nodes of 8. Which layout does the ring / all-to-all rule choose?",
             ["Ulysses over all 16 ranks: it sends the fewest bytes",
              f"Ulysses over {_CP['ulysses']} ranks inside each node × a ring of {_CP['ring']} across (USP)",
              "Ulysses over the 8 GPUs of each node × a ring of 2 across the nodes",
              "the ring over all 16 ranks: Ulysses cannot run with grouped-query attention"], 1,
             ["Ulysses gives each rank whole K/V heads: 4 K/V heads spread over at most 4 ranks, and an all-to-all "
              "over 16 ranks would cross the inter-node network at every exchange.",
              f"Right: the Ulysses degree is the largest divisor of 16 that divides the 4 K/V heads and fits in a "
              f"node, {_CP['ulysses']}; the ring takes 16/{_CP['ulysses']} = {_CP['ring']}. Its 4 all-to-alls send "
              f"(u−1)/u · (T/16) · (2h + 2h_kv) ≈ {_U:,.0f} MiB per rank and layer (bf16) over NVLink; the ring's hops "
              "are the part that crosses nodes, each hidden behind a tile of attention.",
              "8 ranks would split 4 K/V heads into halves: a rank must hold whole heads.",
              "It can: the degree is bounded by the K/V heads (4 here), not forbidden; the ring alone would also "
              "work, but pays the ring's bytes where an all-to-all inside the node is cheaper."],
             transfer=True),
]
