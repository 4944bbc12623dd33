"""The torch rounding primitive against an exact rational RNE, on ties, near-ties, subnormals, overflow and NaN."""

import math
from fractions import Fraction

import pytest
import torch

from mimo_numerics.rounding import round_sum_to_lp, round_to_lp

FORMATS = {"bfloat16": (8, -126, 127), "float16": (11, -14, 15)}  # significand bits, emin, emax


def exact_rne(value: Fraction, fmt: str) -> float:
    """Round an exact rational to the format with round-to-nearest-even (independent of torch)."""
    bits, emin, emax = FORMATS[fmt]
    if value == 0:
        return 0.0
    sign = -1.0 if value < 0 else 1.0
    mag = abs(value)
    exp = mag.numerator.bit_length() - mag.denominator.bit_length()
    while Fraction(2) ** exp > mag:
        exp -= 1
    while Fraction(2) ** (exp + 1) <= mag:
        exp += 1
    quantum = Fraction(2) ** (max(exp, emin) - bits + 1)
    n = math.floor(mag / quantum)
    rest = mag / quantum - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    result = n * quantum
    if result >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(result)


def _tie_cases(fmt):
    """Values at, just above and just below halfway points, as float64 numbers."""
    bits, emin, emax = FORMATS[fmt]
    out = []
    for exp in (0, -3, 5, emin, emin - 3, emax):  # normal, subnormal and top binades
        ulp = 2.0 ** (max(exp, emin) - bits + 1)
        for base_mult in (1, 2, 3):
            lo = 2.0 ** exp + base_mult * ulp if exp >= emin else base_mult * ulp
            tie = lo + ulp / 2
            for nudge in (0.0, 2.0 ** -22, -(2.0 ** -22), 2.0 ** -40, -(2.0 ** -40)):
                out.append(tie + nudge * ulp)
    top = float(torch.finfo(getattr(torch, fmt)).max)
    half_ulp_top = 2.0 ** (emax - bits)
    out += [top, top + half_ulp_top, top + half_ulp_top * (1 - 2.0 ** -30), top + half_ulp_top * (1 + 2.0 ** -30)]
    return out + [-x for x in out]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_to_lp_from_float64_is_correctly_rounded_at_ties(fmt):
    values = _tie_cases(fmt)
    x = torch.tensor(values, dtype=torch.float64)
    got = round_to_lp(x, fmt).tolist()
    want = [exact_rne(Fraction(v), fmt) for v in values]
    assert got == want


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_to_lp_from_float32_is_correctly_rounded_at_ties(fmt):
    values = [v for v in _tie_cases(fmt) if abs(v) < 3e38 and float(torch.tensor(v, dtype=torch.float32)) == v]
    assert len(values) > 20
    x = torch.tensor(values, dtype=torch.float32)
    assert round_to_lp(x, fmt).tolist() == [exact_rne(Fraction(v), fmt) for v in values]


def test_round_to_lp_fixes_torch_double_rounding_from_float64():
    x = torch.tensor([1 + 2 ** -8 + 2 ** -30], dtype=torch.float64)
    assert x.to(torch.bfloat16).item() == 1.0  # torch rounds twice (float64 -> float32 -> bfloat16)
    assert round_to_lp(x, "bfloat16").item() == 1.0078125
    # the same trap in float16 subnormals: 2**-25 + 2**-50 must round up to the smallest subnormal 2**-24
    y = torch.tensor([2.0 ** -25 + 2.0 ** -50], dtype=torch.float64)
    assert round_to_lp(y, "float16").item() == 2.0 ** -24


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_to_lp_random_values_match_exact_rne(fmt, dtype):
    gen = torch.Generator().manual_seed(7)
    mant = torch.rand(600, generator=gen, dtype=torch.float64) * 2 - 1
    expo = torch.randint(-150, 128, (600,), generator=gen).to(torch.float64)
    x = (mant * torch.pow(2.0, expo)).to(dtype)
    got = round_to_lp(x, fmt)
    want = [exact_rne(Fraction(v), fmt) for v in x.tolist()]
    assert got.dtype == dtype
    assert got.tolist() == want


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_to_lp_special_values(fmt):
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e300, -1e300], dtype=torch.float64)
    got = round_to_lp(x, fmt)
    assert math.isnan(got[0].item())
    assert got[1:3].tolist() == [math.inf, -math.inf]
    assert torch.equal(torch.signbit(got[3:5]), torch.tensor([False, True]))
    assert got[5:].tolist() == [math.inf, -math.inf]
    assert math.isnan(round_to_lp(x.float(), fmt)[0].item())


def test_round_to_lp_rejects_bad_formats_and_dtypes():
    with pytest.raises(ValueError, match="fmt"):
        round_to_lp(torch.ones(2), "float8")
    with pytest.raises(TypeError, match="float32 or float64"):
        round_to_lp(torch.ones(2, dtype=torch.bfloat16))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_sum_to_lp_rounds_the_exact_sum_once(fmt, dtype):
    """acc + a·b with a, b, acc in lp: the fused (fma) diagonal step, checked against exact rationals."""
    gen = torch.Generator().manual_seed(3)
    lp = getattr(torch, fmt)
    acc = (torch.randn(3000, generator=gen) * 4).to(lp).to(dtype)
    a = torch.randn(3000, generator=gen).to(lp).to(dtype)
    b = (torch.randn(3000, generator=gen) * 2.0 ** -9).to(lp).to(dtype)
    prod = a * b  # exact: at most 22 significant bits
    got = round_sum_to_lp(acc, prod, fmt).tolist()
    want = [exact_rne(Fraction(x) + Fraction(y), fmt) for x, y in zip(acc.tolist(), prod.tolist())]
    assert got == want


def test_round_sum_to_lp_constructed_double_rounding_case():
    acc = torch.tensor([1.0, 1.0, -1.0])
    prod = torch.tensor([2.0 ** -8 + 2.0 ** -30, 2.0 ** -8 - 2.0 ** -30, -(2.0 ** -8 + 2.0 ** -30)])
    assert round_sum_to_lp(acc, prod).tolist() == [1.0078125, 1.0, -1.0078125]
    assert round_to_lp(acc + prod).tolist() == [1.0, 1.0, -1.0]  # one float32 rounding too many
    with pytest.raises(TypeError, match="same dtype"):
        round_sum_to_lp(acc, prod.double())


def test_fma_fp32_rounds_once():
    """fma_fp32 against exact rational arithmetic: random draws with cancellation, and the float64 midpoints where
    a product-then-cast (two roundings) goes wrong."""
    from fractions import Fraction

    from mimo_numerics.rounding import fma_fp32

    def exact(a, b, c):  # the float32 nearest a·b + c (ties to even), by search around the float64 value
        value = Fraction(a) * Fraction(b) + Fraction(c)
        x = torch.tensor(float(value), dtype=torch.float32)
        near = [x, torch.nextafter(x, torch.tensor(float("inf"))), torch.nextafter(x, torch.tensor(float("-inf")))]
        return min(near, key=lambda v: (abs(Fraction(v.item()) - value), int(v.view(torch.int32)) & 1)).item()

    g = torch.Generator().manual_seed(3)
    a = torch.randn(3000, generator=g) * torch.exp2(torch.randint(-30, 30, (3000,), generator=g).float())
    b = torch.randn(3000, generator=g)
    c = -(a.double() * b.double()).float() * (1 + torch.randn(3000, generator=g) * 1e-5)
    # the midpoint cases: the float64 sum lands halfway between two float32 numbers, the exact sum does not
    a = torch.cat([a, torch.tensor([-(1 + 2 ** -23), 1 + 2 ** -23])])
    b = torch.cat([b, torch.tensor([2 ** -24 * (1 - 2 ** -23), -2 ** -24 * (1 - 2 ** -23)])])
    c = torch.cat([c, torch.tensor([1 + 2 ** -23, -(1 + 2 ** -23)])])
    got = fma_fp32(a, b, c)
    want = torch.tensor([exact(x, y, z) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    naive = (a.double() * b.double() + c.double()).float()
    assert not torch.equal(naive[-2:], got[-2:])  # the two constructed cases defeat the double rounding
    # the overflow midpoint: the float64 sum is 2^128 − 2^103 (casts to inf), the exact sum is just below it
    a, b, c = (torch.tensor([v, -v]) for v in (18631 * 2.0 ** 64, 1801 * 2.0 ** 39, -(2.0 ** -149)))
    b = b.abs()
    assert fma_fp32(a, b, c).tolist() == [torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max]
