"""A 3D-parallelism planner: model + cluster → feasible (dp, tp, pp), memory per GPU, communication.

    plans = plan_3d(RUNNING_EXAMPLE, SELENE, gpus=64, global_batch=512)     # feasible, best first
    megatron_rule(MEGATRON_1T, SELENE, gpus=3072, global_batch=3072)       # TP inside a node, PP to fit, DP rest

The rule of thumb is Narayanan et al. 2021 (Megatron-LM, §3, Takeaways #1–#2): tensor parallelism up
to the GPUs of one node (it needs NVLink: 4 all-reduces per layer per micro-batch), then pipeline
parallelism across nodes until the model fits (point-to-point, small), then data parallelism for
the rest. Memory: mixed-precision Adam, 16 bytes per parameter (Rajbhandari et al. 2020, ZeRO
§3.1), activations from Korthikanti et al. 2022 (§4). Estimates, not measurements: a plan "fits"
when it uses at most HEADROOM (80 %) of a GPU's memory, leaving room for buffers and fragmentation.
"""

from __future__ import annotations

import dataclasses

from m11_helpers.config import TransformerConfig, param_count
from m11_helpers.validate import one_of, positive_int

GB = 1e9
HEADROOM = 0.8  # plan to fill 80 % of a GPU's memory: the rest goes to buffers, workspace, fragmentation (an assumption)


@dataclasses.dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    memory_gb: float  # per GPU
    nvlink_gbps: float  # GB/s per GPU inside a node (one direction)
    ib_gbps: float  # GB/s per GPU between nodes (one direction)
    peak_tflops: float  # dense bf16 per GPU


# NVIDIA Selene / DGX A100 80 GB: NVLink 3 at 300 GB/s per direction per GPU; 8× HDR InfiniBand
# (200 Gb/s = 25 GB/s) per node, one per GPU; 312 TFLOP/s bf16 dense (A100 datasheet).
SELENE = Cluster("DGX A100 80GB (Selene)", 8, 80.0, 300.0, 25.0, 312.0)
# DGX H100: NVLink 4 at 450 GB/s per direction; 8× NDR 400 Gb/s = 50 GB/s per GPU; 989 TFLOP/s bf16.
DGX_H100 = Cluster("DGX H100 80GB", 8, 80.0, 450.0, 50.0, 989.0)


def _gpt(params_b: float, heads: int, hidden: int, layers: int) -> TransformerConfig:
    return TransformerConfig(name=f"GPT {params_b}B", vocab_size=51200, hidden=hidden, layers=layers, heads=heads,
                             ffn_hidden=4 * hidden, seq_len=2048)


# Narayanan et al. 2021, Table 1 (vocab 51,200, sequence 2048): (model, tp, pp, GPUs, global batch).
MEGATRON_TABLE1 = [
    (_gpt(1.7, 24, 2304, 24), 1, 1, 32, 512),
    (_gpt(3.6, 32, 3072, 30), 2, 1, 64, 512),
    (_gpt(7.5, 32, 4096, 36), 4, 1, 128, 512),
    (_gpt(18.4, 48, 6144, 40), 8, 1, 256, 1024),
    (_gpt(39.1, 64, 8192, 48), 8, 2, 512, 1536),
    (_gpt(76.1, 80, 10240, 60), 8, 4, 1024, 1792),
    (_gpt(145.6, 96, 12288, 80), 8, 8, 1536, 2304),
    (_gpt(310.1, 128, 16384, 96), 8, 16, 1920, 2160),
    (_gpt(529.6, 128, 20480, 105), 8, 35, 2520, 2520),
    (_gpt(1008.0, 160, 25600, 128), 8, 64, 3072, 3072),
]
MEGATRON_1T = MEGATRON_TABLE1[-1][0]


@dataclasses.dataclass(frozen=True)
class Plan3D:
    dp: int
    tp: int
    pp: int
    microbatches: int  # per pipeline per step
    memory_gb: dict  # per GPU: weights+grads+optimizer, activations, total
    comm_gb: dict  # per GPU per step: tp, pp, dp
    comm_s: dict  # the same over the links each one uses
    bubble: float  # (p−1)/(m+p−1)
    step_s: float  # estimated: compute / (1 − bubble) + exposed TP and PP communication
    fits: bool

    def __str__(self) -> str:
        return (f"dp={self.dp:<4} tp={self.tp:<2} pp={self.pp:<3} m={self.microbatches:<5} "
                f"mem {self.memory_gb['total']:6.1f} GB  bubble {self.bubble:5.1%}  step ≈ {self.step_s:6.2f} s")


def activation_bytes_per_layer(cfg: TransformerConfig, micro_batch: int, tp: int, recompute: str = "full") -> float:
    """s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes without recomputation; 2·s·b·h (the layer input) with full
    recomputation; s·b·h·(10 + 24/t) with selective (Korthikanti et al. 2022, §4.1 and §5, no sequence parallel)."""
    one_of("recompute", recompute, ("none", "selective", "full"))
    s, b, h, a = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads
    if recompute == "full":
        return 2 * s * b * h
    attention_scores = 0 if recompute == "selective" else 5 * a * s / (h * tp)
    return s * b * h * (10 + 24 / tp + attention_scores)


def memory_per_gpu(cfg: TransformerConfig, tp: int, pp: int, dp: int = 1, micro_batch: int = 1,
                   recompute: str = "full", zero1: bool = False) -> dict:
    """GB on the busiest GPU (the first stage): 16·N/(t·p) for states (+ its embedding slice), and
    L layers' activations (1F1B keeps p micro-batches of L/p layers in flight, Korthikanti §4.2.3)."""
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", micro_batch)):
        positive_int(name, v)
    n = param_count(cfg)
    embedding = cfg.vocab_size * cfg.hidden
    per_layer = (n - embedding) / cfg.layers
    first_stage = (per_layer * -(-cfg.layers // pp) + embedding) / tp  # parameters on stage 0's GPUs
    bytes_per_param = 4 + (12 / dp if zero1 else 12)  # bf16 weight + grad; fp32 master, m, v
    states = first_stage * bytes_per_param
    acts = cfg.layers * activation_bytes_per_layer(cfg, micro_batch, tp, recompute)
    if recompute == "full":  # one layer's activations exist again while it is recomputed
        acts += activation_bytes_per_layer(cfg, micro_batch, tp, "none")
    return {"states": states / GB, "activations": acts / GB, "total": (states + acts) / GB}


def comm_per_step(cfg: TransformerConfig, tp: int, pp: int, dp: int, micro_batch: int, microbatches: int) -> dict:
    """GB each GPU sends per step: TP 4 ring all-reduces of b·s·h·2 bytes per layer per micro-batch
    (Shoeybi et al. 2019, §3); PP b·s·h·2 bytes forward and back per micro-batch (Narayanan §3.2);
    DP one ring all-reduce of its 2-byte gradients (2(d−1)/d × payload)."""
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", micro_batch), ("microbatches", microbatches)):
        positive_int(name, v)
    act = micro_batch * cfg.seq_len * cfg.hidden * 2
    layers_here = cfg.layers / pp
    tp_bytes = 4 * layers_here * microbatches * act * 2 * (tp - 1) / tp
    pp_bytes = 2 * microbatches * act if pp > 1 else 0.0
    dp_bytes = 2 * (dp - 1) / dp * 2 * param_count(cfg) / (tp * pp)
    return {"tp": tp_bytes / GB, "pp": pp_bytes / GB, "dp": dp_bytes / GB}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def evaluate(cfg: TransformerConfig, cluster: Cluster, dp: int, tp: int, pp: int, global_batch: int,
             micro_batch: int = 1, recompute: str = "full", zero1: bool = False) -> Plan3D:
    """Memory, communication and an estimated step time for one (dp, tp, pp)."""
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("global_batch", global_batch), ("micro_batch", micro_batch)):
        positive_int(name, v)
    if global_batch % (dp * micro_batch):
        raise ValueError(f"global_batch ({global_batch}) must be divisible by dp·micro_batch ({dp * micro_batch})")
    m = global_batch // (dp * micro_batch)
    mem = memory_per_gpu(cfg, tp, pp, dp, micro_batch, recompute, zero1)
    comm = comm_per_step(cfg, tp, pp, dp, micro_batch, m)
    tp_link = cluster.nvlink_gbps if tp <= cluster.gpus_per_node else cluster.ib_gbps
    secs = {"tp": comm["tp"] / tp_link, "pp": comm["pp"] / cluster.ib_gbps, "dp": comm["dp"] / cluster.ib_gbps}
    # 6·N·tokens FLOPs (+2·N with full recomputation) at 50 % of peak (what Megatron-LM reached, Table 1).
    flops = (8 if recompute == "full" else 6) * param_count(cfg) * global_batch * cfg.seq_len
    compute = flops / (dp * tp * pp) / (0.5 * cluster.peak_tflops * 1e12)
    bubble = (pp - 1) / (m + pp - 1)
    step = compute / (1 - bubble) + secs["tp"] + secs["pp"]  # DP's all-reduce overlaps the backward
    return Plan3D(dp, tp, pp, m, mem, comm, secs, bubble, step, mem["total"] <= HEADROOM * cluster.memory_gb)


def plan_3d(cfg: TransformerConfig, cluster: Cluster, gpus: int, global_batch: int, micro_batch: int = 1,
            recompute: str = "full", zero1: bool = False) -> list[Plan3D]:
    """Every (dp, tp, pp) with dp·tp·pp = gpus that fits in memory, fastest estimate first.
    tp divides the heads, pp the layers, dp·micro_batch the global batch."""
    for name, v in (("gpus", gpus), ("global_batch", global_batch), ("micro_batch", micro_batch)):
        positive_int(name, v)
    plans = []
    for tp in _divisors(gpus):
        if cfg.heads % tp or cfg.ffn_hidden % tp:
            continue
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if cfg.layers % pp or global_batch % (dp * micro_batch):
                continue
            plan = evaluate(cfg, cluster, dp, tp, pp, global_batch, micro_batch, recompute, zero1)
            if plan.fits:
                plans.append(plan)
    return sorted(plans, key=lambda p: p.step_s)


def megatron_rule(cfg: TransformerConfig, cluster: Cluster, gpus: int, global_batch: int, micro_batch: int = 1,
                  recompute: str = "full") -> Plan3D | None:
    """Narayanan et al. 2021, Takeaways #1–#2: the smallest model-parallel size M = t·p that fits, with
    t = min(M, GPUs per node) (tensor parallel inside a node, pipeline across nodes); dp = gpus / M."""
    for name, v in (("gpus", gpus), ("global_batch", global_batch), ("micro_batch", micro_batch)):
        positive_int(name, v)
    for size in _divisors(gpus):
        tp = max(t for t in _divisors(min(size, cluster.gpus_per_node)) if size % t == 0 and cfg.heads % t == 0)
        pp, dp = size // tp, gpus // size
        if cfg.layers % pp or global_batch % (dp * micro_batch):
            continue
        plan = evaluate(cfg, cluster, dp, tp, pp, global_batch, micro_batch, recompute)
        if plan.fits:
            return plan
    return None
