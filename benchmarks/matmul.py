"""Matmul throughput by dtype and size, measured side by side in one run, printed as ratios.

    python benchmarks/matmul.py                 # CPU (and the GPU too, when there is one)
    python benchmarks/matmul.py --sizes 256 1024 2048 --repeats 5 --threads 1 2

Backs lesson 01's claims: on a CPU, bf16 is fast only where there is bf16 matrix hardware (AMX,
AVX512-BF16): the "generic" column disables PyTorch's oneDNN path, which is what a CPU without that
hardware runs. On a GPU: plain fp32 vs TF32 vs bf16 tensor cores. Also: copy bandwidth (bytes read +
written per second, the course's convention: `hardware.copy_bandwidth`), and why one
thread per process (a second OpenMP thread on a busy machine can be slower than one).
Median of `--repeats` runs each (m11_helpers.timing); run on a quiet machine for stable figures. Not part of CI.
"""

from __future__ import annotations

import argparse

import torch

from m11_helpers.hardware import bf16_hardware, copy_bandwidth, measure_matmul


def cpu_table(sizes: list[int], threads: list[int], repeats: int) -> None:
    print(f"CPU · bf16 matrix hardware: {bf16_hardware()}")
    print(f"{'threads':>7} {'n':>6} {'fp32 GF/s':>10} {'bf16 GF/s':>10} {'bf16 generic':>13} "
          f"{'bf16/fp32':>10} {'fp32/generic':>13}")
    for t in threads:
        torch.set_num_threads(t)
        for n in sizes:
            fp32 = measure_matmul(n, "fp32", repeats=repeats)
            bf16 = measure_matmul(n, "bf16", repeats=repeats)
            torch.backends.mkldnn.enabled = False  # the generic kernel: no oneDNN, no AMX
            try:
                generic = measure_matmul(n, "bf16", repeats=max(1, repeats // 2)) if n <= 1024 else float("nan")
            finally:
                torch.backends.mkldnn.enabled = True
            print(f"{t:>7} {n:>6} {fp32 / 1e9:>10.1f} {bf16 / 1e9:>10.1f} {generic / 1e9:>13.2f} "
                  f"{bf16 / fp32:>9.2f}× {fp32 / generic:>12.0f}×")
        bw = copy_bandwidth(256 * 2**20, repeats=repeats)  # bytes read + written per second
        print(f"{t:>7} copy bandwidth (256 MiB, read + write): {bw / 1e9:.1f} GB/s")


def gpu_table(sizes: list[int], repeats: int) -> None:
    print(f"GPU · {torch.cuda.get_device_name()}")
    print(f"{'n':>6} {'fp32 TF/s':>10} {'tf32 TF/s':>10} {'bf16 TF/s':>10} {'bf16/fp32':>10} {'bf16/tf32':>10}")
    for n in sizes:
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = measure_matmul(n, "fp32", "cuda", repeats)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = measure_matmul(n, "fp32", "cuda", repeats)
        torch.backends.cuda.matmul.allow_tf32 = False
        bf16 = measure_matmul(n, "bf16", "cuda", repeats)
        print(f"{n:>6} {fp32 / 1e12:>10.1f} {tf32 / 1e12:>10.1f} {bf16 / 1e12:>10.1f} "
              f"{bf16 / fp32:>9.1f}× {bf16 / tf32:>9.1f}×")
    print(f"HBM copy bandwidth (1 GiB, read + write): {copy_bandwidth(2**30, 'cuda', repeats) / 1e12:.2f} TB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--gpu-sizes", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, torch.get_num_threads()])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cpu_table(args.sizes, sorted(set(args.threads)), args.repeats)
    if torch.cuda.is_available():
        gpu_table(args.gpu_sizes, args.repeats)


if __name__ == "__main__":
    main()
