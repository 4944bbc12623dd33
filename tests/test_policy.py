"""RoundingPolicy: fields, presets, edits, JSON round trip and the errors for unknown fields/values."""

import json

import pytest

import mimo_numerics as mn
from mimo_numerics.policy import FUTURE_KNOBS, KNOBS, SWITCHES, RoundingPolicy, field_names

ISSUE_SWITCHES = ("psi_weight qk_bias phi_weight dt_input qk_biased psiv shifted_gamma trap_scale qk_dot_internal "
                  "rotary k_scaled state_operand causal_scores diag_accum diag_gamma out dphio dz_accum k_state").split()


def test_policy_has_every_switch_of_the_catalog():
    assert list(SWITCHES) == ISSUE_SWITCHES
    assert set(field_names()) == set(ISSUE_SWITCHES) | set(KNOBS) | set(FUTURE_KNOBS)


def test_policy_is_frozen_and_hashable():
    policy = mn.presets.get("upstream_sm90")
    with pytest.raises(Exception):
        policy.out = False
    assert len({policy, mn.presets.get("upstream_sm90"), mn.presets.get("seed_bf16")}) == 2


@pytest.mark.parametrize("name", mn.presets.names())
def test_policy_json_round_trip_is_exact(name):
    policy = mn.presets.get(name)
    again = RoundingPolicy.from_json(policy.to_json())
    assert again == policy and again.diff(policy) == {}
    assert RoundingPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    assert json.loads(policy.to_json())["schema_version"] == 1


def test_policy_presets_model_the_documented_semantics():
    fp64, fp32 = mn.presets.get("fp64"), mn.presets.get("fp32")
    seed, sm90 = mn.presets.get("seed_bf16"), mn.presets.get("upstream_sm90")
    assert fp64.switches_on() == () and fp64.math_dtype == "float64" and not fp64.round_outputs
    assert fp32.switches_on() == () and fp32.math_dtype == "float32" and fp32.round_outputs
    assert seed.switches_on() == tuple(SWITCHES) and sm90.switches_on() == tuple(SWITCHES)
    assert (seed.diag_mode, seed.silu_form, seed.state_update) == ("mul_then_add", "sigmoid", "separate")
    assert (sm90.diag_mode, sm90.silu_form, sm90.state_update) == ("fma", "tanh", "accumulate_into")
    assert mn.presets.get("upstream_sm80").diag_mode == "mul_then_add"
    assert mn.presets.get("upstream_sm90_fp16").lp_dtype == "float16"
    assert mn.presets.get("upstream_sm80_fp16").diag_mode == "fma"
    assert set(seed.diff(sm90)) == {"diag_mode", "state_update", "silu_form"}
    for name in mn.presets.names():
        assert len(mn.presets.describe(name)) > 40, name


def test_policy_replace_and_diff():
    base = mn.presets.get("upstream_sm90")
    changed = base.replace(out=False, diag_mode="mul_then_add")
    assert changed.diff(base) == {"diag_mode": ("mul_then_add", "fma"), "out": (False, True)}
    assert changed.name == "custom" and base.name == "upstream_sm90"


def test_policy_unknown_field_raises_naming_it():
    with pytest.raises(ValueError, match="bogus_site"):
        mn.presets.get("fp32").replace(bogus_site=True)
    with pytest.raises(ValueError, match="bogus_site"):
        RoundingPolicy.from_dict({"schema_version": 1, "bogus_site": True})


def test_policy_unknown_value_raises_naming_it():
    with pytest.raises(ValueError, match="diag_mode"):
        RoundingPolicy(diag_mode="fused")
    with pytest.raises(ValueError, match="lp_dtype"):
        RoundingPolicy.from_json('{"lp_dtype": "float8"}')
    with pytest.raises(ValueError, match="out"):
        RoundingPolicy(out="yes")
    with pytest.raises(ValueError, match="round_outputs"):
        RoundingPolicy(round_outputs=1)


def test_policy_json_from_the_future_or_broken_is_refused():
    with pytest.raises(ValueError, match="schema_version"):
        RoundingPolicy.from_json('{"schema_version": 99}')
    with pytest.raises(ValueError, match="not valid JSON"):
        RoundingPolicy.from_json("{nope")


def test_policy_missing_fields_take_defaults_so_old_json_still_loads():
    data = mn.presets.get("seed_bf16").to_dict()
    for knob in FUTURE_KNOBS:
        del data[knob]
    assert RoundingPolicy.from_dict(data) == mn.presets.get("seed_bf16")


@pytest.mark.parametrize("knob", sorted(FUTURE_KNOBS))
def test_policy_declared_but_unimplemented_knobs_raise_not_implemented(knob):
    other = FUTURE_KNOBS[knob][1]
    with pytest.raises(NotImplementedError, match=knob):
        RoundingPolicy(**{knob: other})


def test_presets_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="upstream_sm90"):
        mn.presets.get("upstream_sm100")


def test_presets_resolve_accepts_json_files(tmp_path):
    path = tmp_path / "p.json"
    policy = mn.presets.get("seed_bf16").replace(out=False)
    path.write_text(policy.to_json())
    assert mn.presets.resolve(str(path)) == policy
