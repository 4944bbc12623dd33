"""Random tensors whose bits are the same on every machine.

Test inputs must not depend on the CPU model, the thread count or the torch build. ``torch.randn`` does: its CPU
sampler runs Box-Muller with vectorised ``log``/``cos``/``sin`` whose last bits differ between instruction sets
(an AVX2 build and an AVX-512 build of the same torch give different ``randn`` bits for some elements, and
``ATEN_CPU_CAPABILITY=default`` differs again), and ``softplus`` on float32 rounds differently under AVX2 and AVX-512
(measured: 2 of 2000 ``dt`` values of a stage-1 case). Everything here is built from operations whose results are
exactly specified:

* the generator's bits: ``torch.randint(0, 2**24, ..., generator=gen)`` (one 32-bit Mersenne-Twister output per
  element, taken serially; no vectorised path);
* integer arithmetic and bit manipulation;
* correctly rounded IEEE-754 float64 operations (``+ - * /``, ``sqrt``, ``round``, ``frexp``), each a separate torch
  op in a fixed order, so no fused multiply-add can be contracted in.

Transcendentals (``log``, ``exp``, ``sin``, ``cos``) are therefore evaluated here by range reduction and fixed
polynomials in float64 (:func:`exp`, :func:`log`, :func:`sincos_2pi`): accurate to a few float64 ulp, and, more to the
point, the same bits everywhere. Values are rounded to float32 (or lower) only at the end, by IEEE casts.

Functions: :func:`uniform` (``U[0, 1)`` on the grid ``k / 2**24``, exact in float32), :func:`normal` (Box-Muller on
those uniforms, ``|x| <= 5.77``), :func:`softplus`, :func:`exp`, :func:`log`, :func:`log1p`, :func:`sincos_2pi`.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch

_F64 = torch.float64
#: Bits of every uniform: ``k / 2**UNIFORM_BITS`` with ``0 <= k < 2**UNIFORM_BITS`` (exact in float32).
UNIFORM_BITS = 24
_LN2 = math.log(2.0)
# Cody-Waite split of ln 2: _LN2_HI has 11 trailing zero bits, so k·_LN2_HI is exact for |k| < 2**11.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SQRT_HALF = math.sqrt(0.5)
# Horner coefficients, highest order first (Python floats: the correctly rounded doubles of the exact rationals).
_LOG_ODD = tuple(1.0 / (2 * k + 1) for k in range(12, -1, -1))      # atanh series: 1/25, ..., 1/3, 1
_LOG1P_ODD = tuple(1.0 / (2 * k + 1) for k in range(20, -1, -1))    # to s**41 for s <= 1/3
_EXP_TAYLOR = tuple(1.0 / math.factorial(n) for n in range(20, -1, -1))  # 1/20!, ..., 1/1!, 1
_SIN_TAYLOR = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(10, -1, -1))
_COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(10, -1, -1))


def _horner(x: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """``c0·x^n + ... + cn`` by Horner's rule, one IEEE multiply and one add per step (never fused)."""
    acc = torch.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        acc = acc * x
        acc = acc + c
    return acc


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``2.0 ** exponent`` for integer ``exponent`` in [-1022, 1023], built from its bits (exact)."""
    e = exponent.to(torch.int64)
    if bool(((e < -1022) | (e > 1023)).any()):
        raise ValueError("exponent out of the normal float64 range [-1022, 1023]")
    return ((e + 1023) << 52).view(_F64)


def _check_f64(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != _F64:
        raise TypeError(f"{name} must be a float64 tensor, got "
                        f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")


def log(x: torch.Tensor) -> torch.Tensor:
    """Natural logarithm of a positive float64 tensor, machine-independent.

    ``x = m·2**e`` with ``m`` in ``[√½, √2)`` (``frexp``, exact); ``log m = 2·atanh(s)``, ``s = (m-1)/(m+1)``
    (``|s| <= 0.172``), by its odd series to ``s**25``; ``log x = log m + e·ln 2``.

    Raises:
        TypeError: if ``x`` is not float64. ValueError: if any element is not finite and positive.
    """
    _check_f64("x", x)
    if not bool(((x > 0) & torch.isfinite(x)).all()):
        raise ValueError("log needs finite positive values")
    mantissa, exponent = torch.frexp(x)  # mantissa in [0.5, 1)
    low = mantissa < _SQRT_HALF
    mantissa = torch.where(low, mantissa * 2.0, mantissa)
    exponent = torch.where(low, exponent - 1, exponent).to(_F64)
    s = (mantissa - 1.0) / (mantissa + 1.0)
    series = _horner(s * s, _LOG_ODD)
    return (2.0 * s) * series + exponent * _LN2


def exp(x: torch.Tensor) -> torch.Tensor:
    """``e**x`` of a float64 tensor with ``|x| <= 700``, machine-independent.

    ``k = round(x / ln 2)``, ``r = x - k·ln 2`` (``|r| <= 0.35``), ``e**r`` by its Taylor series to ``r**20``, times
    ``2**k`` built from bits.

    Raises:
        TypeError: if ``x`` is not float64. ValueError: if any ``|x| > 700`` or is not finite.
    """
    _check_f64("x", x)
    if not bool((torch.isfinite(x) & (x.abs() <= 700.0)).all()):
        raise ValueError("exp needs finite values with |x| <= 700")
    k = torch.round(x / _LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    return _horner(r, _EXP_TAYLOR) * _pow2(k)


def sincos_2pi(u: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(sin 2πu, cos 2πu)`` of a float64 tensor of dyadic fractions (such as :func:`uniform`), machine-independent.

    ``q = round(4u)`` and ``f = u - q/4`` are exact for dyadic ``u`` (``|f| <= 1/8``); ``a = 2π·f`` (``|a| <= π/4``)
    goes through the Taylor series of sin and cos to degree 21 / 20; the quadrant ``q mod 4`` swaps and negates.

    Raises:
        TypeError: if ``u`` is not float64. ValueError: if any ``|u| > 2**20``.
    """
    _check_f64("u", u)
    if not bool((u.abs() <= 2.0 ** 20).all()):
        raise ValueError("sincos_2pi needs |u| <= 2**20")
    q = torch.round(u * 4.0)
    a = (u - q * 0.25) * (2.0 * math.pi)
    a2 = a * a
    sin_a = _horner(a2, _SIN_TAYLOR) * a
    cos_a = _horner(a2, _COS_TAYLOR)
    quadrant = torch.remainder(q.to(torch.int64), 4)
    sin = torch.where(quadrant == 0, sin_a, torch.where(quadrant == 1, cos_a,
                                                        torch.where(quadrant == 2, -sin_a, -cos_a)))
    cos = torch.where(quadrant == 0, cos_a, torch.where(quadrant == 1, -sin_a,
                                                        torch.where(quadrant == 2, -cos_a, sin_a)))
    return sin, cos


def log1p(t: torch.Tensor) -> torch.Tensor:
    """``log(1 + t)`` of a float64 tensor with ``0 <= t <= 1``, machine-independent.

    ``log(1 + t) = 2·atanh(s)`` with ``s = t / (2 + t) <= 1/3``, by its odd series to ``s**41`` (no ``1 + t`` is
    formed, so small ``t`` keeps its relative accuracy).

    Raises:
        TypeError: if ``t`` is not float64. ValueError: if any element is outside ``[0, 1]``.
    """
    _check_f64("t", t)
    if not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError("log1p here needs 0 <= t <= 1")
    s = t / (t + 2.0)
    return (2.0 * s) * _horner(s * s, _LOG1P_ODD)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + e**x) = max(x, 0) + log1p(e**-|x|)`` of a float64 tensor with ``|x| <= 700``, machine-independent."""
    _check_f64("x", x)
    return torch.clamp(x, min=0.0) + log1p(exp(-x.abs()))


def _check_shape(shape) -> Tuple[int, ...]:
    shape = tuple(shape)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    return shape


def _codes(count: int, gen: torch.Generator) -> torch.Tensor:
    if not isinstance(gen, torch.Generator) or gen.device.type != "cpu":
        raise TypeError("gen must be a CPU torch.Generator")
    return torch.randint(0, 2 ** UNIFORM_BITS, (count,), generator=gen, dtype=torch.int64)


def uniform(shape, gen: torch.Generator) -> torch.Tensor:
    """``U[0, 1)`` as float64 on the grid ``k / 2**24`` (every value exact in float32), from ``gen``'s bits.

    Args:
        shape (tuple of int): the shape. gen (torch.Generator): a CPU generator; one 32-bit draw per element.
    """
    shape = _check_shape(shape)
    return (_codes(math.prod(shape), gen).to(_F64) * 2.0 ** -UNIFORM_BITS).view(shape)


def normal(shape, gen: torch.Generator) -> torch.Tensor:
    """Standard normal draws as float64, Box-Muller on :func:`uniform` pairs, the same bits on every machine.

    Pairs ``(u1, u2)`` of consecutive uniforms give ``ρ·cos 2πu2`` and ``ρ·sin 2πu2`` (in that order) with
    ``ρ = sqrt(-2·log(1 - u1))``; an odd element count drops the last sine. The 24-bit grid bounds the draws by
    ``sqrt(48·ln 2) ≈ 5.77``.

    Args:
        shape (tuple of int): the shape. gen (torch.Generator): a CPU generator; one 32-bit draw per element (two
            per pair).
    """
    shape = _check_shape(shape)
    count = math.prod(shape)
    pairs = -(-count // 2)
    codes = _codes(2 * pairs, gen).view(pairs, 2).to(_F64) * 2.0 ** -UNIFORM_BITS
    radius = torch.sqrt(0.0 - 2.0 * log(1.0 - codes[:, 0]))  # "0 -" keeps ρ = +0 at u1 = 0
    sin, cos = sincos_2pi(codes[:, 1])
    values = torch.stack([radius * cos, radius * sin], dim=1).reshape(-1)
    return values[:count].reshape(shape)
