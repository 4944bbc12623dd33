"""The H200's fast-math special functions (MUFU) emulated from the shipped table models (mimo_numerics.mufu).

The proof that each model equals the hardware on all 2^32 float32 inputs ran on the H200
(scripts/fit_mufu_models.py --verify; reports/mufu_models_h200.md). Here, on any CPU: the shipped models give the
H200's outputs bit for bit on the 65536 sampled inputs per function recorded there (tests/data/mufu_h200_samples.pt:
random bit patterns, the op's ranges, tiny values, specials), and the storage round trip is exact.
"""

from __future__ import annotations

import math

import pytest
import torch

from mimo_numerics import golden_data, mufu
from mimo_numerics.ops._common.special import SpecialFunctions, cuda_expf, models

SAMPLES = golden_data.path("mufu_samples")


@pytest.fixture(scope="module")
def samples():
    return torch.load(SAMPLES, weights_only=True)


@pytest.fixture(scope="module")
def all_models():
    return {**models("cpu"), **models("cpu", trig=True)}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))


@pytest.mark.parametrize("function", mufu.FUNCTIONS)
def test_models_give_the_h200_bits_on_its_samples(samples, all_models, function):
    x, hardware = samples["inputs"], samples[function]
    got = all_models[function](x)
    bad = ~_same_bits(got, hardware)
    assert "H200" in samples["device"]
    assert int(bad.sum()) == 0, (function, x[bad][:5].tolist(), hardware[bad][:5].tolist(), got[bad][:5].tolist())


def test_models_differ_from_the_correctly_rounded_functions(samples, all_models):
    """The approximations are not torch's functions: the test above could not pass with torch's (it can fail)."""
    x = samples["inputs"]
    finite = torch.isfinite(x) & (x.abs() < 60)
    exact = {"ex2": torch.exp2, "rcp": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh}
    for function, fn in exact.items():
        want = fn(x[finite].double()).float()
        differs = ~_same_bits(all_models[function](x[finite]), want)
        assert int(differs.sum()) > 100, function


def test_ftz_and_special_values(all_models):
    tiny = torch.tensor([2.0 ** -149, -(2.0 ** -140)], dtype=torch.float32)
    assert torch.equal(all_models["ex2"](tiny), torch.ones(2))
    assert torch.equal(all_models["rcp"](tiny), torch.tensor([math.inf, -math.inf]))
    assert torch.equal(all_models["tanh"](tiny), tiny)  # tanh.approx.f32 has no .ftz
    special = torch.tensor([math.inf, -math.inf, math.nan], dtype=torch.float32)
    assert all_models["ex2"](special)[:2].tolist() == [math.inf, 0.0] and all_models["ex2"](special)[2].isnan()
    assert all_models["sin"](special).isnan().all() and all_models["cos"](special).isnan().all()


def test_storage_round_trip(tmp_path, all_models):
    table = torch.randint(-2 ** 31, 2 ** 31 - 1, (4099,), dtype=torch.int64).to(torch.int32)
    trig = mufu.MufuModel("sin", {"reduction": "magnitude_fixed", "fraction_bits": 12}, table)
    path = tmp_path / "m.npz"
    mufu.save_models({"rcp": all_models["rcp"], "s": trig}, path)
    back = mufu.load_models(path)
    assert torch.equal(back["rcp"].table, all_models["rcp"].table) and back["rcp"].params == all_models["rcp"].params
    assert torch.equal(back["s"].table, table) and back["s"].params == trig.params  # F < 25: every key kept


def test_trig_storage_keeps_the_reachable_keys(tmp_path):
    """A magnitude_fixed trig table with F = 25 keeps the keys FP32 turns can reach (all below 2^24, the even ones
    above); the others are never looked up."""
    F = 25
    table = torch.arange(1 << F, dtype=torch.int64).mul(7).to(torch.int32)
    model = mufu.MufuModel("cos", {"reduction": "magnitude_fixed", "fraction_bits": F}, table)
    assert mufu._segments(model) == [[0, 1 << 24, 1], [1 << 24, 1 << 25, 2]]
    mufu.save_models({"cos": model}, tmp_path / "t.npz")
    back = mufu.load_models(tmp_path / "t.npz")["cos"].table
    assert torch.equal(back[: 1 << 24], table[: 1 << 24]) and torch.equal(back[1 << 24::2], table[1 << 24::2])
    x = torch.linspace(-100, 100, 100001, dtype=torch.float32)
    assert torch.equal(mufu.MufuModel("cos", model.params, back)(x), model(x))


def test_trig_keys_of_huge_inputs_are_device_independent(all_models):
    """|t| >= 2^23 is an integer: key 0. (A clamp at 2^40 made t·2^25 overflow int64: the CPU wrapped to key 0, the
    GPU saturated to the last key; measured on the H200.)"""
    x = torch.tensor([1e30, -1e30, 3e38, 2.0 ** 60, 1727109005312.0], dtype=torch.float32)
    for name in ("sin", "cos"):
        assert torch.equal(all_models[name].keys(x), torch.zeros(5, dtype=torch.int64)), name
    assert torch.equal(all_models["sin"](x), torch.tensor([0.0, -0.0, 0.0, 0.0, 0.0]))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="float32"):
        models("cpu")["ex2"](torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="fast_sm90"):
        SpecialFunctions("fast_sm90").exp(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="special_functions"):
        SpecialFunctions("fast")


def test_special_functions_compose_fast_math(all_models):
    """exp = ex2(fl32(x·log2 e)), σ = rcp(fl32(1 + exp(−x))): the forms nvcc's fast math emits."""
    fns = SpecialFunctions("fast_sm90")
    x = torch.linspace(-30, 30, 20001, dtype=torch.float32)
    e = all_models["ex2"](x * torch.tensor(mufu.LOG2E_FP32))
    assert torch.equal(fns.exp(x), e)
    assert torch.equal(fns.sigmoid(x), all_models["rcp"](1.0 + fns.exp(-x)))
    assert (fns.sigmoid(x).double() - torch.sigmoid(x.double())).abs().max() < 1e-6
    accurate = SpecialFunctions("accurate")
    assert torch.equal(accurate.exp(x), torch.exp(x)) and torch.equal(accurate.sigmoid(x), torch.sigmoid(x))


def _ulps(model, exact64):
    rounded = exact64.float()
    ulp = (torch.nextafter(rounded, torch.full_like(rounded, float("inf"))) - rounded).double()
    return (model.double() - exact64).abs() / ulp


def test_cuda_expf_is_within_cudas_two_ulps_and_not_the_fast_form():
    """``cuda_expf`` (CUDA's accurate expf: two-FMA range reduction, then MUFU.EX2) is within the 2 ulps CUDA
    documents for ``expf`` over the normal range, and not the fast-math ``exp`` (one rounded product before MUFU.EX2,
    which loses accuracy as |x| grows)."""
    x = torch.linspace(-87.0, 88.0, 200001, dtype=torch.float32)
    exact = torch.exp(x.double())
    accurate = cuda_expf(x)
    assert _ulps(accurate, exact).max().item() <= 2.0
    assert _ulps(SpecialFunctions("fast_sm90").exp(x), exact).max().item() > 8.0


def test_cuda_expf_and_torch_sigmoid_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 100.0, -100.0, -200.0])
    e = cuda_expf(x)
    assert e[0] == 1.0 and e[1] == 1.0 and e[2] == float("inf") and e[3] == 0.0 and torch.isnan(e[4])
    assert e[5] == float("inf") and 0.0 < e[6] < torch.finfo(torch.float32).tiny and e[7] == 0.0  # mul.f32 keeps subnormals
    s = SpecialFunctions("fast_sm90").torch_sigmoid(x)
    assert s[0] == 0.5 and s[2] == 1.0 and s[3] == 0.0 and torch.isnan(s[4]) and s[5] == 1.0 and s[7] == 0.0
    assert torch.equal(SpecialFunctions("accurate").torch_sigmoid(x[:4]), torch.sigmoid(x[:4]))
    with pytest.raises(TypeError, match="torch_sigmoid"):
        SpecialFunctions("fast_sm90").torch_sigmoid(torch.zeros(2, dtype=torch.float64))
