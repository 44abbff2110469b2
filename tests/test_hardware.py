"""Lesson 01: the roofline, compute budgets and capacity against the papers' worked examples; the spec
table's integrity (binary HBM capacities); and the measuring helpers' behaviour (never their timings),
the ping-pong on two real processes included."""

from __future__ import annotations

import math

import pytest

from m11_helpers import hardware
from m11_helpers.compute_budget import (
    PUBLISHED_MFU,
    attention_share,
    hardware_flops_per_token,
    hardware_flops_utilization,
    max_params,
    memory_needed,
    min_chips,
    model_flops_per_token,
    model_flops_utilization,
    per_param_bytes,
    training_days,
    training_flops,
)
from m11_helpers.config import RUNNING_EXAMPLE, param_count
from m11_helpers.hardware import (
    bf16_hardware,
    copy_bandwidth,
    cpu_flags,
    device_choices,
    fit_latency_bandwidth,
    measure_kernels,
    measure_matmul,
    measured_chip,
)
from m11_helpers.hardware_specs import CHIPS, DTYPE_BYTES, LINKS, ROWS_2026, Chip, GiB, chip
from m11_helpers.roofline import (
    arithmetic_intensity,
    attainable_flops,
    bound,
    matmul_bytes,
    matmul_flops,
    matmul_intensity,
    plot_roofline,
    ridge_point,
    roofline_point,
)
from m11_helpers.timing import Timing

H100 = CHIPS["H100 SXM"]
A100 = CHIPS["A100 SXM 80GB"]


# ---------------------------------------------------------------- compute budget

def test_gpt3_training_flops_kaplan():
    # 6·N·D for GPT-3 175B on 300B tokens (Brown et al. 2020, Table D.1 gives 3.14e23)
    assert training_flops(175e9, 300e9) == pytest.approx(3.15e23)


def test_megatron_34_days_needs_recomputation_factor_8():
    # Narayanan et al. 2021, §5.1: 1024 A100s at 140 TFLOP/s each -> ~34 days (they count 8·N·D)
    days8 = training_days(175e9, 300e9, gpus=1024, peak_flops=312e12, mfu=140 / 312, flops_per_param_token=8)
    assert days8 == pytest.approx(33.9, abs=0.05)
    days6 = training_days(175e9, 300e9, gpus=1024, peak_flops=312e12, mfu=140 / 312)
    assert days6 == pytest.approx(25.4, abs=0.05)
    assert days8 / days6 == pytest.approx(8 / 6)


def test_training_days_scales_inversely_with_gpus_and_mfu():
    base = training_days(7e9, 1e12, 64, 989.4e12, 0.4)
    assert training_days(7e9, 1e12, 128, 989.4e12, 0.4) == pytest.approx(base / 2)
    assert training_days(7e9, 1e12, 64, 989.4e12, 0.2) == pytest.approx(base * 2)


def test_mfu_and_hfu_against_palm_and_megatron():
    # PaLM Appendix B: 540.35B params, L 118, H 48, Q 256, T 2048, 238.3K tokens/s on 6144 TPU v4 (275 TFLOP/s)
    palm = dict(layers=118, attn_width=48 * 256, seq_len=2048)
    assert model_flops_utilization(238.3e3, 540.35e9, 6144, 275e12, **palm) == pytest.approx(0.462, abs=5e-4)
    assert model_flops_utilization(238.3e3, 540.35e9, 6144, 275e12) == pytest.approx(0.457, abs=5e-4)  # 6N only
    assert hardware_flops_utilization(238.3e3, 540.35e9, 6144, 275e12, **palm) == \
        model_flops_utilization(238.3e3, 540.35e9, 6144, 275e12, **palm)  # nothing recomputed: HFU = MFU
    # Narayanan et al. 2021, §5.1: with full recomputation F = 96·B·s·l·h²·(1 + s/6h + V/(16·l·h)) per step
    l_, h, s, v = 96, 12288, 2048, 51200  # GPT-3 175B
    n = 12 * l_ * h * h * (1 + 13 / (12 * h)) + (v + s) * h  # Table 1's parameter count
    megatron = 96 * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))
    ours = hardware_flops_per_token(n, l_, h, s, recompute="full")
    assert ours == pytest.approx(megatron, rel=2e-3)  # they do not recompute the logits: 6Vh, not 8Vh
    assert ours / model_flops_per_token(n, l_, h, s) == pytest.approx(4 / 3)
    assert hardware_flops_per_token(n, l_, h, s, "selective") - model_flops_per_token(n, l_, h, s) == 4 * l_ * h * s
    # the running example at 4K: attention adds 12·L·h·s = 15.9 % to 6N
    assert attention_share(RUNNING_EXAMPLE) == pytest.approx(0.159, abs=5e-4)
    assert model_flops_per_token(RUNNING_EXAMPLE) == pytest.approx(6 * param_count(RUNNING_EXAMPLE) * 1.159, rel=1e-3)
    with pytest.raises(ValueError, match="recompute"):
        hardware_flops_per_token(RUNNING_EXAMPLE, recompute="some")


@pytest.mark.parametrize("bad", [dict(mfu=0), dict(mfu=1.5), dict(gpus=0), dict(peak_flops=-1)])
def test_training_days_rejects_bad_input(bad):
    kwargs = dict(params=1e9, tokens=1e9, gpus=8, peak_flops=1e12, mfu=0.5) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        training_days(**kwargs)


# ---------------------------------------------------------------- capacity

def test_hbm_capacity_is_binary():
    # an "80 GB" A100/H100 carries 80 GiB of HBM (the datasheets' "GB" is binary for HBM); TPU and Trainium docs agree in GiB
    for c in (A100, H100):
        assert c.memory_bytes == 85_899_345_920 and c.memory_gib == 80 and c.memory_gb == pytest.approx(85.9, abs=0.05)
    assert CHIPS["TPU v4"].memory_bytes == 32 * GiB and CHIPS["Trainium2"].memory_bytes == 96 * GiB
    assert all(isinstance(c.memory_bytes, int) and c.memory_bytes % GiB == 0 for c in CHIPS.values())
    assert H100.memory_text == "80 GiB = 85.9 GB"


def test_h100_holds_21b_params_in_fp32_and_5_4b_in_training():
    # 80 GiB / 4 B and / 16 B: 7 % more than the 20B and 5.0B of a decimal reading
    assert max_params(H100.memory_bytes, 4) == 21_474_836_480
    assert max_params(H100.memory_bytes, "autocast") == 5_368_709_120
    assert max_params(80e9, "autocast") == 5_000_000_000
    assert per_param_bytes("deepspeed") == per_param_bytes("autocast") == 16  # ZeRO §3.1 vs torch.amp: both 16
    assert per_param_bytes("megatron") == 18  # Megatron Core: bf16 params, fp32 main grads


def test_running_example_fits_for_inference_not_training():
    n = param_count(RUNNING_EXAMPLE)
    assert n == 6_738_415_616
    assert memory_needed(n, 2) == pytest.approx(13.48e9, rel=1e-3)
    assert memory_needed(n, 2) < H100.memory_bytes
    assert memory_needed(n, "autocast") == pytest.approx(107.8e9, rel=1e-3)
    assert memory_needed(n, "autocast") / GiB == pytest.approx(100.4, abs=0.05)
    assert memory_needed(n, "autocast") > H100.memory_bytes
    assert min_chips(n, H100.memory_bytes, "autocast") == 2 and min_chips(n, H100.memory_bytes, 2) == 1
    assert min_chips(n, CHIPS["H200 SXM"].memory_bytes, "autocast") == 1  # 141 GiB = 151.4 GB


def test_capacity_rejects_bad_input():
    with pytest.raises(ValueError, match="bytes_per_param"):
        max_params(80e9, "fp64 weights")
    with pytest.raises(ValueError, match="memory_bytes"):
        max_params(0, 2)


def test_published_mfu_is_far_below_80_percent():
    # "80-90 % utilisation", a common claim, is not what training runs publish
    assert all(0.2 < lo <= hi < 0.6 for _, lo, hi, _, _ in PUBLISHED_MFU)
    assert all(src for *_, src in PUBLISHED_MFU)


# ---------------------------------------------------------------- roofline

def test_matmul_counts_and_intensity():
    assert matmul_flops(2, 3, 4) == 48
    assert matmul_bytes(2, 3, 4, "fp32") == (8 + 12 + 6) * 4
    for n in (64, 1024, 4096):  # square: I = 2n³ / (3n²·b) = n / (1.5·b)
        assert matmul_intensity(n, n, n, "bf16") == pytest.approx(n / 3)
        assert matmul_intensity(n, n, n, "fp32") == pytest.approx(n / 6)
    # a matrix-vector product stays near 1 FLOP/byte (bf16) however large: memory-bound everywhere
    assert matmul_intensity(8192, 1, 8192, "bf16") < 1.0


def test_ridge_and_attainable():
    assert ridge_point(H100.peak_flops("bf16"), H100.bandwidth) == pytest.approx(295.3, abs=0.1)
    assert ridge_point(A100.peak_flops("bf16"), A100.bandwidth) == pytest.approx(153.0, abs=0.1)
    peak, bw = 100e12, 1e12
    assert attainable_flops(10, peak, bw) == 10e12  # slanted roof
    assert attainable_flops(1000, peak, bw) == peak  # flat roof
    assert bound(99.9, peak, bw) == "memory-bound" and bound(100, peak, bw) == "compute-bound"
    assert arithmetic_intensity(0, 1) == 0
    with pytest.raises(ValueError, match="intensity"):
        attainable_flops(0, peak, bw)
    with pytest.raises(ValueError, match="bandwidth"):
        ridge_point(peak, 0)


def test_roofline_point_names_the_bound():
    small = roofline_point(H100, 16, 4096, 4096, "bf16")  # decode-like: few tokens
    big = roofline_point(H100, 4096, 4096, 4096, "bf16")
    assert small["bound"] == "memory-bound" and small["fraction_of_peak"] < 0.2
    assert big["bound"] == "compute-bound" and big["attainable"] == H100.peak_flops("bf16")
    assert big["seconds"] == pytest.approx(2 * 4096 ** 3 / 989.4e12)
    with pytest.raises(ValueError, match="dtype"):
        roofline_point(CHIPS["TPU v4"], 8, 8, 8, "fp32")


# ---------------------------------------------------------------- the spec table

def test_table_has_the_issue_rows_each_with_a_source():
    for name in ["A100 SXM 80GB", "H100 SXM", "H200 SXM", "B200 (HGX)", "TPU v4", "TPU v5e", "TPU v5p",
                 "MI300X", "Gaudi2", "Trainium"]:
        assert name in CHIPS
    for c in CHIPS.values():
        assert "http" in c.source or "ISCA" in c.source, c.name
        assert "bf16" in c.peak_tflops or "not in the sources" in c.note, c.name  # never a made-up peak
        assert set(c.peak_tflops) <= set(DTYPE_BYTES)
        assert c.as_of and c.cite.endswith(f"(as of {c.as_of})"), c.name
    # 2026 rows: Blackwell Ultra and MI355X carry 288 GiB, the most per chip; v6e's MXUs are 256×256 again
    assert max(c.memory_gib for c in CHIPS.values()) == 288 == CHIPS["B300 (HGX)"].memory_gib == CHIPS["MI355X"].memory_gib
    assert CHIPS["TPU v6e"].peak_tflops["bf16"] == 918 and "256×256" in CHIPS["TPU v6e"].note
    for c in (CHIPS[name] for name in ROWS_2026):  # a source and a date for every figure the row stores
        stored = {*c.peak_tflops, "memory", "bandwidth", *(["interconnect"] if c.interconnect_gbs else []),
                  *(["scale_up"] if c.scale_up else [])}
        assert stored <= set(c.figures) and all(src and date for src, date in c.figures.values()), c.name
    assert CHIPS["GB200 NVL72 (per GPU)"].scale_up == 72 and "2025-04-09" in CHIPS["Ironwood"].figure_cite("fp8")
    with pytest.raises(ValueError, match="figures"):
        Chip("uncited", "GPU", {"bf16": 1}, GiB, 1.0, "none", None, "https://example.invalid", as_of="x",
             figures={"bf16": ("a datasheet", "")})
    with pytest.raises(ValueError, match="as_of"):
        Chip("undated", "GPU", {"bf16": 1}, GiB, 1.0, "none", None, "https://example.invalid")
    for link in LINKS.values():
        assert link.source and link.gbs_per_direction > 0


def test_table_claims():
    assert H100.peak_tflops["bf16"] == pytest.approx(989, abs=1)  # dense; 1979 with sparsity
    assert 2 * H100.peak_tflops["fp8"] == pytest.approx(3958, abs=1)  # "nearly 4 petaFLOPS" = fp8 sparse
    assert A100.peak_tflops["bf16"] == 312
    for c in (A100, H100):  # "2× FP32" holds against TF32 only; ~15× against plain FP32
        assert c.peak_tflops["bf16"] / c.peak_tflops["tf32"] == pytest.approx(2, rel=0.01)
        assert 14 < c.peak_tflops["bf16"] / c.peak_tflops["fp32"] < 17
    assert CHIPS["TPU v4"].peak_tflops["bf16"] == 275
    # PCIe Gen5 x16 vs H100's HBM: ~50× slower (not orders of magnitude)
    assert H100.bandwidth / (LINKS["PCIe Gen5 x16"].gbs_per_direction * 1e9) == pytest.approx(52.3, abs=0.1)


def test_chip_lookup_and_validation():
    assert chip("H200 SXM").memory_gib == 141
    with pytest.raises(ValueError, match="name"):
        chip("H300")
    with pytest.raises(ValueError, match="peak_tflops"):
        Chip("x", "GPU", {"fp64": 1}, 1, 1, "-", None, "-", as_of="-")
    with pytest.raises(ValueError, match="memory_bytes"):
        Chip("x", "GPU", {"bf16": 1}, 80.5, 1, "-", None, "-", as_of="-")  # bytes are whole
    with pytest.raises(ValueError, match="dtype"):
        H100.peak_flops("fp4")


# ---------------------------------------------------------------- measuring (behaviour only)

def test_measurements_return_positive_rates():
    assert measure_matmul(32, "fp32", repeats=1) > 0
    assert measure_matmul(32, "bf16", repeats=1) > 0
    assert copy_bandwidth(2**20, repeats=1) > 0
    rows = measure_kernels(repeats=1, vector_mb=1)
    assert [r["kernel"] for r in rows][:2] == ["x + y", "2·x + y"]
    intensities = [r["intensity"] for r in rows]
    assert intensities == sorted(intensities)  # ordered by rising intensity
    assert rows[0]["intensity"] == pytest.approx(1 / 12)
    assert all(r["achieved"] > 0 for r in rows)
    with pytest.raises(ValueError, match="dtype"):
        measure_matmul(8, "fp64")


def test_copy_bandwidth_counts_read_plus_write(monkeypatch):
    # the course's one convention (STREAM "Copy"): a copy of S bytes in t seconds is 2S/t
    monkeypatch.setattr(hardware, "time_it", lambda fn, **kw: (fn(), Timing((0.5,)))[1])
    assert copy_bandwidth(1000, repeats=1) == 4000
    with pytest.raises(ValueError, match="nbytes"):
        copy_bandwidth(0)


def test_fit_latency_bandwidth_recovers_alpha_and_beta():
    sizes = [2**k for k in range(4, 24, 2)]
    alpha, bw = 30e-6, 2e9
    a, b = fit_latency_bandwidth(sizes, [alpha + s / bw for s in sizes])
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(bw, rel=1e-9)
    with pytest.raises(ValueError, match="distinct sizes"):
        fit_latency_bandwidth([8, 8], [1.0, 2.0])
    with pytest.raises(ValueError, match="slope"):
        fit_latency_bandwidth([8, 16], [2.0, 1.0])


def test_measured_chip_joins_the_menu():
    me = measured_chip("this machine", {"fp32": 0.1, "bf16": 0.5}, 5e9, memory_bytes=8 * GiB)
    menu = device_choices(me)
    assert next(iter(menu)) == "this machine" and "H100 SXM" in menu
    assert ridge_point(me.peak_flops("fp32"), me.bandwidth) == pytest.approx(20)


def test_bf16_hardware_from_flags():
    assert bf16_hardware({"avx2", "amx_bf16", "avx512_bf16"}) == "AMX"
    assert bf16_hardware({"avx512_bf16"}) == "AVX512-BF16"
    assert bf16_hardware({"avx2", "fma"}) == "none"
    assert isinstance(cpu_flags(), set)


def test_plot_roofline_draws_one_line_per_device():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = plot_roofline([H100, CHIPS["TPU v4"]], "fp32", points=[{"label": "p", "intensity": 1, "flops": 1e9}])
    labels = [l.get_label() for l in ax.lines]
    assert "H100 SXM (fp32)" in labels and "TPU v4 (bf16)" in labels  # v4 has no fp32: falls back
    assert math.isclose(ax.get_xlim()[0], 0.01, rel_tol=0.5)
    plt.close("all")


def _observed_ping_pong(sizes):
    from m11_helpers.grading.observe import record_comm
    from m11_helpers.hardware import ping_pong_sweep

    with record_comm() as log:
        out = ping_pong_sweep(sizes, repeats=2)
    return out, [(e.op, e.peer, e.nbytes) for e in log.events]


def test_ping_pong_on_two_real_processes():
    from m11_helpers.launch import launch

    (t0, log0), (t1, log1) = launch(_observed_ping_pong, [8, 4096], num_processes=2, timeout=60, show_output=False)
    assert t0 == t1 and all(t > 0 for t in t0)  # both ranks report rank 0's clock
    # 1 warm-up + 2 timed exchanges per size, each a send and the echo of the same bytes, then one broadcast
    expect0 = [(op, 1, s) for s in (8, 4096) for _ in range(3) for op in ("send", "recv")]
    assert [e for e in log0 if e[0] != "broadcast"] == expect0
    assert [e for e in log1 if e[0] != "broadcast"] == [(op, 0, s) for s in (8, 4096) for _ in range(3)
                                                        for op in ("recv", "send")]


def test_numpy_numbers_are_accepted_and_bad_dtypes_named():
    import numpy as np

    assert training_flops(np.int64(10), np.float64(2.0)) == 120
    with pytest.raises(ValueError, match="dtype"):
        measure_kernels(dtype="fp64", repeats=1, vector_mb=1)
