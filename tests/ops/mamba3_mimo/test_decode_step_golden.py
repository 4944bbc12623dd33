"""The whole decode step against the real upstream kernels (GPU golden data, issue 25, acceptance 2).

``tests/data/upstream_h200_decode_step_cases.pt`` holds upstream's step as ``Mamba3.step`` chains it: the Triton
rotary kernel, then the CuTe state update, token after token from a kept state (``golden/make_golden_decode.py
--part step``) on :data:`decode_cases.STEP_CASES`. The policy step runs the same tokens from the stored inputs;
:func:`decode_cases.step_golden_verdict` is the gate (every output within ``whole_op_golden_sm90_rel_rms`` under
``upstream_sm90``; ``out`` and ``k_rot`` at least ``whole_op_golden_fp32_over_sm90_ratio_min`` times farther
without the lp stores). With every FP32-level model the step is upstream's bits on most elements.
"""

import pytest
import torch

from mimo_numerics import golden_data, tolerances
from mimo_numerics.ops._common.special import special_functions
from mimo_numerics.ops.mamba3_mimo import decode_cases
from mimo_numerics.policy import FP32_LEVEL_SM90

CASES = golden_data.load("decode_step")
NAMES = sorted(CASES)


def test_the_golden_file_is_the_recorded_one():
    golden_data.verify("decode_step")
    assert set(NAMES) == set(decode_cases.STEP_CASES)
    for name in NAMES:
        assert CASES[name]["fields"] == decode_cases.STEP_CASES[name], name
        assert CASES[name]["repeat_identical"], name
        # the stored inputs are the generator's, so the FP64 half of the gate (test_decode_step_gate.py) ran on them
        fresh, stored = decode_cases.make_step_inputs(decode_cases.STEP_CASES[name]), CASES[name]["inputs"]
        assert sorted(fresh) == sorted(stored), name
        for key in fresh:
            pairs = fresh[key].items() if key == "state" else [(key, fresh[key])]
            for sub, value in pairs:
                want = stored[key][sub] if key == "state" else stored[key]
                assert (value is None and want is None) or torch.equal(value, want), (name, key, sub)


@pytest.mark.parametrize("name", NAMES)
def test_the_policy_step_passes_the_golden_gate(name):
    verdict = decode_cases.step_golden_verdict(CASES[name])
    assert verdict["failures"] == [], verdict


def _identical(a, b):
    bits = torch.int32 if a.dtype == torch.float32 else torch.int16
    return (a.view(bits) == b.view(bits)).double().mean().item()


def _identical_fractions(got, want):
    fractions = {key: _identical(got[key], want[key]) for key in ("out", "k_rot", "angle")}
    fractions["ssm"] = min(_identical(got["ssm"][t], want["ssm"][t]) for t in want["ssm"])
    return fractions


@pytest.mark.parametrize("name", NAMES)
def test_with_the_fp32_level_models_the_step_is_upstreams_bits(name):
    """``policy.FP32_LEVEL_SM90`` on the step: the caller's gate (torch's CUDA sigmoid, ``torch_sigmoid``) and the
    FP32 angle state are upstream's bits everywhere; the output, the rotated k and every kept state on at least
    ``decode_step_golden_fp32_level_identical_min`` of the elements (all of them on the short bf16 chains), where
    the preset alone leaves most of the state's FP32 bits different."""
    case = CASES[name]
    preset = decode_cases.step_policy(case["fields"])
    models = preset.replace(**FP32_LEVEL_SM90)
    want = case["upstream"]
    assert torch.equal(special_functions(models).torch_sigmoid(case["inputs"]["Trap"].float()), want["gate"])
    got = _identical_fractions(decode_cases.run_policy_chain(case["fields"], case["inputs"], models), want)
    assert got["angle"] == 1.0, got
    floor = tolerances.get("decode_step_golden_fp32_level_identical_min")
    assert min(got["out"], got["k_rot"], got["ssm"]) >= floor, got
    alone = _identical_fractions(decode_cases.run_policy_chain(case["fields"], case["inputs"], preset), want)
    assert got["ssm"] > alone["ssm"] and got["angle"] > alone["angle"], (got, alone)
