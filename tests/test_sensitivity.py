"""One-on/one-off sensitivity (rank_sites), gap attribution (attribute_gap) and output_errors."""

import json

import pytest

from mimo_numerics import operator

from mimo_numerics import cases, presets, sensitivity
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as SWITCHES
from mimo_numerics.policy import KNOBS
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

TINY = cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True)
NO_Z = cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_d=True)


@pytest.fixture(scope="module")
def tiny():
    return stage1_cases.make_inputs(TINY)


@pytest.fixture(scope="module")
def golden_cases():
    data = golden.load_golden()
    return [v[0] for v in data.values()], [v[1] for v in data.values()]


def test_rank_sites_has_every_switch_and_knob_value(tiny):
    table = sensitivity.rank_sites(tiny, "upstream_sm90", "fp64")
    stage1_knobs = operator.get("mamba_mimo_bwd_fwd").knobs  # the knobs that act on stage 1
    n_knob_values = sum(len(v) for k, v in KNOBS.items() if k != "lp_dtype" and k in stage1_knobs)
    assert len(table.rows) == len(SWITCHES) + n_knob_values
    assert {r.site for r in table.rows if r.kind == "switch"} == set(SWITCHES)
    assert table.outputs == ("dmimo_o", "states", "dz", "dmimo_z", "qk_dot")
    scores = [r.score for r in table.rows]
    assert scores == sorted(scores, reverse=True)
    # the policy's own knob value: one-off is the policy itself
    assert table.row("silu_form=tanh").one_off == table.policy_error
    # every site of upstream_sm90 adds error on its own on this case (every branch is on)
    assert all(table.row(s).score > 0 for s in SWITCHES)


def test_rank_sites_definitions(tiny):
    table = sensitivity.rank_sites(tiny, "upstream_sm90", "fp64")
    floor = sensitivity.all_off("upstream_sm90")
    errors = sensitivity.output_errors(tiny, {
        "floor": floor, "psiv alone": floor.replace(psiv=True),
        "all but psiv": presets.get("upstream_sm90").replace(psiv=False),
        "diag fma alone": floor.replace(diag_accum=True, diag_mode="fma")}, "fp64")
    row = table.row("psiv")
    assert row.one_on == errors["psiv alone"] and row.one_off == errors["all but psiv"]
    assert table.floor_error == errors["floor"]
    assert table.row("diag_mode=fma").one_on == errors["diag fma alone"]
    for o in table.outputs:
        assert row.added[o] == pytest.approx(max(row.one_on[o] ** 2 - table.floor_error[o] ** 2, 0) ** 0.5)


def test_rank_sites_is_deterministic_and_serialises(tiny):
    a = sensitivity.rank_sites(tiny, "seed_bf16")
    b = sensitivity.rank_sites(tiny, "seed_bf16")
    assert a.to_dict() == b.to_dict()
    json.dumps(a.to_dict())
    text = a.to_markdown()
    assert all(f"`{s}`" in text for s in SWITCHES)


def test_sites_without_effect_score_zero():
    inputs = stage1_cases.make_inputs(NO_Z)
    table = sensitivity.rank_sites(inputs, "upstream_sm90")
    assert set(table.outputs) == {"dmimo_o", "states", "qk_dot"}
    for site in ("phi_weight", "dphio", "dz_accum"):
        row = table.row(site)
        assert row.score == 0.0 and row.one_off == table.policy_error and row.one_on == table.floor_error


def test_rank_sites_against_the_oracle(tiny):
    via_oracle = sensitivity.rank_sites(tiny, "upstream_sm90", "oracle")
    via_fp64 = sensitivity.rank_sites(tiny, "upstream_sm90", "fp64")
    for o in via_fp64.outputs:
        assert via_oracle.policy_error[o] == pytest.approx(via_fp64.policy_error[o], rel=1e-6)


def test_attribute_gap_single_field_explains_everything(tiny):
    base = presets.get("upstream_sm90")
    gap = sensitivity.attribute_gap(tiny, base.replace(out=False), base)
    assert [r.field for r in gap.rows] == ["out"]
    for o in gap.outputs:
        assert gap.residual[o] == 0.0
        assert gap.rows[0].forward[o] == gap.gap[o] and gap.interaction[o] == 0.0
    same = sensitivity.attribute_gap(tiny, base, base)
    assert same.rows == [] and all(v == 0.0 for v in same.gap.values())


def test_attribute_gap_bookkeeping(tiny):
    gap = sensitivity.attribute_gap(tiny, "fp32", "upstream_sm90", metric="distance")
    # one row per knob and stage-1 site that differs (the other operators' sites do not act on stage 1)
    stage1 = presets.get("fp32").diff(presets.get("upstream_sm90"), operator="mamba_mimo_bwd_fwd")
    assert [r.field for r in gap.rows] == list(stage1)
    for o in gap.outputs:
        total = gap.residual[o] + sum(r.forward[o] for r in gap.rows) + gap.interaction[o]
        assert total == pytest.approx(gap.gap[o])
    json.dumps(gap.to_dict())
    assert "interactions" in gap.to_markdown()
    with pytest.raises(ValueError, match="lp_dtype"):
        sensitivity.attribute_gap(tiny, "upstream_sm90", "upstream_sm90_fp16")


@pytest.mark.parametrize("target", ["policy_b", "device"])
def test_attribute_gap_golden_puts_diag_mode_first_on_dz(golden_cases, target):
    """Acceptance 3: on the 15 golden cases, diag_mode closes most of the seed_bf16 → upstream_sm90 gap on dz,
    whether the gap is measured to upstream_sm90's outputs or to the real H200 outputs."""
    inputs, outputs = golden_cases
    gap = sensitivity.attribute_gap(inputs, "seed_bf16", "upstream_sm90",
                                    target=None if target == "policy_b" else outputs)
    assert gap.top("dz") == "diag_mode"
    assert gap.ranked("dz")[0].forward["dz"] > 0.5 * gap.gap["dz"]
    for output in ("dmimo_o", "dmimo_z"):
        assert gap.top(output) == "diag_mode"


def test_output_errors_labels_and_baselines(tiny):
    errors = sensitivity.output_errors(tiny, ["upstream_sm90", presets.get("upstream_sm90").replace(out=False)])
    assert list(errors) == ["upstream_sm90", "upstream_sm90 with out=False"]
    own = sensitivity.output_errors(tiny, {"self": "upstream_sm90"},
                                    sensitivity.baseline_outputs(tiny, "upstream_sm90"))
    assert all(v == 0.0 for v in own["self"].values())


def test_committed_golden_sensitivity_report_lists_every_site():
    """Acceptance 3: the one-on/one-off table of upstream_sm90 vs fp64 on the golden cases is saved in reports/."""
    path = golden.DEFAULT_PATH.parent.parent.parent / "reports" / "sensitivity_upstream_sm90_golden.md"
    text = path.read_text(encoding="utf-8")
    assert all(f"`{s}`" in text for s in SWITCHES)
    assert "one_on" in text and "one_off" in text and "diag_mode" in text
