"""The upstream-main model (``mimo_numerics.studies.upstream_main``): each change reaches exactly the gradients that
read it, the bf16 rounding of the states is a no-op for bf16 runs, and the count of inexact states is right."""

import pytest
import torch

from mimo_numerics.ops.mamba3_mimo.cases import make_op_inputs, small_case
from mimo_numerics.studies import upstream_main

#: the gradients whose chain reads stage 1's STATES (stage 2's dq GEMM and ddA state term) and so may change
READ_STATES = {"dQ", "dQ_bias", "dADT", "dDT", "dAngles"}


def _same(a, b):
    return (a is None and b is None) or torch.equal(a, b)


@pytest.fixture(scope="module")
def fp16_grads():
    return upstream_main.variant_gradients(make_op_inputs(small_case(dtype="float16", seed=5)), "upstream_sm90_fp16")


def test_bf16_states_change_only_what_reads_the_states(fp16_grads):
    tag, main = fp16_grads["2.3.2.post1"], fp16_grads["main: bf16 states"]
    changed = {name for name in upstream_main.GRADIENTS if not _same(tag[name], main[name])}
    assert changed == READ_STATES


def test_fp32_bias_sums_change_only_the_bias_gradients(fp16_grads):
    tag, main = fp16_grads["2.3.2.post1"], fp16_grads["main: fp32 bias sums"]
    changed = {name for name in upstream_main.GRADIENTS if not _same(tag[name], main[name])}
    assert changed == {"dQ_bias", "dK_bias"}
    # the tag's bias sums are lp values, main's are not
    assert torch.equal(tag["dQ_bias"], tag["dQ_bias"].half().float())
    assert not torch.equal(main["dQ_bias"], main["dQ_bias"].half().float())


def test_bf16_states_are_a_no_op_for_bf16_runs():
    grads = upstream_main.variant_gradients(make_op_inputs(small_case(seed=5)), "upstream_sm90")
    for name in upstream_main.GRADIENTS:
        assert _same(grads["2.3.2.post1"][name], grads["main: bf16 states"][name]), name


def test_states_not_exact_counts_values_outside_fp16_normal_range():
    state = torch.tensor([1.0, -3.14159, 1e-6, 7.0e4, 2.0 ** -14, 1.0001], dtype=torch.float32)
    # bf16(1e-6) has bits below fp16's subnormal step 2^-24; bf16(7e4) = 70144 is past fp16's largest (65504); the
    # others' bf16 values are fp16 values
    assert upstream_main.states_not_exact(state, torch.float16) == 2
    assert upstream_main.states_not_exact(state, torch.bfloat16) == 0
    main = upstream_main.states_as_main(state, torch.float16)
    assert main.dtype == torch.float16
    assert main[5].item() == 1.0 and main[1].item() == -3.140625  # bf16 steps, not fp16's (1.0 + 2^-10 exists)
    assert torch.equal(upstream_main.states_as_main(state, torch.bfloat16), state.bfloat16())


def test_run_case_reports_every_variant_against_fp64():
    case = upstream_main.run_case(small_case(dtype="float16", seed=5))
    assert set(case["errors"]) == set(upstream_main.VARIANTS)
    tag, main = case["errors"]["2.3.2.post1"], case["errors"]["main: bf16 states"]
    assert main["dQ"] > tag["dQ"] > 0 and main["dV"] == tag["dV"]
    assert case["states_not_exact"] == 0 and case["states"] > 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dtype"):
        upstream_main.policy_for("float32")
    with pytest.raises(TypeError, match="state"):
        upstream_main.states_as_main(torch.zeros(2, dtype=torch.float16), torch.float16)
    with pytest.raises(ValueError, match="lp_dtype"):
        upstream_main.states_not_exact(torch.zeros(2), torch.float32)
