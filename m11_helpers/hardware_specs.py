"""Accelerator spec sheets as data: peak dense FLOP/s per dtype, memory, bandwidth, links, each with its source
(lesson 01).

Every figure is the vendor's *dense* peak (no 2:4 structured sparsity). Where a datasheet prints only
the sparse figure (NVIDIA marks these "with sparsity"), the row stores half of it and says so in its
`note`. "fp32" is the plain (non-tensor-core) FP32 rate; "tf32" is FP32 inputs rounded to TF32 on the
tensor cores. Interconnect bandwidths are per chip, both directions added (NVIDIA's convention for NVLink).
Every row carries `as_of`, the date of its source (or the month it was read), and `cite` prints both:
spec tables change with each generation, so a lesson shows the date with the figure. The 2026 rows
(`ROWS_2026`) carry a source and a date **per figure** (`figures`, `figure_cite`): their numbers come
from launch pages and blogs that were revised after launch. A figure we could not source is left out
(Ironwood's bf16 peak, GB300's fp32 and int8), never filled in. Rack-scale parts (GB200/GB300 NVL72)
are stored per GPU, the rack's figure ÷ 72; `scale_up` is the chips of one NVLink/ICI domain.

Units. Rates are decimal: TB/s = 1e12 bytes/s, TFLOP/s = 1e12 FLOP/s, as the datasheets mean them.
**HBM capacity is binary**: HBM stacks are built from power-of-two DRAM dies, so the "80 GB" of an
A100/H100 is 80 GiB = 85,899,345,920 bytes (the driver reports slightly less as usable). Datasheets
print "GB" for it all the same (NVIDIA, AMD, Intel, Google's TPU docs: "16 GB", "95 GB"); AWS's Neuron
docs print GiB. Every row stores capacity in bytes (`Chip.memory_bytes`, an int); `memory_gb` is that
in 1e9 bytes (85.9 for an "80 GB" part), `memory_gib` in 2^30 bytes (80.0), `memory_text` both. Reading
"80 GB" as 80e9 bytes makes every fit/no-fit call ~7 % too tight (2^30 / 1e9 = 1.074).
"""

from __future__ import annotations

import dataclasses

from m11_helpers.validate import non_negative_real, one_of, positive_int, positive_real

__all__ = ["Chip", "CHIPS", "LINKS", "Link", "NVLINK_H100", "IB_400G", "DTYPE_BYTES", "GiB", "chip", "ROWS_2026"]

GiB = 2**30  # bytes in one GiB: the unit HBM capacity comes in

# Bytes per element of each dtype a spec sheet quotes; tf32 is stored in 4 bytes.
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator (or this machine, measured): what the roofline and the capacity sums need."""

    name: str
    kind: str  # "GPU", "TPU", "ASIC" or "CPU"
    peak_tflops: dict  # dtype -> dense peak, 1e12 FLOP/s (int8: 1e12 OP/s)
    memory_bytes: int  # on-package memory (HBM) in bytes: binary, e.g. 80 * GiB for an "80 GB" H100
    bandwidth_tbs: float  # memory bandwidth, 1e12 bytes/s
    interconnect: str  # the chip-to-chip link of its scale-up domain
    interconnect_gbs: float | None  # per chip, both directions, 1e9 bytes/s (None: not published per chip)
    source: str  # where the figures come from: document title and URL
    note: str = ""
    as_of: str = ""  # when the source said so (its date, or the month it was read): spec sheets change
    figures: dict = dataclasses.field(default_factory=dict)  # figure -> (source, as_of): a dtype, "memory", …
    scale_up: int | None = None  # chips in one scale-up domain (NVLink / ICI), where the source gives it

    def __post_init__(self) -> None:
        unknown = set(self.peak_tflops) - set(DTYPE_BYTES)
        if unknown:
            raise ValueError(f"peak_tflops has unknown dtypes {sorted(unknown)}; allowed: {sorted(DTYPE_BYTES)}")
        positive_int(f"{self.name}: memory_bytes", self.memory_bytes)
        positive_real(f"{self.name}: bandwidth_tbs", self.bandwidth_tbs)
        if not self.as_of:
            raise ValueError(f"{self.name}: as_of must name the date of its source (figures age)")
        for key, cited in self.figures.items():
            one_of(f"{self.name}: figures key", key, (*self.peak_tflops, *FIGURES))
            if not (isinstance(cited, tuple) and len(cited) == 2 and all(cited)):
                raise ValueError(f"{self.name}: figures[{key!r}] must be (source, as_of), got {cited!r}")

    def figure_cite(self, key: str) -> str:
        """'<source> (as of <date>)' for one figure (a dtype, "memory", "bandwidth", "interconnect", "scale_up")."""
        source, as_of = self.figures.get(key, (self.source, self.as_of))
        return f"{source} (as of {as_of})"

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak in FLOP/s for `dtype`; ValueError if the sheet gives no figure for it."""
        if dtype not in self.peak_tflops:
            raise ValueError(f"dtype {dtype!r} has no peak for {self.name}; available: {sorted(self.peak_tflops)}")
        return self.peak_tflops[dtype] * 1e12

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.bandwidth_tbs * 1e12

    @property
    def memory_gb(self) -> float:
        """Capacity in GB (1e9 bytes), the unit papers count model sizes in: 85.9 for an "80 GB" H100."""
        return self.memory_bytes / 1e9

    @property
    def memory_gib(self) -> float:
        """Capacity in GiB (2^30 bytes), what nvidia-smi and torch.cuda report: 80.0 for an "80 GB" H100."""
        return self.memory_bytes / GiB

    @property
    def cite(self) -> str:
        """'<source> (as of <date>)': what a lesson prints next to a figure of this row."""
        return f"{self.source} (as of {self.as_of})"

    @property
    def memory_text(self) -> str:
        """'80 GiB = 85.9 GB': the capacity in both units, binary first (as the datasheet's figure)."""
        return f"{self.memory_gib:g} GiB = {self.memory_gb:.1f} GB"


_NV_SPARSE = "datasheet prints tensor-core rates with sparsity; dense = half"
FIGURES = ("memory", "bandwidth", "interconnect", "scale_up")  # the figures of a row besides its peaks


def _cited(source: str, as_of: str, *keys: str) -> dict:
    """{key: (source, as_of)} for figures that one document gives."""
    return dict.fromkeys(keys, (source, as_of))


_GB200 = ("NVIDIA GB200 NVL72 page, specifications table (72 GPUs: FP8 720 PFLOPS, FP16/BF16 360 PFLOPS, TF32 "
          "180 PFLOPS with sparsity; FP32 5,760 TFLOPS; up to 13.5 TB HBM3e, 576 TB/s; NVLink 130 TB/s), "
          "https://www.nvidia.com/en-us/data-center/gb200-nvl72/", "launch, GTC 2024-03")
_GB200_MEM = ("NVIDIA GB200 Grace Blackwell Superchip (same page): up to 372 GB HBM3e for its 2 GPUs", "2024")
_GB300 = ("NVIDIA GB300 NVL72 page, specifications table (72 GPUs: FP8 720 PFLOPS, FP16/BF16 360 PFLOPS, TF32 "
          "180 PFLOPS with sparsity; up to 576 TB/s; NVLink 130 TB/s), https://www.nvidia.com/en-us/data-center/"
          "gb300-nvl72/", "2025")
_ULTRA = ("NVIDIA Blackwell Ultra announcement, GTC 2025-03-18: 288 GB HBM3e per GPU", "2025-03")
_HGX = ("NVIDIA HGX platform page, HGX B300 column (8 GPUs: FP8 72 PFLOPS, FP16/BF16 36 PFLOPS, TF32 18 PFLOPS "
        "with sparsity; FP32 600 TFLOPS; NVLink 1.8 TB/s per GPU), https://www.nvidia.com/en-us/data-center/hgx/",
        "2025")
_IRONWOOD = ("Google, 'Ironwood: The first Google TPU for the age of inference' (blog: 4,614 TFLOPS FP8 per chip, "
             "192 GB HBM at 7.2 TB/s, ICI 1.2 TB/s bidirectional, pods of 9,216 chips), "
             "https://blog.google/products/google-cloud/ironwood-tpu-age-of-inference/", "2025-04-09")
_MI355X = ("AMD Instinct MI355X launch, Advancing AI 2025 (2025-06-12): FP16/BF16 2.5 PFLOPS, FP8 5 PFLOPS dense "
           "(rounded as AMD states them), 288 GB HBM3E at 8 TB/s, https://www.amd.com/en/products/accelerators/"
           "instinct/mi350.html", "2025-06-12")
_V6E = ("Google Cloud TPU v6e (Trillium) documentation, https://docs.cloud.google.com/tpu/docs/v6e", "docs read 2026-12")

CHIPS: dict[str, Chip] = {c.name: c for c in [
    Chip("A100 SXM 80GB", "GPU",
         {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
         80 * GiB, 2.039, "NVLink 3", 600,
         "NVIDIA A100 Tensor Core GPU datasheet (2021), https://www.nvidia.com/content/dam/en-zz/Solutions/"
         "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
         "dense figures as printed; sparsity doubles the tensor-core rates",
         as_of="datasheet r4, 2021"),
    Chip("H100 SXM", "GPU",
         {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9},
         80 * GiB, 3.35, "NVLink 4", 900,
         "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/"
         "nvidia-tensor-core-gpu-datasheet; dense rates: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)",
         _NV_SPARSE,
         as_of="datasheet and whitepaper, 2022"),
    Chip("H200 SXM", "GPU",
         {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9},
         141 * GiB, 4.8, "NVLink 4", 900,
         "NVIDIA H200 Tensor Core GPU datasheet (2024), https://www.nvidia.com/en-us/data-center/h200/",
         _NV_SPARSE + "; same compute as H100, more and faster HBM3e",
         as_of="datasheet 2024"),
    Chip("B200 (HGX)", "GPU",
         {"fp32": 75, "tf32": 1125, "bf16": 2250, "fp16": 2250, "fp8": 4500, "int8": 4500},
         180 * GiB, 8.0, "NVLink 5", 1800,
         "NVIDIA HGX B200 specifications (8-GPU board), https://www.nvidia.com/en-us/data-center/hgx/",
         "board figures ÷ 8 GPUs; " + _NV_SPARSE,
         as_of="HGX page, 2024"),
    Chip("TPU v4", "TPU", {"bf16": 275, "int8": 275},
         32 * GiB, 1.2, "ICI, 3D torus, 4096-chip pods", None,
         "Google Cloud TPU v4 documentation, https://cloud.google.com/tpu/docs/v4; Jouppi et al., "
         "'TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning', ISCA 2023",
         "32 GiB HBM2; the docs give pod figures only (all-reduce 1.1 PB/s per 4096-chip pod)",
         as_of="docs and ISCA paper, 2023"),
    Chip("TPU v5e", "TPU", {"bf16": 197, "int8": 394},
         16 * GiB, 0.819, "ICI, 2D torus, 256-chip pods", 400,
         "Google Cloud TPU v5e documentation, https://cloud.google.com/tpu/docs/v5e",
         as_of="docs read 2026-12"),
    Chip("TPU v5p", "TPU", {"bf16": 459, "fp8": 459, "int8": 918},
         95 * GiB, 2.765, "ICI, 3D torus, 8960-chip pods", 1200,
         "Google Cloud TPU v5p documentation, https://cloud.google.com/tpu/docs/v5p",
         as_of="docs read 2026-12"),
    Chip("MI300X", "GPU",
         {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "int8": 2614.9},
         192 * GiB, 5.3, "Infinity Fabric, 7 links × 128 GB/s", 896,
         "AMD Instinct MI300X data sheet (2023), https://www.amd.com/content/dam/amd/en/documents/"
         "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf",
         as_of="data sheet 2023"),
    Chip("Gaudi2", "ASIC", {"bf16": 432, "fp8": 865},
         96 * GiB, 2.46, "24 × 100 GbE RoCE on chip", 600,
         "Habana Gaudi2 white paper (2022), https://habana.ai/products/gaudi2/; BF16/FP8 matrix rates: "
         "Intel Gaudi 3 AI Accelerator white paper (2024), comparison table",
         "2.4 Tb/s each way = 300 GB/s, 600 GB/s both directions",
         as_of="white papers 2022 and 2024"),
    Chip("Trainium", "ASIC", {"fp32": 47.5, "tf32": 190, "bf16": 190, "fp16": 190, "fp8": 190, "int8": 380},
         32 * GiB, 0.82, "NeuronLink-v2", None,
         "AWS Neuron documentation, Trainium architecture, https://awsdocs-neuron.readthedocs-hosted.com/"
         "en/latest/general/arch/neuron-hardware/trainium.html",
         "32 GiB per chip (Trn1); link bandwidth not published per chip there",
         as_of="Neuron docs, Trn1 (2022)"),
    Chip("Trainium2", "ASIC", {"fp32": 181, "tf32": 667, "bf16": 667, "fp16": 667, "fp8": 1299},
         96 * GiB, 2.9, "NeuronLink-v3", None,
         "AWS Neuron documentation, Trainium2 architecture, https://awsdocs-neuron.readthedocs-hosted.com/"
         "en/latest/about-neuron/arch/neuron-hardware/trainium2.html",
         "96 GiB per chip",
         as_of="Neuron docs, Trn2 (2024)"),
    Chip("B300 (HGX)", "GPU", {"fp32": 75, "tf32": 1125, "bf16": 2250, "fp16": 2250, "fp8": 4500},
         288 * GiB, 8.0, "NVLink 5", 1800,
         "NVIDIA HGX B300 specification table (8 GPUs: FP16/BF16 36 PFLOPS and FP8 72 PFLOPS with sparsity, "
         "2.3 TB HBM3e, 1.8 TB/s NVLink per GPU) as reproduced by acecloud.ai ('NVIDIA HGX B300: Specs', Feb 2026) "
         "and fibermall.com; NVIDIA's page: https://www.nvidia.com/en-us/data-center/hgx/",
         "board figures ÷ 8 GPUs; " + _NV_SPARSE + "; 288 GB of HBM3e per GPU, up to 8 TB/s; not checked "
         "against an NVIDIA datasheet", as_of="read 2026-12",
         figures={**_cited(*_HGX, "fp32", "tf32", "bf16", "fp16", "fp8", "interconnect", "scale_up"),
                  **_cited(*_ULTRA, "memory", "bandwidth")}, scale_up=8),
    Chip("MI355X", "GPU", {"bf16": 2500, "fp16": 2500, "fp8": 5000}, 288 * GiB, 8.0, "Infinity Fabric (4th gen)", None,
         "AMD ROCm documentation, GPU specifications (MI355X: 288 GiB VRAM), https://rocm.docs.amd.com/en/latest/"
         "reference/gpu-specs.html; 8 TB/s: The Register, 2025-06-12, 'AMD's MI355X is a 1.4 kW liquid-cooled "
         "monster', reporting AMD's launch figures",
         "dense peaks as AMD's launch rounds them (2.5 / 5 PFLOPS); fp32 and the per-chip link not stored",
         as_of="read 2026-12", figures=_cited(*_MI355X, "bf16", "fp16", "fp8", "memory", "bandwidth")),
    Chip("TPU v6e", "TPU", {"bf16": 918, "int8": 1836},
         32 * GiB, 1.638, "ICI, 2D torus, 256-chip pods", 800,
         "Google Cloud TPU v6e (Trillium) documentation, https://docs.cloud.google.com/tpu/docs/v6e",
         "one TensorCore per chip with two 256×256 MXUs (v2–v5: 128×128)", as_of="docs read 2026-12",
         figures=_cited(*_V6E, "bf16", "int8", "memory", "bandwidth", "interconnect", "scale_up"), scale_up=256),
    Chip("GB200 NVL72 (per GPU)", "GPU", {"fp32": 80, "tf32": 1250, "bf16": 2500, "fp16": 2500, "fp8": 5000},
         186 * GiB, 8.0, "NVLink 5, one 72-GPU domain", 1800, _GB200[0],
         "rack figures ÷ 72; " + _NV_SPARSE + "; TP and EP can span 72 GPUs, not 8", as_of=_GB200[1],
         figures={**_cited(*_GB200, "fp32", "tf32", "bf16", "fp16", "fp8", "bandwidth", "interconnect", "scale_up"),
                  **_cited(*_GB200_MEM, "memory")}, scale_up=72),
    Chip("GB300 NVL72 (per GPU)", "GPU", {"tf32": 1250, "bf16": 2500, "fp16": 2500, "fp8": 5000},
         288 * GiB, 8.0, "NVLink 5, one 72-GPU domain", 1800, _GB300[0],
         "rack figures ÷ 72; " + _NV_SPARSE + "; fp32 and int8 not stored (not sourced)", as_of=_GB300[1],
         figures={**_cited(*_GB300, "tf32", "bf16", "fp16", "fp8", "bandwidth", "interconnect", "scale_up"),
                  **_cited(*_ULTRA, "memory")}, scale_up=72),
    Chip("Ironwood", "TPU", {"fp8": 4614}, 192 * GiB, 7.2, "ICI, 9,216-chip pods", 1200, _IRONWOOD[0],
         "TPU7x; bf16 peak not in the sources we read (the blog gives FP8): none stored", as_of=_IRONWOOD[1],
         figures=_cited(*_IRONWOOD, "fp8", "memory", "bandwidth", "interconnect", "scale_up"), scale_up=9216),
]}
ROWS_2026 = ("B300 (HGX)", "GB200 NVL72 (per GPU)", "GB300 NVL72 (per GPU)", "MI355X", "TPU v6e", "Ironwood")


def chip(name: str) -> Chip:
    """Look a chip up by name; ValueError lists the names there are."""
    return CHIPS[one_of("name", name, CHIPS)]


@dataclasses.dataclass(frozen=True)
class Link:
    """An interconnect: bandwidth per direction and the α (latency per message) the α–β model uses."""

    name: str
    gbs_per_direction: float  # 1e9 bytes/s, one direction
    source: str
    alpha_us: float = 5.0  # per-message latency, µs: an assumed figure of the order NCCL reaches
    as_of: str = "standard or datasheet as cited"  # link rates are fixed by a standard or a product generation

    def __post_init__(self) -> None:
        positive_real(f"{self.name}: gbs_per_direction (the bandwidth)", self.gbs_per_direction)
        non_negative_real(f"{self.name}: alpha_us", self.alpha_us)

    @property
    def bandwidth(self) -> float:
        """Bytes/s per direction."""
        return self.gbs_per_direction * 1e9

    @property
    def beta(self) -> float:
        """Seconds per byte: 1 / bandwidth."""
        return 1.0 / self.bandwidth

    @property
    def alpha(self) -> float:
        """Seconds per message."""
        return self.alpha_us * 1e-6


# The links between chips and hosts, one direction each (a link's "both directions" figure is twice this).
# α is an assumed per-step latency of the order NCCL reaches (a few µs); for gradient-sized messages
# it is negligible, which is the point of the α–β lessons.
LINKS: dict[str, Link] = {l.name: l for l in [
    Link("PCIe Gen4 x16", 32, "PCI-SIG, PCI Express Base Specification 4.0 (16 GT/s per lane)"),
    Link("PCIe Gen5 x16", 64, "PCI-SIG, PCI Express Base Specification 5.0 (32 GT/s per lane)"),
    Link("InfiniBand NDR (1 port)", 50, "NVIDIA Quantum-2 InfiniBand platform / ConnectX-7: 400 Gb/s per port "
         "= 50 GB/s per direction, https://www.nvidia.com/en-us/networking/quantum2/", alpha_us=5.0),
    Link("NVLink 3 (A100)", 300, "NVIDIA A100 datasheet: 600 GB/s, both directions", alpha_us=3.0),
    Link("NVLink 4 (H100)", 450, "NVIDIA H100 datasheet: 900 GB/s NVLink per GPU, both directions", alpha_us=3.0),
    Link("NVLink 5 (B200)", 900, "NVIDIA HGX B200 specifications: 1.8 TB/s, both directions", alpha_us=3.0),
    Link("TPU v5p ICI (per chip)", 600, "Google Cloud TPU v5p docs: 1200 GB/s bidirectional per chip"),
]}
NVLINK_H100 = LINKS["NVLink 4 (H100)"]
IB_400G = LINKS["InfiniBand NDR (1 port)"]
