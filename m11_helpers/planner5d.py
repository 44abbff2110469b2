"""A 5D planner: lesson 04's 3D planner (DP × TP × PP) plus sequence, context and expert parallelism (lesson 12).

    evaluate_5d(LLAMA3_405B_128K, META_H100, tp=8, cp=16, pp=16, dp=8, global_batch=128)   # one layout
    plan_5d(MOE_7B, H100_CLUSTER, gpus=64, global_batch=64)                                # every layout that fits

A layout is (dp, tp, cp, pp, ep) with dp·tp·cp·pp = GPUs; sequence parallelism is on whenever tp > 1
(Korthikanti et al. 2022 §4.2.2: it costs no extra bytes); experts are split over ep ranks taken
from the dp·cp ranks (Megatron-Core's expert-data-parallel layout). Per GPU, for the busiest pipeline
stage: model states from `model_states` (ZeRO over dp·cp, expert states over dp·cp/ep), activations
from `activations.activation_bytes` (s/cp tokens, ÷t with SP, L layers' worth in flight under 1F1B,
Korthikanti §4.2.3), communication bytes from each mechanism's helper (TP/SP ring, CP ring, EP
all-to-all, PP point-to-point, DP gradient reduction) and the link it crosses (lesson 04's
`planner.placement_link` on lesson 02's rail model, `comm_model.Fabric`). Estimates, not
measurements: the model, its assumptions and where it differs from each paper are in the lesson.
"""

from __future__ import annotations

import dataclasses
import math

from m11_helpers.activations import activation_bytes
from m11_helpers.comm_model import HGX_H100, IB_400G, NVLINK_H100, Fabric, Link, ring_bytes_sent
from m11_helpers.config import TransformerConfig, param_count
from m11_helpers.context_parallel import ring_bytes_per_rank
from m11_helpers.expert_parallel import all_to_all_bytes
from m11_helpers.hardware_specs import chip
from m11_helpers.model_states import gradient_bytes, model_state_bytes
from m11_helpers.overlap import cp_overlap
from m11_helpers.pipeline_comm import p2p_bytes
from m11_helpers.planner import HEADROOM, layer_params, placement_link
from m11_helpers.sequence_parallel import ring_bytes
from m11_helpers.validate import one_of, positive_int

__all__ = ["MoE", "Model5D", "Cluster5D", "Plan5D", "params", "evaluate_5d", "plan_5d", "LLAMA3_405B_128K",
           "DEEPSEEK_V3", "MOE_7B", "META_H100", "H100_CLUSTER", "H800_CLUSTER"]


@dataclasses.dataclass(frozen=True)
class MoE:
    experts: int  # routed experts per MoE layer
    top_k: int  # routed experts per token
    expert_ffn: int  # inner width of one (SwiGLU) expert
    moe_layers: int  # how many of the layers are MoE (the first layers - moe_layers stay dense)
    shared_experts: int = 0  # experts every token goes through (DeepSeekMoE)


@dataclasses.dataclass(frozen=True)
class Model5D:
    cfg: TransformerConfig
    moe: MoE | None = None
    attention_params: int | None = None  # per layer, when attention is not q, k, v, o (DeepSeek's MLA)
    layout: str = "deepspeed"  # model_states layout: bf16 weights/grads + fp32 master + Adam
    zero_stage: int = 1


@dataclasses.dataclass(frozen=True)
class Cluster5D:
    name: str
    memory_bytes: float  # per GPU, bytes: hardware_specs.Chip.memory_bytes (an "80 GB" H100 holds 80 GiB)
    fabric: Fabric  # GPUs per node, NVLink, NICs per node: lesson 02's rail model (comm_model)
    peak_flops: float  # dense bf16
    mfu: float = 0.5  # the fraction of peak the compute itself reaches (an assumption, as in lesson 04)

    @property
    def gpus_per_node(self) -> int:
        return self.fabric.gpus

    @property
    def intra(self) -> Link:
        return self.fabric.intra


def _layer(cfg: TransformerConfig, ffn: int) -> int:
    """One layer's parameters at MLP width ffn (planner.layer_params)."""
    return layer_params(dataclasses.replace(cfg, ffn_hidden=ffn))


def params(m: Model5D) -> dict:
    """Parameter counts: total, active per token, and the parts (attention+norms per layer, one expert, ...)."""
    cfg = m.cfg
    per_ffn = _layer(cfg, 2) - _layer(cfg, 1)  # parameters per unit of MLP width (3h for SwiGLU without bias)
    attn = _layer(cfg, 1) - per_ffn  # attention + norms (+ the MLP's output bias) of one layer
    if m.attention_params is not None:  # MLA and friends: the given attention, plus the norms (and MLP bias)
        attn = m.attention_params + 2 * cfg.hidden * (2 if cfg.norm == "layernorm" else 1) + cfg.hidden * cfg.bias
    dense_mlp = per_ffn * cfg.ffn_hidden
    outside = param_count(cfg) - cfg.layers * _layer(cfg, cfg.ffn_hidden)  # embeddings, final norm, head
    if m.moe is None:
        total = outside + cfg.layers * (attn + dense_mlp)
        return {"total": total, "active": total, "attention": attn, "dense_mlp": dense_mlp, "expert": 0,
                "router": 0, "outside": outside, "experts_total": 0}
    e = m.moe
    expert, router = per_ffn * e.expert_ffn, e.experts * cfg.hidden
    dense_layers = cfg.layers - e.moe_layers
    base = outside + cfg.layers * attn + dense_layers * dense_mlp + e.moe_layers * router
    experts_total = e.moe_layers * (e.experts + e.shared_experts) * expert
    return {"total": base + experts_total, "active": base + e.moe_layers * (e.top_k + e.shared_experts) * expert,
            "attention": attn, "dense_mlp": dense_mlp, "expert": expert, "router": router, "outside": outside,
            "experts_total": experts_total}


@dataclasses.dataclass(frozen=True)
class Plan5D:
    dp: int
    tp: int
    cp: int
    pp: int
    ep: int
    micro_batch: int
    microbatches: int
    recompute: str
    memory: dict  # bytes per GPU: states, activations, total
    comm_bytes: dict  # bytes each GPU sends per step: tp, cp, ep, pp, dp
    comm_s: dict  # the same over the link each crosses
    compute_s: float
    bubble: float
    step_s: float
    mfu: float  # model FLOPs / (step · GPUs · peak)
    fits: bool

    def row(self) -> list:
        return [self.dp, self.tp, self.cp, self.pp, self.ep, self.recompute, self.memory["total"] / 2**30,
                self.step_s, self.mfu]


def _acts(m: Model5D, mb: int, s: int, tp: int, recompute: str, ffn: int) -> dict:
    cfg = dataclasses.replace(m.cfg, ffn_hidden=ffn)
    return activation_bytes(cfg, mb, seq_len=s, recompute=recompute, flash=True, dtype_bytes=2, tp=tp,
                            sequence_parallel=tp > 1)


def evaluate_5d(m: Model5D, cluster: Cluster5D, *, tp: int, cp: int, pp: int, dp: int, ep: int = 1,
                global_batch: int, micro_batch: int = 1, recompute: str = "none", virtual_stages: int = 1,
                ep_overlap: bool = False) -> Plan5D:
    """Memory, traffic and an estimated step time of one 5D layout; global_batch in sequences of cfg.seq_len.

    virtual_stages v: the interleaved 1F1B schedule, bubble (p−1)/(v·m) of the compute (Narayanan et al. 2021,
    §2.2.2). ep_overlap: the all-to-all runs behind computation (DeepSeek-V3's DualPipe, §3.2.1) and only
    what exceeds the compute is exposed; otherwise it is on the critical path."""
    for name, v in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp), ("ep", ep), ("global_batch", global_batch),
                    ("micro_batch", micro_batch), ("virtual_stages", virtual_stages)):
        positive_int(name, v)
    one_of("recompute", recompute, ("none", "selective", "full"))
    cfg, s, L, b = m.cfg, m.cfg.seq_len, m.cfg.layers, micro_batch
    if global_batch % (dp * b):
        raise ValueError(f"global_batch ({global_batch}) must be divisible by dp·micro_batch ({dp * b})")
    if (dp * cp) % ep or (m.moe is not None and m.moe.experts % ep) or (m.moe is None and ep > 1):
        raise ValueError(f"ep ({ep}) must divide the experts and dp·cp ({dp * cp}) (and be 1 without experts)")
    P, mcount = params(m), global_batch // (dp * b)
    per_stage = math.ceil(L / pp)
    frac_moe = 0 if m.moe is None else m.moe.moe_layers / L
    moe_here, dense_here = round(per_stage * frac_moe), per_stage - round(per_stage * frac_moe)
    local = (per_stage * P["attention"] + dense_here * P["dense_mlp"] + moe_here * P["router"] + P["outside"]) / tp
    states = model_state_bytes(max(1, int(local)), m.layout, dp * cp, m.zero_stage)["total"]
    if m.moe is not None:  # experts: split over ep (and tp), their states sharded over the expert-data-parallel ranks
        exp_local = moe_here * (m.moe.experts / ep + m.moe.shared_experts) * P["expert"] / tp
        states += model_state_bytes(max(1, int(exp_local)), m.layout, dp * cp // ep, m.zero_stage)["total"]
    sl = s // cp  # tokens of each sequence on this GPU
    dense_a = _acts(m, b, sl, tp, recompute, cfg.ffn_hidden)
    moe_ffn = cfg.ffn_hidden if m.moe is None else (m.moe.top_k + m.moe.shared_experts) * m.moe.expert_ffn
    moe_a = _acts(m, b, sl, tp, recompute, moe_ffn)
    # 1F1B: the first stage holds pp micro-batches of L/pp layers = L layers' worth (Korthikanti §4.2.3)
    in_flight = min(pp, mcount) * per_stage
    acts = in_flight * (frac_moe * moe_a["per_layer"] + (1 - frac_moe) * dense_a["per_layer"])
    acts += dense_a["outside"] + dense_a["transient"]
    tokens = b * sl  # per micro-batch on this GPU
    h_kv = (cfg.kv_heads or cfg.heads) * cfg.head_dim
    per_mb_layers = per_stage * mcount
    comm = {"tp": 4 * ring_bytes("all_reduce", tokens * cfg.hidden * 2, tp) * per_mb_layers,
            "cp": (sum(ring_bytes_per_rank(s, cp, max(1, h_kv // tp), 2, b)[k] for k in ("forward", "backward"))
                   * per_mb_layers if cp > 1 else 0.0),
            "ep": (all_to_all_bytes(tokens // (tp if tp > 1 else 1) or 1, cfg.hidden, m.moe.top_k, ep, 2)
                   * moe_here * mcount if m.moe is not None and ep > 1 else 0.0),
            "pp": 2 * p2p_bytes(b, sl, cfg.hidden) / tp * mcount if pp > 1 else 0.0,  # SP: each rank sends 1/t
            "dp": ring_bytes_sent(gradient_bytes(max(1, int(local)), m.layout), dp * cp)}
    # rank order tp, cp, pp, dp (EP inside dp·cp, stride tp); lesson 04's placement_link on lesson 02's rails:
    # rings across nodes ride k rails at once, point-to-point and all-to-all leave through the GPU's own NIC share
    f = cluster.fabric
    links = {"tp": placement_link(f, tp), "cp": placement_link(f, cp, tp, p2p=True),
             "ep": placement_link(f, ep, tp, p2p=True), "pp": placement_link(f, pp, tp * cp, p2p=True),
             "dp": placement_link(f, dp * cp, tp * pp)}  # the dp·cp group taken as ranks tp·pp apart
    comm_s = {k: v / links[k].bandwidth for k, v in comm.items()}
    flops_rate = cluster.peak_flops * cluster.mfu
    tokens_step = global_batch * s
    model_flops = 6 * P["active"] * tokens_step + 6 * s * cfg.hidden * L * tokens_step  # + causal attention (½)
    extra = {"none": 1.0, "selective": 1.0, "full": 4 / 3}[recompute]  # full: one more forward
    gpus = dp * tp * cp * pp
    compute = model_flops * extra / gpus / flops_rate
    bubble = (pp - 1) / (virtual_stages * mcount + pp - 1)  # share of the step the pipeline idles
    cp_hidden = cp == 1 or cp_overlap(cfg, sl, cp, links["cp"], flops_rate).hidden
    ep_exposed = max(0.0, comm_s["ep"] - compute) if ep_overlap else comm_s["ep"]
    exposed = comm_s["tp"] + ep_exposed + comm_s["pp"] + (0.0 if cp_hidden else comm_s["cp"])
    step = compute / (1 - bubble) + exposed  # DP's gradient reduction overlaps the backward
    mem = {"states": states, "activations": acts, "total": states + acts}
    return Plan5D(dp, tp, cp, pp, ep, b, mcount, recompute, mem, comm, comm_s, compute, bubble, step,
                  model_flops / (step * gpus * cluster.peak_flops), mem["total"] <= HEADROOM * cluster.memory_bytes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_5d(m: Model5D, cluster: Cluster5D, gpus: int, global_batch: int, micro_batch: int = 1,
            max_tp: int | None = None, recomputes=("none", "selective", "full"), **options) -> list[Plan5D]:
    """Every layout that fits, fastest first: tp ≤ a node (and divides the heads), cp divides s/2, ep the experts.

    For each layout only the cheapest recomputation in `recomputes` that fits is kept; `options`
    (virtual_stages, ep_overlap) go to evaluate_5d."""
    positive_int("gpus", gpus)
    positive_int("global_batch", global_batch)
    cfg = m.cfg
    max_tp = cluster.gpus_per_node if max_tp is None else positive_int("max_tp", max_tp)
    plans = []
    for tp in _divisors(gpus):
        if tp > max_tp or cfg.heads % tp or (cfg.kv_heads or cfg.heads) % tp or cfg.seq_len % tp:
            continue
        for cp in _divisors(gpus // tp):
            if cfg.seq_len % (2 * cp) or (cfg.seq_len // cp) % tp:
                continue
            for pp in _divisors(gpus // (tp * cp)):
                dp = gpus // (tp * cp * pp)
                if pp > cfg.layers or global_batch % (dp * micro_batch):
                    continue
                for ep in ([1] if m.moe is None else [e for e in _divisors(dp * cp) if m.moe.experts % e == 0]):
                    for rc in recomputes:
                        p = evaluate_5d(m, cluster, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, global_batch=global_batch,
                                        micro_batch=micro_batch, recompute=rc, **options)
                        if p.fits:
                            plans.append(p)
                            break  # the cheapest recomputation that fits
    return sorted(plans, key=lambda p: p.step_s)


# Meta's Llama 3 405B (Dubey et al. 2024, Table 3): 126 layers, h 16384, FFN 53248, 128 heads, 8 KV heads,
# vocabulary 128,256; long-context stage at 131,072 tokens (§3.4.2).
LLAMA3_405B_128K = Model5D(TransformerConfig(
    name="Llama 3 405B @ 128K", vocab_size=128256, hidden=16384, layers=126, heads=128, kv_heads=8,
    ffn_hidden=53248, seq_len=131072, gated_mlp=True, norm="rmsnorm", bias=False, tied_embeddings=False,
    learned_positions=False), layout="deepspeed", zero_stage=2)
# DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, §2 and §4.2): 61 layers (first 3 dense, FFN 18432), h 7168,
# 128 heads with MLA (187,107,328 attention parameters per layer from the released config), 1 shared +
# 256 routed experts of width 2048, 8 routed per token, vocabulary 129,280, 4K pre-training context.
DEEPSEEK_V3 = Model5D(TransformerConfig(
    name="DeepSeek-V3", vocab_size=129280, hidden=7168, layers=61, heads=128, ffn_hidden=18432, seq_len=4096,
    gated_mlp=True, norm="rmsnorm", bias=False, tied_embeddings=False, learned_positions=False),
    moe=MoE(experts=256, top_k=8, expert_ffn=2048, moe_layers=58, shared_experts=1),
    attention_params=187_107_328, layout="deepspeed", zero_stage=1)
# The course's 7B as an 8-expert MoE of the same active size: top-2 of 8 SwiGLU experts of half width.
MOE_7B = Model5D(TransformerConfig(
    name="M11-7B-MoE (8 × half-width experts, top-2)", vocab_size=32000, hidden=4096, layers=32, heads=32,
    ffn_hidden=11008, seq_len=4096, gated_mlp=True, norm="rmsnorm", bias=False, tied_embeddings=False,
    learned_positions=False), moe=MoE(experts=8, top_k=2, expert_ffn=5504, moe_layers=32))

_H100 = chip("H100 SXM")  # dense bf16 peak and HBM (hardware_specs); the H800 has the same compute and memory
_H100_MEM, _H100_PEAK = _H100.memory_bytes, _H100.peak_flops("bf16")
H100_CLUSTER = Cluster5D("HGX H100 80GB, NVLink 4 + 8 × 400G NICs", _H100_MEM, HGX_H100, _H100_PEAK)
META_H100 = Cluster5D("Meta Grand Teton H100 80GB, RoCE 400G per GPU (Dubey et al. §3.3.1)", _H100_MEM, Fabric(
    "Grand Teton: 8 × H100, one 400 Gb/s RoCE NIC per GPU", 8, NVLINK_H100,
    Link("RoCE 400 Gb/s (1 port)", 50, "Dubey et al. 2024, §3.3.1"), 8, "Dubey et al. 2024, §3.3.1"), _H100_PEAK)
H800_CLUSTER = Cluster5D("H800 80GB, NVLink 160 GB/s + IB 50 GB/s per GPU (DeepSeek-V3 §3.1)", _H100_MEM, Fabric(
    "H800 nodes: NVLink 160 GB/s, one 400 Gb/s IB NIC per GPU", 8,
    Link("NVLink (H800)", 160, "DeepSeek-AI 2024, §3.1: 160 GB/s"), IB_400G, 8,
    "DeepSeek-AI 2024, §3.1-3.2.2 (IB 50 GB/s, NVLink 160 GB/s per GPU)"), _H100_PEAK)

