"""Lesson 01 quiz: shown by `quiz("01_hardware")`."""

from m11_helpers.hardware_specs import chip
from m11_helpers.model_states import bytes_per_param
from m11_helpers.quiz import Question

_BPP = bytes_per_param("autocast")["total"]  # 16 B/param: the lesson's 84 × 10⁹-byte model, here another chip
_H200 = chip("H200 SXM")

QUESTIONS = [
    Question("NVIDIA's H100 datasheet says 1,979 TFLOPS for BF16. What will a dense bf16 training matmul see at best?",
             ["1,979 TFLOP/s", "about 989 TFLOP/s", "67 TFLOP/s", "3,958 TFLOP/s"], 1,
             ["That figure is with 2:4 structured sparsity, which dense training does not use.",
              "Right: the dense peak is half the sparse figure.",
              "That is plain FP32 on the CUDA cores.",
              "That is FP8 with sparsity — the 'nearly 4 petaFLOPS'."]),
    Question("A chip's HBM bandwidth doubles, its FLOP/s stay the same. What happens to one-token decoding "
             "((1×4096)·(4096×4096) in bf16) and to a 4096³ training matmul?",
             ["both get 2× faster", "decoding up to 2× faster; the big matmul unchanged (it sits on the flat roof)",
              "the big matmul 2× faster; decoding unchanged", "neither changes: FLOP/s did not change"], 1,
             ["Only kernels on the slanted roof are limited by bandwidth.",
              "Right: the ridge point halves; decoding (I ≈ 1 FLOP/B) is bandwidth-bound and speeds up, the 4096³ matmul "
              "(I ≈ 1365) was already compute-bound.",
              "The reverse: the big matmul is compute-bound.",
              "Decoding is memory-bound: its time is bytes / bandwidth."], transfer=True),
    Question("You switch an element-wise kernel (y = 2·x + y, memory-bound) from fp32 to bf16. Its time…",
             ["stays the same: same number of FLOPs", "about halves: half the bytes, and it is still memory-bound",
              "doubles: bf16 needs conversions", "drops 16×, like tensor-core matmuls"], 1,
             ["On the slanted roof, time = bytes / bandwidth; FLOPs do not set it.",
              "Right: the intensity doubles but stays far below the ridge, so time follows the bytes.",
              "On a GPU (or a CPU with bf16 units) the kernel reads bf16 directly; the bytes are what count.",
              "The 16× is compute (tensor cores vs CUDA cores); this kernel never reaches the compute roof."],
             transfer=True),
    Question("A ping-pong measures 60 µs one way for 8 bytes and 2.1 ms for 8 MiB. You double the message from 8 to "
             "16 bytes, then from 8 to 16 MiB. The times become about…",
             ["120 µs and 4.2 ms", "60 µs and 4.2 ms", "120 µs and 2.1 ms", "60 µs and 2.1 ms"], 1,
             ["At 8 bytes the time is almost all latency α: doubling a tiny message changes nothing.",
              "Right: t = α + S/B. Small messages pay α, large ones S/B — which is why libraries bucket gradients "
              "into large messages.",
              "The reverse: large messages scale with size, tiny ones do not.",
              "8 MiB is far beyond α·B: its time is the bytes over the bandwidth, and doubles."], transfer=True),
    Question(f"Mixed-precision Adam keeps {_BPP} bytes of training state per parameter. What is the largest model "
             f"whose states alone fit in one {_H200.name}, whose datasheet says {_H200.memory_gib:g} GB?",
             [f"{_H200.memory_bytes / _BPP / 1e9:.2f} B parameters", f"{_H200.memory_gib * 1e9 / _BPP / 1e9:.2f} B "
              "parameters", f"{_H200.memory_bytes / 2 / 1e9:.0f} B parameters",
              f"{_H200.memory_bytes / 4 / 1e9:.1f} B parameters"], 0,
             [f"Right: HBM is binary, {_H200.memory_gib:g} GiB = {_H200.memory_bytes / 1e9:.1f} × 10⁹ bytes; "
              f"÷ {_BPP} B/param = {_H200.memory_bytes / _BPP / 1e9:.2f} × 10⁹ parameters (activations and the CUDA "
              "context still need room beside them).",
              f"That reads the datasheet's GB as 10⁹ bytes: {_H200.memory_gib:g} × 10⁹ / {_BPP}. HBM capacities "
              "count 2³⁰-byte GiB.",
              "That counts only the bf16 weights (2 B/param); training also keeps gradients, an fp32 master and "
              "Adam's two moments.",
              "That counts only fp32 weights (4 B/param), as if the optimizer needed nothing."], transfer=True),
    Question("Megatron-LM's 1024 A100s at 140 TFLOP/s train GPT-3 (3.15e23 FLOPs by 6·N·D) in 34 days. Why not 25?",
             ["Their GPUs were slower", "They count 8·N·D: activation recomputation repeats the forward pass",
              "They used fp32", "The 300B tokens were seen twice"], 1,
             ["140 TFLOP/s is what they measured.",
              "Right: 8/6 × 25.4 ≈ 34 days; their 140 TFLOP/s includes the recomputed FLOPs.",
              "They trained in mixed precision.",
              "One epoch of 300B tokens."]),
]
