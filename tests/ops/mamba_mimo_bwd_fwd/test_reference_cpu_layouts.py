"""The CPU path's GEMM operand layouts are found once per shape and structure (``reference_cpu.layout_policy``), not
once per policy: every switch but ``diag_accum`` must leave the generic path's bmm operand strides and its sums'
operand strides as they are. Checked here on drawn policies (every knob and site of every operator) and the shapes
of the smoke and gate grids, against an uncached meta run of the policy itself."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_numerics import presets
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference_cpu
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, grid, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.validation import validate_inputs
from mimo_numerics.policy import ALL_KNOBS
from reliability_support import policies

SPECS = grid("smoke") + grid("gate")


def _dims(spec, lp_dtype):
    x = make_inputs(dataclasses.replace(spec, dtype=lp_dtype))
    return validate_inputs(*as_args(x), **as_kwargs(x))


def _meta_run(dims, policy):
    """The layouts of ``policy`` itself: the meta run without the cache or the reduction to the layout policy."""
    return reference_cpu._generic_layouts.__wrapped__(dims, policy)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data(), lp_dtype=st.sampled_from(["bfloat16", "float16"]), index=st.integers(0, len(SPECS) - 1))
def test_switches_other_than_diag_accum_leave_the_layouts_as_they_are(data, lp_dtype, index):
    policy = data.draw(policies(lp_dtype), label="policy")
    dims = _dims(SPECS[index], lp_dtype)
    assert reference_cpu.generic_layouts(dims, policy) == _meta_run(dims, policy)


def test_the_layout_policy_keeps_the_knobs_and_diag_accum_only():
    policy = presets.get("upstream_sm90")
    reduced = reference_cpu.layout_policy(policy)
    sites = reduced.section("mamba_mimo_bwd_fwd").to_dict()
    assert sites["diag_accum"] == policy.section("mamba_mimo_bwd_fwd").diag_accum
    assert not any(v for name, v in sites.items() if name != "diag_accum")
    assert reduced.defined_operators() == ("mamba_mimo_bwd_fwd",)
    for knob in ALL_KNOBS:
        assert getattr(reduced, knob) == getattr(policy, knob), knob
    # every policy with the same knobs and diag_accum shares the reduced policy, hence one cached meta run
    flipped = policy.with_sites("mamba_mimo_bwd_fwd", psiv=not policy.section("mamba_mimo_bwd_fwd").psiv)
    assert reference_cpu.layout_policy(flipped) == reduced
    assert reference_cpu.layout_policy(policy.replace(state_update="separate")) != reduced


def test_the_diagonal_switch_changes_the_gemm_sequence():
    """``diag_accum`` is kept because it decides whether the diagonal is a bmm: the layouts differ with it."""
    dims = _dims(SPECS[0], "bfloat16")
    policy = presets.get("upstream_sm90")
    on = policy.with_sites("mamba_mimo_bwd_fwd", diag_accum=True)
    off = policy.with_sites("mamba_mimo_bwd_fwd", diag_accum=False)
    assert len(_meta_run(dims, on)[0]) != len(_meta_run(dims, off)[0])
