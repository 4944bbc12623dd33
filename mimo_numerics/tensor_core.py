"""Tensor-core accumulation as the policy's ``gemm_model`` describes it, vectorised in torch (any device).

A tensor core does not add a GEMM's products one by one in FP32. Per MMA-Sim (Xie et al., the ``mmasim`` package,
which the tests use as the definition), one instruction step of Hopper's ``wgmma`` (and of ``mma.sync`` on sm_90)
with FP32 accumulation is a *fused dot-add* of ``L`` products and the accumulator ``c``:

1. every product ``a_k·b_k`` is exact; its exponent for alignment is ``e(a_k) + e(b_k)`` (``e(x) = floor(log2|x|)``,
   never below the operand format's smallest normal exponent: -126 for bf16/fp32, -14 for fp16), ``c``'s is
   ``e(c)``; a zero term gets the exponent ``zero_exponent``;
2. every term is truncated (toward zero) to a multiple of ``2^(e_max - F)``, ``e_max`` the largest exponent of
   the step's terms;
3. the truncated terms are summed exactly;
4. the sum is rounded toward zero to FP32 (subnormals kept; a sum of magnitude 2^128 or more becomes ±inf, as
   MMA-Sim truncates the significand and then scales), ``-0`` becoming ``+0``.

A GEMM of depth K runs ``ceil(K / L)`` such steps in ascending k, each step's result the next one's ``c``; a
*cleared* GEMM starts from ``c = 0``, an *accumulating* one (upstream's ``clear_accum=False``) from the live
accumulator. The models (:data:`GEMM_MODELS`):

==============  ====  ====  =============  =====================================================================
gemm_model      F     L     zero_exponent  hardware
==============  ====  ====  =============  =====================================================================
``sm90_wgmma``  25    16    -133           Hopper (H100/H200): ``wgmma m64nNk16`` and ``mma.sync m16n8k16``
``sm80_mma``    24    8     -132           Ampere (A100) and Ada: ``mma.sync m16n8k16`` in two k8 halves
==============  ====  ====  =============  =====================================================================

Here the terms are held in float64: a product of two FP32 values is exact there (48 significand bits), the
truncated terms are integers times ``2^(e_max - F)`` below ``2^(F + 2)``, so their sum of at most 17 terms is exact
in any order, and the final rounding toward zero is an RNE cast corrected by one step toward zero where it went
away from zero. The scale factors are powers of two built from their bits (exact on every device, where
``torch.ldexp``/``pow`` need not be). Non-finite inputs are not modelled bit for bit (they propagate as inf/NaN).

The operands are FP32 tensors holding low-precision values (``a_format``/``b_format`` give their format's exponent
floor);
the model is also defined, and used, for FP32 operands that are not on the low-precision grid (a policy with a GEMM
operand's rounding site off), which no hardware instruction computes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

#: Exponent floor of the operand formats (the exponent of their smallest normal number).
_EXPONENT_FLOOR = {"bfloat16": -126, "float16": -14, "float32": -126}
_FP32_EXPONENT_FLOOR = -126

#: Upper bound on the float64 products of one slab (``[slab, M, N, L]``): the working memory of
#: :func:`tensor_core_matmul` is a few times 8·SLAB_ELEMENTS bytes for the slab, plus the operands' alignment
#: exponents and the output (0.6 GiB above its 128 MiB of inputs measured for 4096 GEMMs of 64 × 64 × 64).
SLAB_ELEMENTS = 1 << 23


@dataclasses.dataclass(frozen=True)
class TensorCoreModel:
    """One tensor-core accumulation model: ``fraction_bits`` F, ``block`` L products per step, the alignment
    exponent of a zero term."""

    name: str
    fraction_bits: int
    block: int
    zero_exponent: int


#: The ``gemm_model`` values other than ``"fp32"`` (plain FP32 GEMMs in any order) and their parameters.
GEMM_MODELS = {
    "sm90_wgmma": TensorCoreModel("sm90_wgmma", fraction_bits=25, block=16, zero_exponent=-133),
    "sm80_mma": TensorCoreModel("sm80_mma", fraction_bits=24, block=8, zero_exponent=-132),
}


def model(name: str) -> TensorCoreModel:
    """The :class:`TensorCoreModel` of a ``gemm_model`` name (not ``"fp32"``)."""
    try:
        return GEMM_MODELS[name]
    except KeyError:
        raise ValueError(f"gemm_model {name!r} has no tensor-core model; models: {sorted(GEMM_MODELS)}") from None


def alignment_exponent(x: torch.Tensor, floor: int, zero_exponent: int) -> torch.Tensor:
    """``floor(log2|x|)`` clamped below at ``floor``; ``zero_exponent`` where x is zero. int32, x's shape."""
    _, exponent = torch.frexp(x)  # x = m·2^exponent, 0.5 <= |m| < 1
    exponent = torch.clamp(exponent.to(torch.int32) - 1, min=floor)
    return torch.where(x == 0, torch.full_like(exponent, zero_exponent), exponent)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``2^exponent`` as float64, built from its bits: exact on every device. exponent: int32 in [-1022, 1023]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def round_toward_zero_fp32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded toward zero (subnormals kept); magnitudes of 2^128 or more become ±inf (MMA-Sim's
    truncate-then-scale); ``-0`` becomes ``+0``."""
    nearest = x.to(torch.float32)
    away = nearest.to(torch.float64).abs() > x.abs()
    result = torch.where(away, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)
    result = torch.where(x.abs() >= 2.0 ** 128, nearest, result)  # the cast's ±inf
    return result + 0.0


def fused_dot_add(products: torch.Tensor, product_exponents: torch.Tensor, c: torch.Tensor,
                  tc: TensorCoreModel) -> torch.Tensor:
    """One step: ``c + Σ_k products[..., k]`` under the model.

    Args:
        products (Tensor): ``[..., L]`` float64, exact products. product_exponents (Tensor): ``[..., L]`` int32,
            their alignment exponents (zero products already at ``tc.zero_exponent``).
        c (Tensor): ``[...]`` float32, the accumulator.

    Returns:
        Tensor: ``[...]`` float32.
    """
    c_exponent = alignment_exponent(c, _FP32_EXPONENT_FLOOR, tc.zero_exponent)
    e_max = torch.maximum(product_exponents.amax(dim=-1), c_exponent)
    scale_exponent = tc.fraction_bits - e_max  # terms · 2^scale_exponent are integers after truncation
    scale = pow2(scale_exponent)
    total = torch.trunc(products * scale[..., None]).sum(dim=-1) + torch.trunc(c.to(torch.float64) * scale)
    return round_toward_zero_fp32(total * pow2(-scale_exponent))


def tensor_core_matmul(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], gemm_model: str,
                       a_format: str, b_format: Optional[str] = None) -> torch.Tensor:
    """``c + a @ b`` (``a @ b`` when ``c`` is None: a cleared GEMM) accumulated as ``gemm_model`` says.

    Args:
        a (Tensor): ``[..., M, K]`` float32. b (Tensor): ``[..., K, N]`` float32; the leading dims of ``a``, ``b``
            (and ``c``) broadcast.
        c (Tensor | None): ``[..., M, N]`` float32, the accumulator the GEMM adds into.
        gemm_model (str): a key of :data:`GEMM_MODELS`.
        a_format, b_format (str): ``"bfloat16"``, ``"float16"`` or ``"float32"``: the format each operand's values
            are on (it sets the exponent floor of step 1); ``b_format`` defaults to ``a_format``.

    Returns:
        Tensor: ``[..., M, N]`` float32.
    """
    tc = model(gemm_model)
    for name, x in (("a", a), ("b", b)) + ((("c", c),) if c is not None else ()):
        if x.dtype != torch.float32:
            raise TypeError(f"tensor_core_matmul: {name} must be float32 (an FP32 accumulator model), got {x.dtype}")
    b_format = a_format if b_format is None else b_format
    for name, fmt in (("a_format", a_format), ("b_format", b_format)):
        if fmt not in _EXPONENT_FLOOR:
            raise ValueError(f"{name} must be one of {sorted(_EXPONENT_FLOOR)}, got {fmt!r}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"tensor_core_matmul: a {tuple(a.shape)} and b {tuple(b.shape)} do not chain (K differs)")
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2], c.shape[:-2] if c is not None else ())
    if M * N * K == 0 or 0 in batch:  # an empty GEMM: the accumulator as it is (or zeros)
        out_shape = batch + (M, N)
        return torch.zeros(out_shape, dtype=torch.float32, device=a.device) if c is None else \
            c.expand(out_shape).clone()
    a = a.expand(batch + (M, K)).reshape(-1, M, K)
    b = b.expand(batch + (K, N)).reshape(-1, K, N)
    acc = (torch.zeros(a.shape[0], M, N, dtype=torch.float32, device=a.device) if c is None
           else c.expand(batch + (M, N)).reshape(-1, M, N))
    a_exp = alignment_exponent(a, _EXPONENT_FLOOR[a_format], 0)
    b_exp = alignment_exponent(b, _EXPONENT_FLOOR[b_format], 0)
    step = min(tc.block, K)
    slab = max(1, SLAB_ELEMENTS // max(1, M * N * step))
    out = []
    for start in range(0, a.shape[0], slab):
        rows = slice(start, start + slab)
        part = acc[rows]
        for k0 in range(0, K, step):
            ks = slice(k0, min(k0 + step, K))
            a_k, b_k = a[rows, :, ks].to(torch.float64), b[rows, ks, :].to(torch.float64)
            products = a_k[:, :, None, :] * b_k.transpose(1, 2)[:, None, :, :]  # [slab, M, N, L]
            exponents = a_exp[rows, :, None, ks] + b_exp[rows, ks, :].transpose(1, 2)[:, None, :, :]
            exponents = torch.where(products == 0, torch.full_like(exponents, tc.zero_exponent), exponents)
            part = fused_dot_add(products, exponents, part, tc)
        out.append(part)
    return torch.cat(out).reshape(batch + (M, N))
