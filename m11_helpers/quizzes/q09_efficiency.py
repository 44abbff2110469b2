"""Lesson 09 quiz: shown by `quiz("09_efficiency")`. Its figures come from the lesson's helpers, so they match the lesson."""

from m11_helpers.attention import (
    A100_SRAM_BYTES,
    attention_matrix_bytes,
    flash_hbm_elements,
    qkvo_bytes,
    standard_hbm_elements,
)
from m11_helpers.config import RUNNING_EXAMPLE
from m11_helpers.quiz import Question

_H, _S = RUNNING_EXAMPLE.heads, RUNNING_EXAMPLE.seq_len
_D = RUNNING_EXAMPLE.hidden // _H
_GIB = 2**30
_MAT = {s: attention_matrix_bytes(1, _H, s, 2) / _GIB for s in (_S, 2 * _S)}  # one layer's s² matrix, bf16
_KEEP = {s: qkvo_bytes(1, _H, s, _D, 2) / _GIB for s in (_S, 2 * _S)}  # Q, K, V, O
_M = A100_SRAM_BYTES // 2  # A100: 192 KiB of SRAM per SM, in 16-bit elements (Dao et al. 2022, §2.1)
_RATIO = {d: standard_hbm_elements(65536, d) / flash_hbm_elements(65536, d, _M) for d in (128, 256)}  # lesson: 64, 128
_LONG = 8 * _S  # a long-context run the lesson did not compute
_ROWS_MIB = 2 * _H * _LONG * 4 / 2**20  # L and D: one fp32 number per query row each, every head
_P_GIB = attention_matrix_bytes(1, _H, _LONG, 2) / _GIB  # the whole layer's P, bf16

QUESTIONS = [
    Question("FlashAttention computes…",
             ["an approximation of attention that is close enough", "exactly the same attention, one tile at a time",
              "attention with fewer FLOPs", "attention only for short sequences"], 1,
             ["No: the online softmax is exact (the lesson checks it against the textbook version to 1e-12).",
              "Right: the same result, with far fewer bytes moved and O(s) memory.",
              "It does *more* FLOPs (its backward recomputes the scores: 75.2 vs 66.6 GFLOPs in the paper's "
              "GPT-2 medium run) and is still 5.7× faster.",
              "It helps most at long sequences, where the s² matrix dominates."]),
    Question(f"The 7B shape (32 heads, d = {_D}, bf16, one sequence) goes from s = {_S} to {2 * _S}. What happens to "
             "the bytes one attention layer keeps for backward?",
             [f"Both double: naive {_MAT[_S]:.0f} → {2 * _MAT[_S]:.0f} GiB, FlashAttention likewise",
              f"Naive grows 4× ({_MAT[_S]:.0f} → {_MAT[2 * _S]:.0f} GiB of s² matrix), FlashAttention 2× "
              f"(Q, K, V, O: {_KEEP[_S]:.3g} → {_KEEP[2 * _S]:.3g} GiB)",
              "Both grow 4×: attention is quadratic either way",
              "Naive grows 4×, FlashAttention stays the same"], 1,
             ["Only the O(s) part doubles; the s × s matrix per head quadruples.",
              "Right: the matrix is b·h·s² bytes, what FlashAttention keeps is 4·b·h·s·d plus one log-sum-exp per "
              "row. Its *compute* is still quadratic; its memory is not.",
              "The FLOPs are quadratic in both; the memory is not (measured in the lesson: s² against s).",
              "Q, K, V and O have s rows: they grow with s."],
             transfer=True),
    Question("You switch from head dimension 128 to 256 (same GPU: M = 192 KiB of SRAM). At long sequences, the HBM "
             "traffic of standard attention divided by FlashAttention's (Algorithm 1)…",
             [f"falls about 4×, from {_RATIO[128]:.2f}× to {_RATIO[256]:.2f}×",
              "doubles: a larger d means more reuse per tile", "stays the same: the ratio only depends on N",
              "grows like N: FlashAttention saves O(N)"], 0,
             ["Right: the ratio tends to M/(3d²), so doubling d divides it by 4: "
              f"{_RATIO[128]:.2f}/4 ≈ {_RATIO[256]:.2f}. Larger heads leave fewer keys per SRAM tile (B_c = ⌈M/4d⌉), "
              "so K and V are re-streamed more often for each query; below 1× FlashAttention moves MORE bytes.",
              "The tile holds fewer rows when each row is longer: less reuse, not more.",
              "N cancels out at long sequences; M and d do not.",
              "That is the memory saving (s² → s), not the traffic one: the traffic ratio is a constant."],
             transfer=True),
    Question("In the online softmax, why multiply the running sum and the running output by e^(m − m')?",
             ["To normalise the output", "Their terms were exponentiated under the old, smaller max m",
              "To avoid storing V", "It is a dropout mask"], 1,
             ["Normalisation is the final division by ℓ.",
              "Right: e^(s − m) = e^(s − m')·e^(m' − m); rescaling puts every earlier term under the new max.",
              "V is read block by block either way.", "No randomness here."]),
    Question("Bias-add and GELU run as two library kernels on a bf16 activation of N bytes. You fuse them into one "
             "kernel. The bytes those two ops move…",
             ["stay the same: the same arithmetic on the same data", "roughly halve: 4N → 2N",
              "fall 10×: fused kernels run from SRAM", "double: the fused kernel must keep both results"], 1,
             ["The arithmetic is the same; the memory traffic is not, and it is what the time of an element-wise "
              "op is made of.",
              "Right: apart, add reads x and writes y, GELU reads y and writes z (4N); fused, y stays in registers "
              "(2N). Exercise 9.3 generalises this to any fusion plan.",
              "The saving is the intermediates that never leave the chip: here one read and one write of N.",
              "The intermediate stays in registers; nothing extra is written."],
             transfer=True),
    Question("You add up the durations of every aten:: event the profiler recorded in a 120 ms DDP step and get "
             "180 ms of compute. Why?",
             ["The profiler's own overhead", "Events nest (aten::linear contains aten::addmm): their durations overlap",
              "Two ranks were profiled", "The all-reduce is counted as compute"], 1,
             ["Profiling overhead stretches the step itself, not the sum of its parts.",
              "Right: take the union of the intervals, not the sum of durations (exercise 9.4); and compute that "
              "overlaps a collective on gloo's thread is counted once.",
              "Each rank's events are its own; the lesson splits them rank by rank.",
              "Collectives are named gloo:/c10d:: events, not aten:: ones."]),
    Question(f"You train the 7B shape ({_H} heads, d = {_D}, bf16, batch 1) at s = {_LONG:,} with FlashAttention. "
             "Besides Q, K, V, O, dO and the three gradients (each s × d per head), what does one attention layer's "
             "backward hold in HBM to rebuild P?",
             ["Nothing more: P is recomputed from Q and K alone",
              f"One number per query row from the forward (L = m + log ℓ) and one it computes (D = rowsum(dO ∘ O)): "
              f"{_ROWS_MIB:.0f} MiB in fp32 for all heads",
              f"P of one head at a time: {_P_GIB / _H:.0f} GiB", f"All of P, as autograd would: {_P_GIB:.0f} GiB"], 1,
             ["Q and K give the scores S, not the softmax: without the row's normaliser each tile of P would need "
              "the whole row first (a second pass over every key tile).",
              f"Right: 2 numbers × {_H} heads × {_LONG:,} rows × 4 bytes = {_ROWS_MIB:.0f} MiB, linear in s; P then "
              "comes back exactly, one tile at a time in SRAM, as exp(S − L), and dS = P ∘ (dP − D) (exercise 9.5).",
              f"A head's P is s² × 2 bytes = {_P_GIB / _H:.0f} GiB: no HBM holds that per layer; FlashAttention never "
              "builds a row of it, let alone a head.",
              f"{_H} × s² × 2 bytes = {_P_GIB:.0f} GiB per layer: that is what recomputation removes."],
             transfer=True),
]
