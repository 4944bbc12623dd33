"""The decode step's FP32-level models (``special_functions="fast_sm90"``, ``fp32_fma=True``; issue 24's knobs on
upstream's two step kernels, read from their PTX and SASS: ``ops/mamba3_mimo/decode.py``).

The rotary kernel's are checked against its H200 golden data (``test_decode_golden.py``); the CuTe kernel's golden
data is owed, so here: its fast ``tanh`` is a tanh (to 1.4 FP32 eps), its N-sum adds the lanes by halves (a case
whose exact answer only that order gives), the models move the step by FP32-level amounts only, both layouts agree
under them (``tests/test_compat_step.py``), and the knobs without a meaning in the step are taken.
"""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import decode, decode_cases
from mimo_numerics.policy import FP32_LEVEL_SM90

FP32_LEVEL = mn.presets.get("upstream_sm90").replace(**FP32_LEVEL_SM90)


def test_the_cute_fast_tanh_is_a_tanh():
    x = torch.linspace(-12.0, 12.0, 120001, dtype=torch.float32)
    got = decode._cute_tanh(x)
    exact = torch.tanh(x.double())
    eps = torch.finfo(torch.float32).eps
    assert ((got.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max().item() <= 1.5 * eps
    assert torch.equal(decode._cute_tanh(-x), -got)  # odd
    assert torch.equal(got[x.abs() >= 9.02], torch.sign(x[x.abs() >= 9.02]))  # saturated
    tiny = torch.tensor([0.0, 1e-20, -3e-8], dtype=torch.float32)
    assert torch.equal(decode._cute_tanh(tiny), tiny)  # the polynomial branch returns x for |x| << 1


def test_the_lane_sum_adds_the_32_lanes_by_halves():
    """N = 64: lane l holds n = 2l, 2l + 1. 2^24 (lane 0) + 1 (lane 1) - 2^24 (lane 16) + 1 (lane 17): exactly 2.
    By halves (lane l with l + 16 first) the big terms cancel first and the sum is 2; a sum in n order loses the
    first one to rounding (2^24 + 1 is a tie, rounded to even) and gives 1."""
    h = torch.zeros(1, 1, 1, 64)
    q = torch.ones(1, 1, 1, 64)
    h[..., 0], h[..., 2], h[..., 32], h[..., 34] = 2.0 ** 24, 1.0, -(2.0 ** 24), 1.0
    assert decode._lane_sum(h, q).item() == 2.0
    in_order = torch.zeros((), dtype=torch.float32)
    for n in range(64):
        in_order = in_order + h[0, 0, 0, n] * q[0, 0, 0, n]
    assert in_order.item() == 1.0


def test_the_lane_sum_refuses_a_state_dim_the_kernel_does_not_take():
    with pytest.raises(NotImplementedError, match="N=16"):
        decode._lane_sum(torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 1, 16))


@pytest.mark.parametrize("name", ["step_B2_H4_G1_N128_P64_R4_K32_bf16", "step_B1_H2_G2_N64_P128_R2_K16_fp16"])
def test_the_models_move_the_step_by_fp32_level_amounts(name):
    """One token: the FP32-level step changes the FP32 state on a large share of its elements (45 % and 72 %
    measured: contractions everywhere), by about an FP32 ulp; the lp output by the odd rounding flip."""
    fields = dict(decode_cases.STEP_CASES[name], steps=1)
    inputs = decode_cases.make_step_inputs(fields)
    base = decode_cases.step_policy(fields)
    plain = decode_cases.run_policy_chain(fields, inputs, base)
    modelled = decode_cases.run_policy_chain(fields, inputs, base.replace(**FP32_LEVEL_SM90))
    assert (plain["ssm"][0] != modelled["ssm"][0]).double().mean().item() > 0.2
    assert rel_rms(modelled["ssm"][0], plain["ssm"][0]) <= 1e-6
    assert rel_rms(modelled["out"], plain["out"]) <= 1e-4
    assert rel_rms(modelled["angle"], plain["angle"]) <= 1e-7


def test_the_step_takes_gemm_model_and_reduction_order_unchanged():
    """No matrix-unit product and no sum over time in the step: those knobs have nothing to act on."""
    fields = dict(decode_cases.STEP_CASES["step_B2_H4_G1_N128_P64_R4_K32_bf16"], steps=2)
    inputs = decode_cases.make_step_inputs(fields)
    want = decode_cases.run_policy_chain(fields, inputs, FP32_LEVEL)
    other = FP32_LEVEL.replace(gemm_model="sm80_mma", reduction_order="sequential_time")
    got = decode_cases.run_policy_chain(fields, inputs, other)
    assert all(torch.equal(got[k], want[k]) for k in ("out", "k_rot", "angle"))
