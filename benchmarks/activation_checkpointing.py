"""Activation-memory levers side by side in one run: bytes kept, peak, FLOPs and step time (lesson 08).

    python benchmarks/activation_checkpointing.py [--layers 8] [--batch 8] [--hidden 64] [--seq 32] [--threads 1]

The course's hand-written policies (none, Korthikanti's selective = attention only, √L segments, every
block) against PyTorch's own APIs: selective activation checkpointing (`create_selective_checkpoint_contexts`)
keeping the Linear layers' matmul outputs, or every matmul, and `torch.autograd.graph.save_on_cpu`
offload (pin_memory=True, so it copies on a CPU as it would from a GPU), against the lesson's offload
hook that leaves the weights where they are. Memory is exact (`activation_costs`, `activation_offload`);
time is the median of a few forward + backward steps, as a ratio to "none" measured in the same run.
On a CPU with a tiny model, SAC's per-op Python dispatch dominates its time: on a GPU, with large
kernels, its overhead is the recomputed ops alone. Timings only: not run in CI.
"""

import argparse
import dataclasses

import torch

from m11_helpers.activation_checkpointing import gpt_forward
from m11_helpers.activation_costs import measure_policies, measure_step, step_seconds
from m11_helpers.activation_offload import offload_hooks, record_offload, save_on_cpu_hooks
from m11_helpers.config import TINY_GPT
from m11_helpers.data import tokens
from m11_helpers.display import show_table
from m11_helpers.live_memory import warm_up
from m11_helpers.models import tiny_gpt
from m11_helpers.selective_checkpointing import ALL_MATMULS, sac_context, save_ops_policy


def plans():
    def fwd(**kw):
        return lambda m, i, t: gpt_forward(m, i, t, **kw)

    return {"none": fwd(), "selective (attention only)": fwd(policy="attention"),
            "SAC: save Linear matmuls": fwd(policy="blocks", context_fn=sac_context()),
            "SAC: save all matmuls": fwd(policy="blocks", context_fn=sac_context(save_ops_policy(ALL_MATMULS))),
            "√L segments": fwd(policy="sqrt"), "every block": fwd(policy="blocks")}


def offloaded(hooks):
    def forward(m, i, t):
        with torch.autograd.graph.saved_tensors_hooks(*hooks(m)):
            return m(i, t)
    return forward


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 8), ("batch", 8), ("hidden", 64), ("seq", 32), ("threads", 1), ("repeats", 5)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warm_up()
    cfg = dataclasses.replace(TINY_GPT, layers=a.layers, hidden=a.hidden, ffn_hidden=4 * a.hidden, seq_len=a.seq)
    model = tiny_gpt(0, cfg, attention="naive")
    idx, tgt = tokens(a.batch, seq_len=a.seq, vocab=cfg.vocab_size, seed=0).tensors  # (B, T)
    print(f"torch {torch.__version__}, {a.threads} thread(s); tiny GPT {a.layers} blocks, h={a.hidden}, "
          f"s={a.seq}, b={a.batch}, textbook attention; times are medians of {a.repeats} steps")
    rows = measure_policies(model, idx, tgt, plans(), repeats=a.repeats, flops=True)
    for name, hooks in (("save_on_cpu (pin_memory)", lambda m: save_on_cpu_hooks()), ("offload, weights stay", offload_hooks)):
        with record_offload(*hooks(model), model) as log:
            row = measure_step(model, lambda m, i, t: m(i, t), idx, tgt, host=log.host_bytes)
        seconds = step_seconds(model, offloaded(hooks), idx, tgt, repeats=a.repeats)
        # on a CPU, unpack hands back the host copy itself: the device peak of an offload is a GPU measurement
        rows.append({"policy": name, **row, "peak": None, "flops": rows[0]["flops"], "seconds": seconds,
                     "copied": log.copied_bytes})
    base = rows[0]
    show_table([(r["policy"], r["retained"] / 2**20, "n/a" if r["peak"] is None else r["peak"] / 2**20,
                 r.get("copied", 0) / 2**20,
                 r["flops"] / base["flops"], r["seconds"] * 1e3, r["seconds"] / base["seconds"]) for r in rows],
               ["policy", "kept on device MiB", "peak MiB", "to host MiB", "FLOPs × none", "step ms", "time × none"],
               floatfmt=".2f")


if __name__ == "__main__":
    main()
