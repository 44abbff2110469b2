"""Lesson 06 — FP8 scaling for real: tensorwise, rowwise, MX (1×32, e8m0) and DeepSeek-V3 tiles, on torch's float8 dtypes.

    q, s = quantize(x, "mx")                 # float8_e4m3fn elements, one power-of-two scale per 1×32 block
    x_hat = dequantize(q, s, "mx")           # back to fp32: x_hat = q · s, block by block
    mx_quantize_reference(x)                 # the bit-exact MX reference (OCP MX v1.0, §6.3)
    quant_error(x, "rowwise")                # {"rel_error", "snr_db", "flushed"}
    fp8_matmul(a, b, "deepseek")             # quantise both operands, multiply in fp32, rescale per block

Every recipe stores x as q · s: q in float8_e4m3fn (max 448, no inf), s one fp32 scale per group.
A group is the whole tensor ("tensorwise", torchao's default), one row ("rowwise", torchao's
float8 rowwise recipe), a 1×32 block with a power-of-two scale ("mx": OCP Microscaling Formats
(MX) Specification v1.0, 2023, §5.3 and §6.3: X = 2^(⌊log2 amax⌋ − emax_elem), emax_elem = 8 for
E4M3, elements cast with saturation; on Blackwell the scale is stored as e8m0), or DeepSeek-V3's
1×128 activation tiles and 128×128 weight blocks with scale amax/448 in fp32 (DeepSeek-AI,
"DeepSeek-V3 Technical Report", arXiv:2412.19437, §3.3.2, Fig. 7). Casting: values beyond ±448 are
clamped first, then rounded to nearest even by torch (torch 2.13's CPU cast already saturates; the
clamp makes the result independent of a backend's overflow rule, which the formats leave open).
"""

from __future__ import annotations

import torch

from m11_helpers.validate import one_of, positive_int

__all__ = ["E4M3", "E4M3_MAX", "E4M3_EMAX", "RECIPES", "saturating_cast", "group_shape", "quantize", "dequantize",
           "mx_quantize_reference", "quant_error", "fp8_matmul", "matmul_error"]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448 = 1.75 · 2^8
E4M3_EMAX = 8  # exponent of the largest normal E4M3 number (OCP MX v1.0, Table 1: emax_elem = 8)
E8M0_BIAS = 127  # e8m0 stores 2^(e) as the byte e + 127; 0xFF is NaN (OCP MX v1.0, §5.4.1)

# recipe -> (rows, cols) of one scale group, for a (M, K) operand whose K is the contraction axis;
# None means "the whole axis". "deepseek_w" is for weights (128 × 128 blocks), "deepseek" for activations.
RECIPES: dict[str, tuple[int | None, int | None]] = {
    "tensorwise": (None, None),
    "rowwise": (1, None),
    "mx": (1, 32),
    "deepseek": (1, 128),
    "deepseek_w": (128, 128),
}


def saturating_cast(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """clamp(x, −max, max) then round to the nearest float8 (ties to even); plain .to() turns 449 into NaN."""
    fmax = torch.finfo(dtype).max
    return x.clamp(-fmax, fmax).to(dtype)


def group_shape(recipe: str, shape: tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of one scale group of `recipe` on a 2-D tensor of `shape`; each must divide the shape."""
    r, c = RECIPES[one_of("recipe", recipe, RECIPES)]
    r, c = shape[0] if r is None else r, shape[1] if c is None else c
    if shape[0] % r or shape[1] % c:
        raise ValueError(f"x of shape {tuple(shape)} must split into {r}×{c} groups for recipe {recipe!r}")
    return r, c


def _grouped(x: torch.Tensor, r: int, c: int) -> torch.Tensor:
    M, K = x.shape
    return x.reshape(M // r, r, K // c, c).transpose(1, 2)  # (M/r, K/c, r, c): one group per [i, j]


def _ungrouped(g: torch.Tensor) -> torch.Tensor:
    gm, gk, r, c = g.shape
    return g.transpose(1, 2).reshape(gm * r, gk * c)  # (M, K)


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """2^(⌊log2 amax⌋ − emax_elem), exact: frexp gives amax = m·2^e with m in [0.5, 1), so ⌊log2 amax⌋ = e − 1."""
    _, e = torch.frexp(amax)
    shared = (e - 1 - E4M3_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS)  # e8m0 holds 2^-127 … 2^127
    shared = torch.where(amax > 0, shared, torch.full_like(shared, -E8M0_BIAS))  # an all-zero block
    return torch.ldexp(torch.ones_like(amax), shared)


def quantize(x: torch.Tensor, recipe: str = "mx") -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) with x ≈ q·s per group: q float8_e4m3fn of x's shape, s fp32 of shape (M/r, K/c).

    s = amax/448 (every recipe but MX: the largest element lands exactly on 448) or, for "mx",
    the power of two 2^(⌊log2 amax⌋ − 8), which puts amax in [256, 512) and saturates what lies above 448.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}")
    r, c = group_shape(recipe, tuple(x.shape))
    g = _grouped(x.float(), r, c)  # (M/r, K/c, r, c)
    amax = g.abs().amax(dim=(-2, -1))  # (M/r, K/c)
    if recipe == "mx":
        s = _pow2_scale(amax)
    else:
        s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))  # a zero group keeps scale 1
    q = saturating_cast(g / s[..., None, None])  # (M/r, K/c, r, c)
    return _ungrouped(q), s


def dequantize(q: torch.Tensor, s: torch.Tensor, recipe: str = "mx") -> torch.Tensor:
    """x̂ = q·s, each group times its own scale, in fp32."""
    r, c = group_shape(recipe, tuple(q.shape))
    return _ungrouped(_grouped(q.float(), r, c) * s[..., None, None])  # (M, K)


def mx_quantize_reference(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """MX (E4M3, 1×block) quantisation written as the spec reads (OCP MX v1.0, §6.3), block by block.

    Returns (q uint8 bit patterns of the E4M3 elements, (M, K/block); e8m0 scale bytes as uint8):
    comparing bytes makes a check bit-exact, NaN included. shared_exp = ⌊log2 max|V_i|⌋ − emax_elem;
    X = 2^shared_exp; P_i = V_i / X cast to E4M3 with values beyond ±448 clamped to ±448.
    """
    positive_int("block", block)
    if x.dim() != 2 or x.shape[1] % block:
        raise ValueError(f"x must be 2-D with its last dim a multiple of block={block}, got {tuple(x.shape)}")
    xb = x.float().reshape(x.shape[0], -1, block)  # (M, K/block, block)
    amax = xb.abs().amax(dim=-1)  # (M, K/block)
    mant, e = torch.frexp(amax)
    shared = torch.where(amax > 0, e - 1 - E4M3_EMAX, torch.full_like(e, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)
    X = torch.ldexp(torch.ones_like(amax), shared)  # (M, K/block): a power of two, exactly
    p = (xb / X[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)  # (M, K/block, block)
    scale_bytes = (shared + E8M0_BIAS).to(torch.uint8)  # e8m0: the biased exponent, nothing else
    return p.reshape(x.shape).view(torch.uint8), scale_bytes


def quant_error(x: torch.Tensor, recipe: str) -> dict[str, float]:
    """Four views of x̂ = dequantize(quantize(x)) against x:

    rel_error ‖x̂ − x‖/‖x‖ and snr_db 20·log10(‖x‖/‖x̂ − x‖) — norms, so the largest entries dominate;
    typical_error, the median over nonzero entries of |x̂ − x|/|x| — what happens to an ordinary entry
    (E4M3 rounding alone gives ≤ 2^-4, about 2 % typically); degraded, the share of nonzeros whose
    error exceeds that bound (they fell into subnormals or to 0, or were saturated); flushed, those that became 0.
    """
    x = x.float()
    x_hat = dequantize(*quantize(x, recipe), recipe)
    err = (x_hat - x).norm()
    nz = x != 0
    rel = ((x_hat - x)[nz] / x[nz]).abs()  # (nnz,): each entry's own relative error
    return {"rel_error": float(err / x.norm()),
            "typical_error": float(rel.median()) if nz.any() else 0.0,
            "degraded": float((rel > 2.0 ** -4).sum() / nz.sum().clamp(min=1)),
            "snr_db": float(20 * torch.log10(x.norm() / err)) if err > 0 else float("inf"),
            "flushed": float(((x_hat == 0) & nz).sum() / nz.sum().clamp(min=1))}


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, recipe: str = "mx") -> torch.Tensor:
    """a (M, K) @ b (K, N) as an FP8 GEMM does it: both operands quantised along K, products summed in fp32.

    Each K-group's partial sum q_a·q_b is exact in fp32 (a product of two E4M3 numbers has 8 significant
    bits) and is rescaled by s_a·s_b before it joins the accumulator — DeepSeek-V3's promotion of partial
    sums to fp32 every 128 elements (§3.3.2). For "deepseek", a uses 1×128 tiles and b 128×128 blocks.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a (M, K) and b (K, N) must agree on K, got {tuple(a.shape)} and {tuple(b.shape)}")
    b_recipe = "deepseek_w" if recipe == "deepseek" else recipe
    qa, sa = quantize(a, recipe)  # sa: (M/ra, K/ca)
    qb, sb = quantize(b.t().contiguous(), b_recipe)  # quantise bᵀ (N, K) so both are grouped along K
    (ra, ca), (rb, cb) = group_shape(recipe, tuple(a.shape)), group_shape(b_recipe, (b.shape[1], b.shape[0]))
    step = min(ca, cb)  # K-slices on which both scales are constant
    out = a.new_zeros(a.shape[0], b.shape[1], dtype=torch.float32)  # (M, N): the fp32 accumulator
    for k0 in range(0, a.shape[1], step):
        part = qa[:, k0:k0 + step].float() @ qb[:, k0:k0 + step].float().t()  # (M, N), exact
        s_a = sa[:, k0 // ca].repeat_interleave(ra)[:, None]  # (M, 1)
        s_b = sb[:, k0 // cb].repeat_interleave(rb)[None, :]  # (1, N)
        out += part * s_a * s_b
    return out


def matmul_error(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """‖C − C_fp32‖/‖C_fp32‖ for bf16 operands and for each FP8 recipe (DeepSeek: tiles × blocks)."""
    ref = a.float() @ b.float()  # (M, N)
    rel = {"bf16": float(((a.bfloat16() @ b.bfloat16()).float() - ref).norm() / ref.norm())}
    for recipe in ("tensorwise", "rowwise", "mx", "deepseek"):
        rel[recipe] = float((fp8_matmul(a, b, recipe) - ref).norm() / ref.norm())
    return rel
