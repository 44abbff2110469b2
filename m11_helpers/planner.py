"""A 3D-parallelism planner: model + cluster → feasible (dp, tp, pp), memory per GPU, communication (lesson 04).

    plans = plan_3d(RUNNING_EXAMPLE, SELENE, gpus=64, global_batch=512)     # feasible, best first
    megatron_rule(MEGATRON_1T, SELENE, gpus=3072, global_batch=3072)       # TP inside a node, PP to fit, DP rest
    traffic(MEGATRON_1T, SELENE, dp=6, tp=8, pp=64, global_batch=3072)     # what each kind of parallelism sends

The rule of thumb is Narayanan et al. 2021 (Megatron-LM, §3, Takeaways #1–#2): tensor parallelism up
to the GPUs of one node (it needs NVLink: 4 all-reduces per layer per micro-batch), then pipeline
parallelism across nodes until the model fits (point-to-point, small), then data parallelism for
the rest. Memory comes from the course's one owner of each figure: model states from
`m11_helpers.model_states` (default layout "megatron": 18 B/param, Megatron Core's table), activations from
`m11_helpers.activations` (Korthikanti et al. 2022, §4, generalised). Estimates, not measurements: a
plan "fits" when it uses at most HEADROOM (80 %) of a GPU's memory, leaving room for buffers and
fragmentation. Links: lesson 02's rail model (`comm_model.Fabric`, one ring per NIC), through `placement_link`.
"""

from __future__ import annotations

import dataclasses
import math

from m11_helpers.activations import activation_bytes
from m11_helpers.comm_model import Fabric, group_link, ring_bytes_sent
from m11_helpers.config import TransformerConfig, layer_params, param_count
from m11_helpers.hardware_specs import LINKS, Link, chip
from m11_helpers.model_states import LAYOUTS, gradient_bytes, model_state_bytes
from m11_helpers.pipeline_comm import p2p_bytes
from m11_helpers.validate import one_of, positive_int

GB = 1e9
HEADROOM = 0.8  # plan to fill 80 % of a GPU's memory: the rest goes to buffers, workspace, fragmentation (an assumption)
# Megatron-LM's bf16 layout (model_states "megatron": bf16 weights, fp32 main grads, fp32 master + Adam, 18 B/param,
# Megatron Core's distributed-optimizer table); pass layout="deepspeed" for the ZeRO paper's 16 B.
LAYOUT = "megatron"


@dataclasses.dataclass(frozen=True)
class Cluster:
    name: str
    memory_gb: float  # per GPU, 1e9 bytes
    fabric: Fabric  # GPUs per node, NVLink, NICs per node: lesson 02's rail model (comm_model)
    peak_tflops: float  # dense bf16 per GPU

    @property
    def gpus_per_node(self) -> int:
        return self.fabric.gpus

    @property
    def nvlink_gbps(self) -> float:
        """GB/s per GPU inside a node, one direction."""
        return self.fabric.intra.gbs_per_direction

    @property
    def ib_gbps(self) -> float:
        """GB/s of the network one GPU gets when every GPU of its node sends across nodes (comm_model.rail_link)."""
        return self.fabric.rail_link().gbs_per_direction


_A100 = chip("A100 SXM 80GB")
HDR_200G = Link("InfiniBand HDR (1 port)", 25, "NVIDIA ConnectX-6 / Quantum HDR: 200 Gb/s per port = 25 GB/s per "
                "direction; NVIDIA DGX A100 User Guide: 8 single-port HDR adapters for the compute fabric")
# NVIDIA Selene / DGX A100 80GB: 8 A100 on NVLink 3 (300 GB/s per direction per GPU), one HDR NIC per GPU.
DGX_A100 = Fabric("DGX A100, one 200 Gb/s HDR NIC per GPU (8 rails)", 8, LINKS["NVLink 3 (A100)"], HDR_200G, 8,
                  "NVIDIA DGX A100 User Guide (8 × ConnectX-6 HDR); NVIDIA DGX SuperPOD reference architecture "
                  "(Selene): rail-optimised compute fabric")
# An "80 GB" A100 carries 80 GiB of HBM2e, 85.9 GB (HBM capacities are binary: the datasheet's "GB" is GiB,
# hardware_specs.Chip.memory_bytes); 312 TFLOP/s bf16 dense.
SELENE = Cluster("DGX A100 80GB (Selene)", _A100.memory_gb, DGX_A100, _A100.peak_tflops["bf16"])
# A 72-GPU scale-up domain: GB200 NVL72 joins 72 Blackwell GPUs on NVLink 5 at 1.8 TB/s per GPU (NVIDIA's
# GB200 NVL72 figures as reproduced by aiwiki.ai and datacrunch.io, read 2026-12). Per-GPU memory and peak are
# the HGX B200 row's (GB200's own per-GPU HBM differs by source: not used); one 400 Gb/s NIC per GPU is an
# assumption (as HGX H100), not a sourced figure.
_B200 = chip("B200 (HGX)")
NVL72_RACK = Fabric("GB200 NVL72: 72 GPUs on one NVLink 5 domain, one 400 Gb/s NIC per GPU (assumed)", 72,
                    LINKS["NVLink 5 (B200)"], LINKS["InfiniBand NDR (1 port)"], 72,
                    "NVIDIA GB200 NVL72 (72 GPUs, 1.8 TB/s NVLink per GPU), as reproduced by aiwiki.ai, read 2026-12")
NVL72 = Cluster("GB200 NVL72 racks (B200-class GPUs)", _B200.memory_gb, NVL72_RACK, _B200.peak_tflops["bf16"])


def placement_link(fabric: Fabric, size: int, stride: int = 1, p2p: bool = False) -> Link:
    """The link one GPU of a group of `size` ranks, `stride` apart (ranks numbered node by node), communicates over.

    Inside one node: NVLink. Across nodes, a ring (all-reduce, all-gather, reduce-scatter) with k = g/stride of its
    GPUs on each node runs one ring per rail: `comm_model.group_link(fabric, k)` = min(NVLink, k·rails·B_nic/g).
    A point-to-point message (p2p=True: pipeline stages, a ring attention's hop) leaves through its own GPU's
    share of the NICs, `group_link(fabric, 1)`. Every GPU of the node is assumed to communicate at once."""
    positive_int("size", size)
    positive_int("stride", stride)
    if size * stride <= fabric.gpus:
        return fabric.intra
    return group_link(fabric, 1 if p2p else max(1, min(size, fabric.gpus // stride)))


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


def first_stage_params(cfg: TransformerConfig, pp: int) -> int:
    """Parameters on pipeline stage 0: ⌈L/p⌉ layers and the input embeddings (all of them when p = 1)."""
    if positive_int("pp", pp) == 1:
        return param_count(cfg)
    embedding = cfg.vocab_size * cfg.hidden + (cfg.seq_len * cfg.hidden if cfg.learned_positions else 0)
    return -(-cfg.layers // pp) * layer_params(cfg) + embedding


def first_stage_activation_bytes(cfg: TransformerConfig, tp: int, pp: int, micro_batch: int = 1,
                                 recompute: str = "full", flash: bool = False) -> int:
    """Activations on stage 0 under 1F1B: p micro-batches of L/p layers in flight = L layers' worth (Korthikanti
    et al. 2022, §4.2.3), + each micro-batch's embedding terms, + one layer rebuilt in backward when recomputing.
    With p = 1 the whole model: activations.activation_bytes' total + transient."""
    a = activation_bytes(cfg, micro_batch, recompute=recompute, tp=tp, flash=flash)
    if positive_int("pp", pp) == 1:
        return a["total"] + a["transient"]
    embedding = a["outside_breakdown"]["token ids"] + a["outside_breakdown"]["embedding dropout"]
    return cfg.layers * a["per_layer"] + pp * embedding + a["transient"]


def memory_per_gpu(cfg: TransformerConfig, tp: int, pp: int, dp: int = 1, micro_batch: int = 1,
                   recompute: str = "full", zero1: bool = False, layout: str = LAYOUT, flash: bool = False) -> dict:
    """GB on the busiest GPU (the first stage): model states of its parameters ÷ t (model_states; ZeRO-1 shards
    master + Adam over dp, ZeRO §5.1) and its activations (`first_stage_activation_bytes`)."""
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", micro_batch)):
        positive_int(name, v)
    one_of("layout", layout, LAYOUTS)
    params = -(-first_stage_params(cfg, pp) // tp)  # Megatron shards the vocabulary embedding over t too
    states = model_state_bytes(params, layout, world_size=dp, zero_stage=1 if zero1 else 0)["total"]
    acts = first_stage_activation_bytes(cfg, tp, pp, micro_batch, recompute, flash)
    return {"states": states / GB, "activations": acts / GB, "total": (states + acts) / GB}


def comm_per_step(cfg: TransformerConfig, tp: int, pp: int, dp: int, micro_batch: int, microbatches: int,
                  layout: str = LAYOUT) -> dict:
    """GB each GPU sends per step: TP 4 ring all-reduces of b·s·h·2 bytes per layer per micro-batch
    (Shoeybi et al. 2019, §3), 2(t−1)/t of each (`comm_model.ring_bytes_sent`); PP one b·s·h·2-byte message
    forward and one back per micro-batch (`pipeline_comm.p2p_bytes`, Narayanan et al. 2021, §3.2); DP one ring
    all-reduce of its gradients (`model_states.gradient_bytes`)."""
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", micro_batch), ("microbatches", microbatches)):
        positive_int(name, v)
    act = p2p_bytes(micro_batch, cfg.seq_len, cfg.hidden)
    layers_here = cfg.layers / pp
    tp_bytes = 4 * layers_here * microbatches * ring_bytes_sent(act, tp)
    pp_bytes = 2 * microbatches * act if pp > 1 else 0.0
    dp_bytes = ring_bytes_sent(gradient_bytes(math.ceil(param_count(cfg) / (tp * pp)), layout), dp)
    return {"tp": tp_bytes / GB, "pp": pp_bytes / GB, "dp": dp_bytes / GB}


def traffic(cfg: TransformerConfig, cluster: Cluster, dp: int, tp: int, pp: int, global_batch: int,
            micro_batch: int = 1) -> list[dict]:
    """Per kind of parallelism: GB each GPU sends per step, how many operations, and seconds at three rates: all on
    NVLink, all through the GPU's own NIC (`ib_s`: every ring hop crosses the network, one rank per node), and
    where Megatron's rank order puts it (`placed_s`, `placement_link`): why Megatron-LM puts TP inside a node
    and PP across nodes (Narayanan et al. 2021, §3)."""
    m = global_batch // (positive_int("dp", dp) * positive_int("micro_batch", micro_batch))
    comm = comm_per_step(cfg, tp, pp, dp, micro_batch, m)
    ops = {"tp": 4 * cfg.layers // pp * m if tp > 1 else 0, "pp": 2 * m if pp > 1 else 0, "dp": 1 if dp > 1 else 0}
    placed = {"tp": placement_link(cluster.fabric, tp), "pp": placement_link(cluster.fabric, pp, tp, p2p=True),
              "dp": placement_link(cluster.fabric, dp, tp * pp)}  # Megatron's rank order, as in evaluate
    what = {"tp": "all-reduce of activations, 4 per layer per micro-batch",
            "pp": "activations to the next stage, gradients back, per micro-batch",
            "dp": "all-reduce of the gradients, once per step"}
    return [{"kind": k.upper(), "degree": {"tp": tp, "pp": pp, "dp": dp}[k], "sends": what[k], "GB": comm[k],
             "operations": ops[k], "nvlink_s": comm[k] / cluster.nvlink_gbps, "ib_s": comm[k] / cluster.ib_gbps,
             "placed_s": comm[k] * GB / placed[k].bandwidth}
            for k in ("tp", "pp", "dp")]


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
    # Megatron's rank order: TP ranks adjacent, then PP (stride t), then DP (stride t·p)
    links = {"tp": placement_link(cluster.fabric, tp), "pp": placement_link(cluster.fabric, pp, tp, p2p=True),
             "dp": placement_link(cluster.fabric, dp, tp * pp)}
    secs = {k: comm[k] * GB / links[k].bandwidth for k in ("tp", "pp", "dp")}
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
                  recompute: str = "full", zero1: bool = False) -> Plan3D | None:
    """Narayanan et al. 2021, Takeaways #1–#2: the smallest model-parallel size M = t·p that fits, with
    t = min(M, GPUs per node) (tensor parallel inside a node, pipeline across nodes); dp = gpus / M.
    zero1: the optimizer states sharded over dp (ZeRO §5.1), so a larger dp also frees memory."""
    for name, v in (("gpus", gpus), ("global_batch", global_batch), ("micro_batch", micro_batch)):
        positive_int(name, v)
    for size in _divisors(gpus):
        tp = max(t for t in _divisors(min(size, cluster.gpus_per_node))
                 if size % t == 0 and cfg.heads % t == 0 and cfg.ffn_hidden % t == 0)
        pp, dp = size // tp, gpus // size
        if cfg.layers % pp or global_batch % (dp * micro_batch):
            continue
        plan = evaluate(cfg, cluster, dp, tp, pp, global_batch, micro_batch, recompute, zero1)
        if plan.fits:
            return plan
    return None
