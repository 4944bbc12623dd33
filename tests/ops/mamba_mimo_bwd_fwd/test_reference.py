"""The policy reference: FP64 against the independent oracle, every switch and knob has an effect, stage records."""

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import tolerances
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, grid, make_inputs
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as SWITCHES
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

# the gate grid plus cases the oracle check must cover beyond it
ORACLE_CASES = list(grid("gate")) + [
    CaseSpec(batch=2, seqlen=13, heads=4, groups=2, state_dim=32, value_dim=16, rank=3, chunk_size=6,
             reduce_o=False, has_z=True, has_d=True, seed=5),
    CaseSpec(seqlen=40, state_dim=16, value_dim=32, rank=2, chunk_size=8, reduce_o=True, has_z=True, has_d=False,
             formula="realistic", seed=9, rotary_dim_divisor=2),
    CaseSpec(seqlen=7, state_dim=16, value_dim=16, rank=1, chunk_size=16, reduce_o=True, has_z=True, has_d=True,
             dtype="float16", seed=11),
]
ALL_BRANCHES = CaseSpec(batch=2, seqlen=21, heads=2, groups=1, state_dim=32, value_dim=16, rank=3, chunk_size=8,
                        reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=4)


def _ref(inputs, policy, **kw):
    return stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy, **kw)


@pytest.mark.parametrize("spec", ORACLE_CASES, ids=lambda s: s.case_id)
def test_reference_fp64_matches_oracle(spec):
    inputs = make_inputs(spec)
    policy = mn.presets.get("fp64").replace(lp_dtype=spec.dtype)
    got = _ref(inputs, policy)
    want = stage1_oracle.mamba_mimo_bwd_fwd_oracle(*as_args(inputs), **as_kwargs(inputs))
    for name, a, e in zip(mn.OUTPUT_NAMES, got, want):
        if e is None:
            assert a is None, name
            continue
        assert a.dtype == torch.float64 and a.shape == e.shape, name
        assert rel_rms(a, e) <= tolerances.get("fp64_reference_vs_oracle_rel_rms"), name


def test_oracle_cases_cover_every_branch_and_shape_class():
    specs = ORACLE_CASES
    assert len(specs) >= 8
    assert {(s.reduce_o, s.has_z) for s in specs} == {(True, True), (True, False), (False, True), (False, False)}
    assert any(s.has_d for s in specs) and any(not s.has_d for s in specs)
    assert any(s.heads > s.groups for s in specs) and any(s.batch > 1 for s in specs)
    assert any(s.seqlen % s.chunk_size for s in specs)
    assert any((s.chunk_size * s.rank) & (s.chunk_size * s.rank - 1) for s in specs)  # C·R not a power of two


@pytest.fixture(scope="module")
def all_branch_inputs():
    return make_inputs(ALL_BRANCHES)


@pytest.fixture(scope="module")
def sm90_outputs(all_branch_inputs):
    return _ref(all_branch_inputs, "upstream_sm90")


def _changed(a, b):
    return [n for n, x, y in zip(mn.OUTPUT_NAMES, a, b) if x is not None and not torch.equal(x, y)]


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_reference_every_switch_changes_the_outputs(all_branch_inputs, sm90_outputs, switch):
    off = _ref(all_branch_inputs, mn.presets.get("upstream_sm90").replace(**{switch: False}))
    assert _changed(off, sm90_outputs), f"turning {switch} off changed nothing"


@pytest.mark.parametrize("knob, value", [("diag_mode", "mul_then_add"), ("state_update", "separate"),
                                         ("silu_form", "sigmoid"), ("math_dtype", "float64")])
def test_reference_every_knob_changes_the_outputs(all_branch_inputs, sm90_outputs, knob, value):
    base_record, other_record = {}, {}
    _ref(all_branch_inputs, "upstream_sm90", record=base_record)
    other = _ref(all_branch_inputs, mn.presets.get("upstream_sm90").replace(**{knob: value}), record=other_record)
    if knob == "state_update":  # an FP32 summation order: visible in the FP32 state, rarely in lp outputs
        assert not torch.equal(base_record["state"], other_record["state"])
    else:
        assert _changed(other, sm90_outputs), knob


def test_reference_round_outputs_false_returns_math_dtype(all_branch_inputs):
    out = _ref(all_branch_inputs, "fp64")
    assert all(t.dtype == torch.float64 for t in out)
    out32 = _ref(all_branch_inputs, "fp32")
    assert out32.states.dtype == out32.dz.dtype == out32.qk_dot.dtype == torch.bfloat16
    assert out32.dmimo_o.dtype == out32.dmimo_z.dtype == torch.float32


def test_reference_fp16_policy_runs_on_fp16_inputs():
    spec = CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True,
                    dtype="float16")
    out = _ref(make_inputs(spec), "upstream_sm90_fp16")
    assert out.states.dtype == out.dz.dtype == out.qk_dot.dtype == torch.float16
    assert all(torch.isfinite(t.float()).all() for t in out)


def test_reference_record_holds_documented_stages(all_branch_inputs, sm90_outputs):
    record = {}
    out = _ref(all_branch_inputs, "upstream_sm90", record=record)
    for a, b in zip(out, sm90_outputs):
        assert torch.equal(a, b)  # recording does not change results
    documented = stage1_reference.__doc__
    for stage in ("q_biased", "k_biased", "qk_dot", "q_rot", "k_rot", "gamma", "shifted_gamma", "trap_scale",
                  "k_scaled", "psiv", "k_state", "state", "state_operand", "inter", "causal_scores", "intra",
                  "diag_accum", "diag", "out", "gate", "dphio", "dzz", "dz_accum"):
        assert stage in record and stage in documented, stage
    s = ALL_BRANCHES
    nc = -(-s.seqlen // s.chunk_size)
    assert record["out"].shape == (s.batch, s.heads, s.seqlen, s.rank, s.value_dim)
    assert record["state"].shape == (s.batch, s.heads, nc, s.state_dim, s.value_dim)
    assert torch.equal(mn.rounding.round_to_lp(record["state"]).bfloat16(), out.states)


def test_reference_tail_rows_do_not_leak_into_outputs():
    """Changing the padding-free inputs' last chunk after S must not matter: S=13 equals S=16 truncated in time."""
    spec = CaseSpec(seqlen=13, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True, has_d=True, seed=2)
    inputs = make_inputs(spec)
    out = _ref(inputs, "upstream_sm90")
    # garbage in the segsum entries of padded rows/columns must not change any output
    seg = inputs["segsum"].clone()
    seg[:, :, -1, 1:, :] += 100.0  # rows t = 13..15 of the last chunk are padding (row 0 is t = 12)
    seg[:, :, -1, :, 1:] += 100.0
    seg[:, :, -1, 0, 0] = inputs["segsum"][:, :, -1, 0, 0]
    inputs2 = dict(inputs, segsum=seg)
    for a, b in zip(_ref(inputs2, "upstream_sm90"), out):
        if a is not None:
            assert torch.equal(a, b)
