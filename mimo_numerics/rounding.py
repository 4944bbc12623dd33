"""The torch rounding primitive: correctly rounded round-to-nearest-even to bfloat16 or float16.

Every rounding of the reference goes through ``round_to_lp`` (or ``round_sum_to_lp``). Both return values on the
low-precision grid, held in the source dtype (float32 or float64), so the computation can carry on in the math dtype.

Why not ``x.to(torch.bfloat16)``: from float32 that cast is a correct single RNE rounding, but from float64 torch
rounds twice (float64 -> float32 -> bfloat16): ``1 + 2**-8 + 2**-30`` becomes 1.0, where the correct result is
1.0078125. Here a float64 source is first rounded to float32 *to odd* (truncate, then set the last bit when inexact),
which keeps enough information for the final RNE step to be correct (float32 has at least 13 more significand bits
than either target).

``round_sum_to_lp(a, b)`` rounds the exact sum a + b once, as a fused multiply-add rounds ``acc + x·y`` when x·y is
exact: the sum is split into its rounded value and its exact error (TwoSum), and the error decides exact ties.
Everything runs on any torch device with float32 support; float64 is used only when the source is float64.

``round_to_lp_`` and ``round_sum_to_lp_`` are in-place variants with the same values, for the CPU path of the
reference (``reference_cpu``); the latter computes the TwoSum error only at the few elements where it can change the
result.
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np
import torch

_LP = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _lp_dtype(fmt) -> torch.dtype:
    if isinstance(fmt, torch.dtype):
        if fmt not in (torch.bfloat16, torch.float16):
            raise ValueError(f"fmt must be torch.bfloat16 or torch.float16, got {fmt}")
        return fmt
    try:
        return _LP[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"fmt must be 'bfloat16' or 'float16', got {fmt!r}") from None


def _round_f64_to_f32_odd(x: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
    """Round the exact value ``x + residual`` (float64, |residual| tiny) to float32 with round-to-odd."""
    t = x.to(torch.float32)
    back = t.to(torch.float64)
    # sign of (exact value - t); (x - back) is exact, and the sign of a rounded sum is the sign of the exact sum
    delta = x - back
    if residual is not None:
        delta = delta + residual
    finite = torch.isfinite(x) & torch.isfinite(t)
    # t was rounded away from zero when the exact value lies between t and zero: truncate it
    away = finite & (delta != 0) & (torch.sign(delta) != torch.sign(back)) & (back != 0)
    t = torch.where(away, torch.nextafter(t, torch.zeros_like(t)), t)
    # x beyond the float32 range: truncation gives the largest finite value (odd), not inf
    big = torch.isfinite(x) & ~torch.isfinite(t)
    t = torch.where(big, torch.copysign(torch.full_like(t, torch.finfo(torch.float32).max), t), t)
    back = t.to(torch.float64)
    delta = x - back
    if residual is not None:
        delta = delta + residual
    inexact = torch.isfinite(x) & (delta != 0)
    bits = t.view(torch.int32)
    bits = torch.where(inexact, bits | 1, bits)
    # a tiny inexact value truncated to zero keeps the sign of the exact value
    zero_inexact = inexact & (back == 0)
    sign_neg = torch.where(x != 0, x < 0, delta < 0)
    bits = torch.where(zero_inexact, torch.where(sign_neg, torch.full_like(bits, -2147483647), bits), bits)
    return bits.view(torch.float32)


def _round_f32_with_residual(x: torch.Tensor, residual: torch.Tensor, lp: torch.dtype,
                             rounded: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RNE of the exact value ``x + residual`` (float32, |residual| <= half an ulp of x) to ``lp``, as float32.

    Rounding x alone is right unless x lies exactly halfway between two ``lp`` values: then the residual's sign
    picks the neighbour (ties are float32 numbers with trailing zero bits, so no non-tie x can cross one).
    ``rounded`` is ``x.to(lp).to(torch.float32)`` when the caller has it already.
    """
    r = x.to(lp).to(torch.float32) if rounded is None else rounded
    diff = x - r  # exact; r lies on the side of -sign(diff) from x
    other = r + 2 * diff  # the other neighbour when x is exactly halfway (NaN when r overflowed)
    tie = (other.to(lp).to(torch.float32) == other) & (diff != 0) & (residual != 0)
    # a residual pointing the same way as diff moves the exact value past the tie, away from r
    out = torch.where(tie & ((residual > 0) == (diff > 0)), other, r)
    # overflow boundary: x exactly halfway between the largest finite value and 2**(emax+1) rounds to inf under
    # RNE; a residual toward zero makes the exact value round to the largest finite value instead
    at_overflow = (x.abs() == _overflow_threshold(lp)) & (residual != 0) & ((residual > 0) != (x > 0))
    return torch.where(at_overflow, torch.copysign(torch.full_like(x, float(torch.finfo(lp).max)), x), out)


def _overflow_threshold(lp: torch.dtype) -> float:
    """Halfway point between the largest finite ``lp`` value and the next power of two (rounds to inf)."""
    info = torch.finfo(lp)
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10}[lp]
    return float(info.max) + 2.0 ** (_exponent(float(info.max)) - mantissa_bits - 1)


def _exponent(value: float) -> int:
    import math

    return math.frexp(value)[1] - 1


def round_to_lp(x: torch.Tensor, fmt="bfloat16", residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Round ``x`` (plus an optional tiny exact ``residual``) to ``fmt`` with one RNE rounding.

    Args:
        x (Tensor): float32 or float64 values, any shape and device.
        fmt (str | torch.dtype): ``"bfloat16"`` or ``"float16"``.
        residual (Tensor, optional): same shape and dtype as ``x``; the exact value to round is ``x + residual``,
            with ``|residual|`` at most half an ulp of ``x`` in x's dtype (as TwoSum produces).

    Returns:
        Tensor: same dtype as ``x``, every value representable in ``fmt`` (NaN stays NaN, overflow gives ±inf).
    """
    lp = _lp_dtype(fmt)
    if x.dtype == torch.float32:
        if residual is None:
            return x.to(lp).to(torch.float32)
        return _round_f32_with_residual(x, residual, lp)
    if x.dtype == torch.float64:
        return _round_f64_to_f32_odd(x, residual).to(lp).to(torch.float64)
    raise TypeError(f"x must be float32 or float64, got {x.dtype}")


def two_sum(a: torch.Tensor, b: torch.Tensor):
    """Knuth's TwoSum: ``s = fl(a + b)`` and the exact error ``e`` with ``a + b = s + e`` (same dtype)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)  # NaN when s is not finite; the rounding ignores it there
    return s, e


def round_sum_to_lp(a: torch.Tensor, b: torch.Tensor, fmt="bfloat16") -> torch.Tensor:
    """``rnd(a + b)`` with the exact sum rounded once to ``fmt`` (no intermediate float32/float64 rounding).

    This is the fused ``acc + x·y`` step of the diagonal under ``diag_mode="fma"`` when ``b = x·y`` is exact.
    """
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    s, e = two_sum(a, b)
    return round_to_lp(s, fmt, residual=e)


def fma_fp32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a·b + c`` rounded once to float32 (round to nearest even), as a hardware FP32 FMA: float32 in and out.

    The product is exact in float64 (48 bits); the sum is split into its float64 value and exact error (TwoSum), and
    the error decides the one case a float64 → float32 cast can get wrong: a float64 sum exactly halfway between two
    float32 neighbours while the exact sum is not.
    """
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x.dtype != torch.float32:
            raise TypeError(f"fma_fp32: {name} must be float32, got {x.dtype}")
    s, e = two_sum(a.double() * b.double(), c.double())
    r = s.to(torch.float32)
    gap = s - r.double()  # exact: r is within one float32 ulp of s
    inf = torch.full_like(r, float("inf"))
    neighbour = torch.nextafter(r, torch.where(gap > 0, inf, -inf))  # the float32 on s's side of r
    spacing = (neighbour.double() - r.double()).abs()
    halfway = (gap != 0) & (gap.abs() * 2 == spacing) & torch.isfinite(r)
    # at a midpoint the cast rounded to even; the exact sum s + e lies on e's side of it
    r = torch.where(halfway & (e != 0) & ((e > 0) == (gap > 0)), neighbour, r)
    # the overflow midpoint 2^128 − 2^103 casts to ±inf; an exact sum just inside it rounds to ±FLT_MAX
    edge = (s.abs() == 2.0 ** 128 - 2.0 ** 103) & (e != 0) & ((e > 0) != (s > 0))
    return torch.where(edge, torch.copysign(torch.full_like(r, torch.finfo(torch.float32).max), r), r)


# ---------------------------------------------------------------------------------------------- in-place variants
def round_to_lp_(x: torch.Tensor, fmt="bfloat16") -> torch.Tensor:
    """In-place ``round_to_lp``: ``x`` (float32 or float64, writable) takes the values ``round_to_lp(x, fmt)``.

    Returns:
        Tensor: x.
    """
    lp = _lp_dtype(fmt)
    if x.dtype == torch.float32:
        return x.copy_(x.to(lp))
    if x.dtype == torch.float64:
        return x.copy_(_round_f64_to_f32_odd(x, None).to(lp))  # lp -> float64 is exact
    raise TypeError(f"x must be float32 or float64, got {x.dtype}")


def _tie_candidates(s: torch.Tensor, rounded: torch.Tensor, lp: torch.dtype) -> torch.Tensor:
    """Flat (row-major) indices of a superset of the float32 values of ``s`` (contiguous, CPU) that lie exactly
    halfway between two ``lp`` values or at the overflow threshold, found from their bits: a bfloat16 midpoint has
    low half 0x8000; a float16 midpoint (normal, subnormal or the threshold) has 12 trailing zero bits and is not a
    float16 value."""
    if lp == torch.bfloat16:
        low = s.numpy().reshape(-1).view(np.int16)  # the low half of each float32 (little-endian)
        low = low[0::2] if sys.byteorder == "little" else low[1::2]
        return torch.from_numpy(np.flatnonzero(low == np.int16(-0x8000)))
    maybe = ((s.view(torch.int32) & 0xFFF) == 0) & (s != rounded)
    return torch.from_numpy(np.flatnonzero(maybe.numpy().reshape(-1)))


def round_sum_to_lp_(a: torch.Tensor, b: torch.Tensor, fmt="bfloat16") -> torch.Tensor:
    """In-place ``round_sum_to_lp``: ``a`` takes the values ``round_sum_to_lp(a, b, fmt)`` (b broadcasts to a).

    On float32 CPU tensors the exact error of the sum is computed only where it can matter: rounding the float32
    sum ``s = fl(a + b)`` alone is already right unless s is an lp midpoint (``_round_f32_with_residual``), so the
    TwoSum error and the tie resolution run on those few elements only; the other elements take ``s`` rounded, as
    ``round_sum_to_lp`` gives them. Elsewhere this is ``a.copy_(round_sum_to_lp(a, b, fmt))``.

    Returns:
        Tensor: a.
    """
    lp = _lp_dtype(fmt)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.dtype != torch.float32 or a.device.type != "cpu":
        return a.copy_(round_sum_to_lp(a, b, fmt))
    s = (a + b).contiguous()
    rounded = s.to(lp)
    ties = _tie_candidates(s, rounded, lp)
    if ties.numel():  # the same elementwise TwoSum as round_sum_to_lp, on the candidates only
        a_tie, b_tie, s_tie = a.take(ties), b.expand_as(a).take(ties), s.take(ties)
    a.copy_(rounded)
    if ties.numel():
        # the rounded values are taken from the whole-tensor conversion: converting a few lp values on their own
        # can give other NaN payloads (the scalar tail of torch's float16 -> float32 kernel)
        _, error = two_sum(a_tie, b_tie)
        a.put_(ties, _round_f32_with_residual(s_tie, error, lp, rounded=a.take(ties)))
    return a
