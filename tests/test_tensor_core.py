"""The tensor-core accumulation models (``mimo_numerics.tensor_core``) against their definition, MMA-Sim.

``mmasim`` (MMA-Sim, pinned in requirements-ci.txt) simulates one instruction's dot-add element by element; the
package's vectorised GEMM must give its bits on every element, for both models, both lp formats, several depths
(one step, several steps, a partial last step) and inputs that stress each part of the model: exponents far apart
(alignment truncation), zeros (the zero exponent), fp16 subnormals (the exponent floor), an accumulator that
cancels the products, an fp32-subnormal accumulator and results in the fp32 subnormal range.
"""

import mmasim.nv_ptx as mmasim_ptx
import pytest
import torch

from mimo_numerics import tensor_core
from mimo_numerics.tensor_core import round_toward_zero_fp32, tensor_core_matmul

LP = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: The MMA-Sim instruction each model is (its dot-add depth is the model's block).
INSTRUCTION = {
    ("sm90_wgmma", "bfloat16"): lambda: mmasim_ptx.WGMMA("Hopper", "m64n8k16.f32.bf16.bf16"),
    ("sm90_wgmma", "float16"): lambda: mmasim_ptx.WGMMA("Hopper", "m64n8k16.f32.f16.f16"),
    ("sm80_mma", "bfloat16"): lambda: mmasim_ptx.MMA("Ampere", "m16n8k16.f32.bf16.bf16.f32"),
    ("sm80_mma", "float16"): lambda: mmasim_ptx.MMA("Ampere", "m16n8k16.f32.f16.f16.f32"),
}


def _draw(shape, fmt, spread, generator, zeros=0.05):
    """lp values m·2^e, e uniform in [-spread, spread], a fraction of exact zeros."""
    mantissa = torch.randn(shape, generator=generator)
    exponent = torch.randint(-spread, spread + 1, shape, generator=generator).float()
    x = (mantissa * torch.exp2(exponent)).to(LP[fmt])
    x[torch.rand(shape, generator=generator) < zeros] = 0
    return x


def _accumulators(a, b, spread, generator):
    """fp32 accumulators: random magnitudes, zeros, near-cancellations of the dot, fp32 subnormals."""
    rows = a.shape[0]
    c = torch.randn(rows, generator=generator) * torch.exp2(
        torch.randint(-spread, spread + 1, (rows,), generator=generator).float())
    c[0::7] = 0.0
    c[1::5] = -(a[1::5].double() * b[1::5].double()).sum(-1).float()  # the result cancels to a few ulps
    c[2::11] = torch.randn(c[2::11].shape, generator=generator) * 2.0 ** -135  # fp32 subnormals
    return c


@pytest.mark.parametrize("gemm_model,fmt", sorted(INSTRUCTION))
@pytest.mark.parametrize("depth", [8, 16, 40, 64])
def test_dot_add_matches_mmasim_bit_for_bit(gemm_model, fmt, depth):
    generator = torch.Generator().manual_seed(depth * 7 + len(fmt))
    instruction = INSTRUCTION[gemm_model, fmt]()
    spreads = (2, 12, 60) if fmt == "bfloat16" else (2, 9)  # fp16 draws reach its subnormals at spread 9
    for spread in spreads:
        a, b = _draw((1500, depth), fmt, spread, generator), _draw((1500, depth), fmt, spread, generator)
        c = _accumulators(a, b, spread, generator)
        want = instruction.dpa(a, b, c)
        got = tensor_core_matmul(a.float()[:, None, :], b.float()[:, :, None], c[:, None, None], gemm_model, fmt)
        got = got[:, 0, 0]
        mismatched = (got.view(torch.int32) != want.view(torch.int32)).sum().item()
        assert mismatched == 0, f"{mismatched} of {len(want)} dot-adds differ from MMA-Sim (spread {spread})"
        # the model is not plain FP32 accumulation: the draw must be able to tell them apart
        plain = ((a.double() * b.double()).sum(-1) + c.double()).float()
        assert not torch.equal(plain, want)


@pytest.mark.parametrize("gemm_model", sorted(tensor_core.GEMM_MODELS))
def test_gemm_layout_cleared_and_accumulating(gemm_model):
    """A batched [M, K] @ [K, N] (and one into an accumulator) is the element-wise dot-add of row and column."""
    generator = torch.Generator().manual_seed(5)
    a, b = _draw((3, 2, 24, 32), "bfloat16", 8, generator), _draw((2, 32, 16), "bfloat16", 8, generator)
    c = torch.randn(3, 2, 24, 16, generator=generator)
    instruction = INSTRUCTION[gemm_model, "bfloat16"]()
    rows = a[..., :, None, :].expand(3, 2, 24, 16, 32)
    cols = b.transpose(-1, -2)[None, :, None, :, :].expand(3, 2, 24, 16, 32)
    cleared = tensor_core_matmul(a.float(), b.float(), None, gemm_model, "bfloat16")
    into = tensor_core_matmul(a.float(), b.float(), c, gemm_model, "bfloat16")
    assert torch.equal(cleared, instruction.dpa(rows, cols, torch.zeros(3, 2, 24, 16)))
    assert torch.equal(into, instruction.dpa(rows, cols, c))


@pytest.mark.parametrize("gemm_model", sorted(tensor_core.GEMM_MODELS))
def test_overflowing_sums_become_inf_as_in_mmasim(gemm_model):
    generator = torch.Generator().manual_seed(11)
    a = (torch.randn(2000, 16, generator=generator) * 2.0 ** 63).to(torch.bfloat16)
    b = (torch.randn(2000, 16, generator=generator) * 2.0 ** 63).to(torch.bfloat16)
    c = torch.zeros(2000)
    want = INSTRUCTION[gemm_model, "bfloat16"]().dpa(a, b, c)
    got = tensor_core_matmul(a.float()[:, None, :], b.float()[:, :, None], c[:, None, None], gemm_model, "bfloat16")
    assert want.isinf().sum() > 100  # the draw overflows often
    assert torch.equal(got[:, 0, 0].view(torch.int32), want.view(torch.int32))


def test_empty_gemms_return_the_accumulator():
    assert torch.equal(tensor_core_matmul(torch.ones(3, 0), torch.ones(0, 4), None, "sm90_wgmma", "bfloat16"),
                       torch.zeros(3, 4))
    c = torch.randn(2, 3, 4)
    assert torch.equal(tensor_core_matmul(torch.ones(3, 0), torch.ones(0, 4), c, "sm80_mma", "bfloat16"), c)
    assert tensor_core_matmul(torch.ones(0, 3, 5), torch.ones(5, 4), None, "sm90_wgmma", "float16").shape == (0, 3, 4)


def test_slabs_do_not_change_the_bits(monkeypatch):
    generator = torch.Generator().manual_seed(9)
    a, b = _draw((40, 16, 48), "float16", 6, generator).float(), _draw((40, 48, 8), "float16", 6, generator).float()
    whole = tensor_core_matmul(a, b, None, "sm90_wgmma", "float16")
    monkeypatch.setattr(tensor_core, "SLAB_ELEMENTS", 1000)
    assert torch.equal(tensor_core_matmul(a, b, None, "sm90_wgmma", "float16"), whole)


def test_round_toward_zero_fp32():
    x = torch.tensor([1 + 2.0 ** -24 + 2.0 ** -40, -(1 + 2.0 ** -23 + 2.0 ** -25), 3 * 2.0 ** -150, -0.0,
                      2.0 ** -149 * 1.5, 1.0], dtype=torch.float64)
    want = torch.tensor([1.0, -(1 + 2.0 ** -23), 2.0 ** -149, 0.0, 2.0 ** -149, 1.0], dtype=torch.float32)
    got = round_toward_zero_fp32(x)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # -0 becomes +0


def test_bad_arguments_are_named():
    a = torch.ones(4, 16)
    with pytest.raises(TypeError, match="a must be float32"):
        tensor_core_matmul(a.double(), a.T, None, "sm90_wgmma", "bfloat16")
    with pytest.raises(ValueError, match="K differs"):
        tensor_core_matmul(a, a, None, "sm90_wgmma", "bfloat16")
    with pytest.raises(ValueError, match="b_format"):
        tensor_core_matmul(a, a.T, None, "sm90_wgmma", "bfloat16", "float8")
    with pytest.raises(ValueError, match="sm90_wgmma"):
        tensor_core_matmul(a, a.T, None, "tf32", "bfloat16")
