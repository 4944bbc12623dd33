"""RoundingPolicy: sections per operator, presets, edits, JSON round trip (v2 and v1) and the errors."""

import json
import warnings

import pytest

import mimo_numerics as mn
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba_mimo_bwd_fwd.sites import SITES as STAGE1_SITES
from mimo_numerics.policy import (ALL_KNOBS, FP32_LEVEL_DEFAULTS, FUTURE_KNOBS, KNOB_CONSUMERS, KNOBS,
                                  PolicyUndefined, RoundingPolicy, Sites, field_names)

STAGE1 = "mamba_mimo_bwd_fwd"
ISSUE_SWITCHES = ("psi_weight qk_bias phi_weight dt_input qk_biased psiv shifted_gamma trap_scale qk_dot_internal "
                  "rotary k_scaled state_operand causal_scores diag_accum diag_gamma out dphio dz_accum k_state").split()


def test_stage1_section_has_every_switch_of_the_catalog():
    assert list(STAGE1_SITES) == ISSUE_SWITCHES
    assert list(mn.presets.get("upstream_sm90").section(STAGE1)) == ISSUE_SWITCHES
    assert set(field_names(STAGE1)) == {f"{STAGE1}.{s}" for s in ISSUE_SWITCHES} | set(KNOBS) | set(FUTURE_KNOBS)
    assert set(field_names()) == set(ALL_KNOBS) | {f"{op}.{s}" for op in registry.OPERATORS
                                                   for s in registry.site_table(op)}


def test_policy_is_frozen_and_hashable():
    policy = mn.presets.get("upstream_sm90")
    with pytest.raises(Exception):
        policy.lp_dtype = "float16"
    with pytest.raises(Exception):
        policy.section(STAGE1).out = False
    assert len({policy, mn.presets.get("upstream_sm90"), mn.presets.get("seed_bf16")}) == 2


@pytest.mark.parametrize("name", mn.presets.names())
def test_policy_json_round_trip_is_exact(name):
    policy = mn.presets.get(name)
    again = RoundingPolicy.from_json(policy.to_json())
    assert again == policy and again.diff(policy) == {}
    assert RoundingPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    assert json.loads(policy.to_json())["schema_version"] == 2


def test_policy_presets_model_the_documented_semantics():
    fp64, fp32 = mn.presets.get("fp64"), mn.presets.get("fp32")
    seed, sm90 = mn.presets.get("seed_bf16"), mn.presets.get("upstream_sm90")
    for op in registry.OPERATORS:  # fp64, fp32 and upstream_* cover every operator
        assert fp64.switches_on(op) == () and fp32.switches_on(op) == ()
        assert sm90.switches_on(op) == tuple(registry.site_table(op))
    assert fp64.math_dtype == "float64" and not fp64.round_outputs
    assert fp32.math_dtype == "float32" and fp32.round_outputs
    assert seed.switches_on(STAGE1) == tuple(STAGE1_SITES)
    assert (seed.diag_mode, seed.silu_form, seed.state_update) == ("mul_then_add", "sigmoid", "separate")
    assert (sm90.diag_mode, sm90.silu_form, sm90.state_update) == ("fma", "tanh", "accumulate_into")
    assert mn.presets.get("upstream_sm80").diag_mode == "mul_then_add"
    assert mn.presets.get("upstream_sm90_fp16").lp_dtype == "float16"
    assert mn.presets.get("upstream_sm80_fp16").diag_mode == "fma"
    assert set(seed.diff(sm90)) >= {"diag_mode", "state_update", "silu_form"}
    for name in mn.presets.names():
        assert len(mn.presets.describe(name)) > 40, name


def test_seed_bf16_defines_stage1_only_and_says_so_elsewhere():
    seed = mn.presets.get("seed_bf16")
    assert seed.defined_operators() == (STAGE1,)
    for op in registry.OPERATORS:
        if op == STAGE1:
            continue
        with pytest.raises(PolicyUndefined, match=op):
            seed.section(op)
        assert "not defined" in mn.presets.describe("seed_bf16")


def test_sections_are_addressable_by_name():
    sm90 = mn.presets.get("upstream_sm90")
    assert sm90.mamba_mimo_bwd_fwd.psiv is True and sm90.get(f"{STAGE1}.psiv") is True
    assert isinstance(sm90.section(STAGE1), Sites) and sm90.section(STAGE1)["out"] is True
    with pytest.raises(ValueError, match="operator"):
        sm90.section("no_such_op")
    with pytest.raises(AttributeError, match="no field"):
        sm90.no_such_field


def test_policy_replace_and_diff():
    base = mn.presets.get("upstream_sm90")
    changed = base.replace(out=False, diag_mode="mul_then_add")  # a bare site name is stage 1's (as before)
    assert changed.diff(base) == {"diag_mode": ("mul_then_add", "fma"), f"{STAGE1}.out": (False, True)}
    assert changed.name == "custom" and base.name == "upstream_sm90"
    assert base.replace(**{f"{STAGE1}.out": False}) == base.with_sites(STAGE1, out=False) == changed.replace(
        diag_mode="fma")
    assert base.replace(**{STAGE1: "none"}).switches_on(STAGE1) == ()
    assert base.replace(**{STAGE1: None}).diff(base) == {STAGE1: (None, "defined")}


def test_policy_label_per_operator():
    seed = mn.presets.get("seed_bf16")
    assert seed.label(STAGE1) == "seed_bf16" and seed.name == "seed_bf16"


def test_policy_unknown_field_raises_naming_it():
    with pytest.raises(ValueError, match="bogus_site"):
        mn.presets.get("fp32").replace(bogus_site=True)
    with pytest.raises(ValueError, match="bogus_site"):
        mn.presets.get("fp32").replace(**{f"{STAGE1}.bogus_site": True})
    with pytest.raises(ValueError, match="bogus_site"):
        RoundingPolicy.from_dict({"schema_version": 1, "bogus_site": True})
    with pytest.raises(ValueError, match="bogus_op"):
        RoundingPolicy.from_dict({"schema_version": 2, "base": "fp32", "sites": {"bogus_op": "all"}})


def test_policy_unknown_value_raises_naming_it():
    with pytest.raises(ValueError, match="diag_mode"):
        RoundingPolicy(diag_mode="fused")
    with pytest.raises(ValueError, match="lp_dtype"):
        RoundingPolicy.from_json('{"schema_version": 2, "base": "fp32", "lp_dtype": "float8"}')
    with pytest.raises(ValueError, match="out"):
        mn.presets.get("fp32").replace(out="yes")
    with pytest.raises(ValueError, match="round_outputs"):
        RoundingPolicy(round_outputs=1)


def test_policy_json_from_the_future_or_broken_is_refused():
    with pytest.raises(ValueError, match="schema_version"):
        RoundingPolicy.from_json('{"schema_version": 99}')
    with pytest.raises(ValueError, match="not valid JSON"):
        RoundingPolicy.from_json("{nope")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        RoundingPolicy.from_json("{nope", source="bad.json")


def test_partial_v2_file_needs_a_base():
    with pytest.raises(ValueError, match="lacks.*base"):
        RoundingPolicy.from_json('{"schema_version": 2, "diag_mode": "fma"}')
    policy = RoundingPolicy.from_json('{"schema_version": 2, "base": "upstream_sm90", "diag_mode": "mul_then_add", '
                                      f'"sites": {{"{STAGE1}": {{"out": false}}}}}}')
    assert policy.diff(mn.presets.get("upstream_sm90")) == {"diag_mode": ("mul_then_add", "fma"),
                                                            f"{STAGE1}.out": (False, True)}


def _v1(policy):
    """The version-1 dict the single-operator package wrote for ``policy`` (flat stage-1 switches and knobs)."""
    return {"schema_version": 1, **policy.section(STAGE1).to_dict(), **{k: getattr(policy, k) for k in ALL_KNOBS}}


@pytest.mark.parametrize("name", mn.presets.names())
def test_version_1_files_still_load(name):
    preset = mn.presets.get(name)
    loaded = RoundingPolicy.from_dict(_v1(preset))
    assert loaded.section(STAGE1) == preset.section(STAGE1)
    assert all(getattr(loaded, k) == getattr(preset, k) for k in ALL_KNOBS)
    assert loaded.defined_operators() == (STAGE1,) and loaded.label(STAGE1) in (name, mn.presets.name_of(
        preset, operator=STAGE1))


def test_version_1_missing_knobs_take_their_defaults_with_a_warning():
    data = _v1(mn.presets.get("seed_bf16"))
    for knob in FP32_LEVEL_DEFAULTS:  # the knobs a version-1 file may predate
        del data[knob]
    with pytest.warns(UserWarning, match="gemm_model"):
        loaded = RoundingPolicy.from_dict(data)
    assert loaded.section(STAGE1) == mn.presets.get("seed_bf16").section(STAGE1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RoundingPolicy.from_dict(_v1(mn.presets.get("seed_bf16")))  # a complete v1 file loads silently


@pytest.mark.parametrize("knob", sorted(KNOB_CONSUMERS))
def test_policy_fp32_level_models_need_fp32_math(knob):
    """Every other value of an FP32-level knob models FP32 arithmetic: with float64 math it is refused, by name."""
    other = KNOBS[knob][1]
    RoundingPolicy(**{knob: other})  # honoured where KNOB_CONSUMERS says
    with pytest.raises(ValueError, match=f"{knob}={other!r} models FP32 arithmetic"):
        RoundingPolicy(math_dtype="float64", **{knob: other})


@pytest.mark.parametrize("model", ["sm90_wgmma", "sm80_mma"])
def test_policy_gemm_model_is_a_knob_with_a_json_round_trip(model):
    policy = mn.presets.get("upstream_sm90").replace(gemm_model=model)
    assert RoundingPolicy.from_json(policy.to_json()) == policy
    assert policy.diff(mn.presets.get("upstream_sm90")) == {"gemm_model": (model, "fp32")}


def test_policy_gemm_model_needs_float32_math():
    with pytest.raises(ValueError, match="gemm_model"):
        RoundingPolicy(gemm_model="sm90_wgmma", math_dtype="float64")


@pytest.mark.parametrize("knob,value", [("gemm_model", "sm80_mma"), ("reduction_order", "sequential_time")])
def test_require_default_names_the_knob_and_the_consumer(knob, value):
    from mimo_numerics.policy import require_default

    require_default(mn.presets.get("upstream_sm90"), knob, "anything")  # the default: nothing to refuse
    with pytest.raises(NotImplementedError, match=rf"{knob}='{value}'.*the widget"):
        require_default(mn.presets.get("upstream_sm90").replace(**{knob: value}), knob, "the widget")
    with pytest.raises(ValueError, match="knob must be one of"):
        require_default(mn.presets.get("upstream_sm90"), "diag_mode", "the widget")


def test_presets_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="upstream_sm90"):
        mn.presets.get("upstream_sm100")


def test_presets_resolve_accepts_json_files(tmp_path):
    path = tmp_path / "p.json"
    policy = mn.presets.get("seed_bf16").replace(out=False)
    path.write_text(policy.to_json())
    assert mn.presets.resolve(str(path)) == policy
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="bad.json"):
        mn.presets.resolve(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        mn.presets.resolve(str(tmp_path / "missing.json"))


def test_policies_pickle():
    import pickle

    for name in mn.presets.names():
        policy = mn.presets.get(name)
        assert pickle.loads(pickle.dumps(policy)) == policy


def test_with_float64_math_resets_the_fp32_level_models():
    from mimo_numerics.policy import with_float64_math

    modelled = mn.presets.get("upstream_sm90").replace(gemm_model="sm90_wgmma", reduction_order="sequential_time")
    wide = with_float64_math(modelled)
    assert wide.math_dtype == "float64" and wide.gemm_model == "fp32" and wide.reduction_order == "pairwise"
    assert wide.section(STAGE1) == modelled.section(STAGE1)
