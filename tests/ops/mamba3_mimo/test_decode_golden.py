"""The decode step's rotary kernel against the real upstream one (H200 golden data, issue 25).

``tests/data/upstream_h200_decode_rotary_cases.pt`` holds upstream's ``apply_rotary_qk_inference_fwd`` on five cases
(``golden/make_golden_decode.py``; one a 256-step chain whose angle state is fed back). The policy step's rotary part
(``decode.rotary_step``) under ``upstream_sm90`` (``upstream_sm90_fp16`` for fp16) runs the same steps from the
stored inputs: its rotated q and k, rounded to lp at the kernel's store, are upstream's bits on at least
``decode_rotary_golden_lp_identical_min`` of the elements, the FP32 angle state within
``decode_rotary_golden_angle_rel_rms``; without the store rounding they are not (the site is what reproduces them).
"""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import golden_data, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import decode_cases

CASES = golden_data.load("decode_rotary")
NAMES = sorted(CASES)


def _policy(case, round_outputs=True):
    name = "upstream_sm90" if case["fields"]["dtype"] == "bfloat16" else "upstream_sm90_fp16"
    return mn.presets.get(name).replace(round_outputs=round_outputs)


def _run(case, policy):
    return decode_cases.run_rotary_case(case, policy)


def _identical(a, b):
    return (a.view(torch.int16) == b.view(torch.int16)).double().mean().item()


def test_the_golden_file_is_the_recorded_one():
    golden_data.verify("decode_rotary")
    assert len(NAMES) == 5 and all(CASES[n]["repeat_identical"] for n in NAMES)
    assert max(CASES[n]["fields"]["steps"] for n in NAMES) == 256


@pytest.mark.parametrize("name", NAMES)
def test_rotary_step_reproduces_upstreams_kernel(name):
    case = CASES[name]
    got, want = _run(case, _policy(case)), case["upstream"]
    floor = tolerances.get("decode_rotary_golden_lp_identical_min")
    for key in ("q_out", "k_out"):
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        assert _identical(got[key], want[key]) >= floor, (key, _identical(got[key], want[key]))
    assert got["angle_state"].dtype == torch.float32
    assert rel_rms(got["angle_state"], want["angle_state"]) <= tolerances.get("decode_rotary_golden_angle_rel_rms")


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n]["fields"]["steps"] == 1])
def test_without_the_store_rounding_the_bits_are_not_upstreams(name):
    case = CASES[name]
    got = _run(case, _policy(case, round_outputs=False))
    lp = case["upstream"]["q_out"].dtype
    assert got["q_out"].dtype == torch.float32
    # the unrounded FP32 values sit about half an lp ulp from upstream's stored ones
    assert rel_rms(got["q_out"], case["upstream"]["q_out"]) >= (1e-3 if lp == torch.bfloat16 else 1e-4)


def test_the_contracted_angle_is_closer_to_upstreams_bits():
    """``helper_fma`` acts on the rotary step: upstream's kernel forms the new angle as one FMA, and modelling it
    gives more of upstream's FP32 angle bits on every one-step case that has a difference at all."""
    for name in NAMES:
        case = CASES[name]
        if case["fields"]["steps"] != 1:
            continue
        want = case["upstream"]["angle_state"]
        contracted = _run(case, _policy(case).replace(helper_fma="contracted"))["angle_state"]
        separate = _run(case, _policy(case).replace(helper_fma="separate"))["angle_state"]
        same_c, same_s = (contracted == want).double().mean().item(), (separate == want).double().mean().item()
        assert same_c >= same_s, name
        if same_s < 1.0:
            assert same_c > same_s, name


def test_with_the_h200s_special_functions_the_angle_state_is_upstreams_bits():
    """``special_functions="fast_sm90"``: ``tl.sigmoid`` as the H200 computes it (MUFU.EX2, then ``div.full.f32``
    as MUFU.RCP; read from the kernel's SASS). Every FP32 angle state of every case is upstream's, the 256-step chain
    fed back included (with torch's sigmoid 92 % to 98 % after one step, 22 % over the chain). The angle involves
    no ``cos``/``sin``, so its bits are the same on every CPU. The rotated q and k keep the preset's floor (measured:
    every element but one of the fp16 case, an FP32 value 4 ulps under an fp16 midpoint: the kernel's libdevice
    ``cosf``/``sinf`` against torch's, which may differ by an ulp between CPUs too)."""
    floor = tolerances.get("decode_rotary_golden_lp_identical_min")
    for name in NAMES:
        case = CASES[name]
        got = _run(case, _policy(case).replace(special_functions="fast_sm90"))
        want = case["upstream"]
        assert torch.equal(got["angle_state"], want["angle_state"]), name
        for key in ("q_out", "k_out"):
            assert _identical(got[key], want[key]) >= floor, (name, key)
