"""The accuracy gates (``mimo_numerics.testing``, ``mimo_numerics.pytest_plugin``) on the forward and on stage 2.

Correct "kernels": each operator's policy reference under the claimed policy, FP32-reordered variants of it, and
the real upstream H200 outputs of the whole-op golden cases (replayed from ``tests/data``). Wrong ones: the
reference under another policy. Stage 1's gate tests are ``tests/test_testing.py``.
"""

import functools
import importlib
import importlib.metadata
import inspect
import os

import pytest
import torch

from mimo_numerics import operator as _operator
from mimo_numerics import presets, testing, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec
from mimo_numerics.policy import PolicyUndefined

pytest_plugins = ["pytester"]

FWD, BWD = "mamba_mimo_fwd", "mamba_mimo_bwd_bwd"
OPS = (FWD, BWD)
SM90 = presets.get("upstream_sm90")


def ref_fn(op, policy):
    return functools.partial(_operator.get(op).load("reference"), policy=presets.resolve(policy))


def smoke(op, dtype="bfloat16"):
    return [c for c in _operator.get(op).cases("smoke") if c.dtype == dtype]


def caught(report):
    return {c.case_id for c in report.failed_cases}


# ---------------------------------------------------------------------------------------------------- correct fns
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("preset", ["upstream_sm90", "fp32", "upstream_sm90_fp16", "fp64"])
def test_plumbing_reference_passes_its_own_gate_bit_exactly(op, preset):
    """Plumbing: every operator's reference gated against itself passes bit-exactly (the gate's wiring per operator;
    independent implementations: tests/test_gate_independent.py)."""
    report = testing.check(_operator.get(op).load("reference"), op=op, policy=preset, cases="smoke",
                           pass_policy=True, dtype_mismatch="adapt")
    assert report.passed, report.failure_message()
    assert report.operator == op and len(report.checked) == len(_operator.get(op).cases("smoke"))
    for case in report.cases:
        assert [o.output for o in case.outputs] == list(_operator.get(op).output_names)
        for check in case.outputs:
            assert check.status == "absent" or (check.err_same == 0.0 and check.bit_equal == 1.0), check


@pytest.mark.parametrize("op", OPS)
def test_reordered_but_correct_variants_pass(op):
    cases = smoke(op) + [testing.resolve_cases("gate", op)[i] for i in (1, 7)]  # roZD; realistic foZD, d = 2
    for policy in (SM90, presets.get("fp32")):
        other = "separate" if policy.state_update == "accumulate_into" else "accumulate_into"
        variants = {
            "state_dim_order": testing.permute_state_dim(ref_fn(op, policy), seed=1, op=op),
            "other_state_update": ref_fn(op, policy.replace(state_update=other)),
            "fp64_math_and_state_dim_order": testing.permute_state_dim(
                ref_fn(op, policy.replace(math_dtype="float64")), seed=2, op=op),
        }
        for label, fn in variants.items():
            report = testing.check(fn, op=op, policy=policy, cases=cases)
            assert report.passed, (label, report.failure_message())


@pytest.mark.parametrize("op", OPS)
def test_permute_state_dim_changes_the_order_not_the_math(op):
    spec = _operator.get(op)
    case = testing.resolve_cases("gate", op)[7]  # N = 32, rotary_dim_divisor 2: every column in a rotary pair
    inputs = testing.case_inputs(case, op)
    args, kwargs = spec.args(inputs), spec.kwargs(inputs)
    oracle = testing.as_output_dict(spec.run_oracle(inputs), spec)
    permuted = testing.as_output_dict(testing.permute_state_dim(spec.load("oracle"), seed=5, op=op)(*args, **kwargs),
                                       spec)
    for name, value in oracle.items():
        if value is not None:
            assert rel_rms(permuted[name], value) < 1e-13, name
    # and it is a real perturbation: the FP32 reference sums in another order
    ref = testing.as_output_dict(testing.reference_outputs(case, SM90, op), spec)
    moved = testing.as_output_dict(testing.permute_state_dim(ref_fn(op, SM90), seed=5, op=op)(*args, **kwargs),
                                    spec)
    assert any(not torch.equal(moved[n], ref[n]) for n in ref if ref[n] is not None)


def test_state_dim_axes_come_from_the_shape_letters():
    fwd_inputs, fwd_outputs = testing.state_dim_axes(FWD)
    assert fwd_inputs == {"q": (-1, False), "k": (-1, False), "q_bias": (-1, False), "k_bias": (-1, False),
                          "angles": (-1, True)}
    assert fwd_outputs == {}
    bwd_inputs, bwd_outputs = testing.state_dim_axes(BWD)
    assert bwd_inputs["states"] == (-2, False) and bwd_inputs["angles"] == (-1, True)
    assert bwd_outputs == {"dq": (-1, False), "dk": (-1, False), "dangles": (-1, True)}
    assert testing.state_dim_axes(None)[1] == {"states": (-2, False)}  # the default operator: stage 1
    assert set(testing.noise_perturbations(SM90, op=FWD)) == {"fp64_math", "state_update", "state_dim_order"}


# ---------------------------------------------------------------------------------------------------- the real kernel
def _golden_replay(op):
    """fn returning upstream's H200 outputs of the whole-op golden cases, and those cases."""
    spec = _operator.get(op)
    specs = spec.load("golden")()
    golden = importlib.import_module(f"mimo_numerics.ops.{op}.golden")
    table = [(case, golden.upstream_outputs(case.case_id)) for case in specs]

    def replay(*tensors, **kwargs):
        for case, upstream in table:
            if all((a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                                 and torch.equal(a, b.cpu()))
                   for a, b in zip((case.inputs[n] for n in spec.input_names), tensors)):
                return {n: upstream.get(n) for n in spec.output_names}
        raise KeyError("not a golden input")

    return replay, specs


@pytest.mark.parametrize("op", OPS)
def test_gates_accept_the_real_h200_outputs(op):
    """The H200 outputs pass under the operator's entries; the generic (stage-1) entries would fail them, which is
    why the entries exist (mimo_numerics/tolerances.py, scripts/measure_gate_tolerances.py)."""
    replay, specs = _golden_replay(op)
    report = testing.check(replay, op=op, policy=SM90, cases=specs, dtype_mismatch="adapt")
    assert report.passed, report.failure_message()
    assert len(report.checked) == len(specs) >= 11
    generic = testing.check(replay, op=op, policy=SM90, cases=specs, dtype_mismatch="adapt",
                            tol_same=tolerances.get("same_policy_rel_rms"), alpha=tolerances.get("gate_oracle_alpha"))
    if op == FWD:
        assert caught(generic) == {"g_B1_S64_H2_N64_P64_R4_C16_plain"}
    else:
        assert len(caught(generic)) == 4 and "g_B1_S64_H2_N64_P64_R4_C16_seedformula" in caught(generic)
        seed = next(c for c in generic.cases if c.case_id == "g_B1_S64_H2_N64_P64_R4_C16_seedformula")
        d_d = next(o for o in seed.outputs if o.output == "dD")
        assert any(p.startswith("noise-floor gate") for p in d_d.problems)  # dD's own alpha entry lifts this


# ---------------------------------------------------------------------------------------------------- wrong fns
@pytest.mark.parametrize("op", OPS)
def test_another_policy_fails_with_a_clear_table_and_names_the_preset(op):
    case = smoke(op)[1]  # realistic, R = 2: the diagonal's fused multiply-add is observable
    with pytest.raises(AssertionError) as excinfo:
        testing.assert_gate(ref_fn(op, "upstream_sm80"), op=op, policy="upstream_sm90", cases=[case])
    message = str(excinfo.value)
    assert message.startswith(f"{op} gate FAILED: policy upstream_sm90")
    assert "same-policy gate" in message and "vs ref[P]" in message and "ref vs fp64" in message
    assert max(len(line) for line in message.splitlines()) <= testing.FAILURE_WIDTH
    flat = " ".join(message.split())
    assert "hint: outputs look like preset `upstream_sm80` on" in flat and "0 (bit-exact)" in flat
    assert "(diff from claimed: diag_mode=mul_then_add)" in flat  # the operator's fields only
    failing = {out for _, out, _ in testing.check(ref_fn(op, "upstream_sm80"), op=op, policy=SM90,
                                                   cases=[case]).failures()}
    assert failing == ({"o"} if op == FWD else {"dv"})  # stage 2: the diagonal reaches dv (the rank sum)


@pytest.mark.parametrize("op", OPS)
def test_fp32_semantics_fail_as_upstream_everywhere(op):
    report = testing.check(ref_fn(op, "fp32"), op=op, policy=SM90, cases="smoke")
    assert caught(report) == {c.case_id for c in smoke(op)}
    assert report.cases[-1].skipped.startswith("case dtype float16 differs")


def test_single_output_operators_take_the_tensor_and_check_its_structure():
    case = smoke(FWD)[1]  # unreduced output [B, S, R, H, P]
    bare = lambda *a, **k: ref_fn(FWD, SM90)(*a, **k).o  # noqa: E731
    assert testing.check(bare, op=FWD, policy=SM90, cases=[case]).passed
    problems = lambda fn: [r for _, _, r in testing.check(fn, op=FWD, policy=SM90, cases=[case]).failures()]  # noqa
    assert problems(lambda *a, **k: bare(*a, **k).sum(dim=2)) == ["shape [1, 20, 2, 16], expected [1, 20, 2, 2, 16]"]
    assert problems(lambda *a, **k: bare(*a, **k).float())[0] == (
        "dtype torch.float32, expected torch.bfloat16 (the policy's lp_dtype bfloat16)")
    assert problems(lambda *a, **k: {"out": bare(*a, **k)}) == [
        "fn returned a dict whose keys are not the outputs ['o'] of mamba_mimo_fwd: unknown ['out'], missing ['o']"]
    assert "expected mamba_mimo_fwd's outputs" in problems(lambda *a, **k: 3.0)[0]


def test_bad_arguments_are_refused_before_any_case_runs():
    calls = []

    def fn(*args, **kwargs):
        calls.append(1)
        return ref_fn(FWD, SM90)(*args, **kwargs)

    with pytest.raises(PolicyUndefined, match="defines no rounding for operator 'mamba_mimo_fwd'"):
        testing.check(fn, op=FWD, policy="seed_bf16", cases="smoke")
    with pytest.raises(ValueError, match="unknown operator 'nope'"):
        testing.check(fn, op="nope", policy=SM90, cases="smoke")
    with pytest.raises(ValueError, match="unknown grid 'whole_op' of mamba_mimo_bwd_fwd"):
        testing.check(fn, policy=SM90, cases="whole_op")
    with pytest.raises(TypeError, match="every case must be a CaseSpec .a case spec of mamba_mimo_bwd_fwd"):
        testing.check(fn, policy=SM90, cases=[OpCaseSpec()])
    assert not calls
    whole_op = testing.resolve_cases("whole_op", FWD)
    assert all(isinstance(c, OpCaseSpec) for c in whole_op)
    assert testing.resolve_cases(whole_op[0], FWD) == (whole_op[0],)


def test_caches_are_per_operator():
    case = smoke(FWD)[0]
    fwd_inputs, stage1_inputs = testing.case_inputs(case, FWD), testing.case_inputs(case)
    assert "dout" not in fwd_inputs and "dout" in stage1_inputs and "states" in testing.case_inputs(case, BWD)
    assert testing.reference_outputs(case, SM90, FWD) is testing.reference_outputs(case, "upstream_sm90", FWD)
    assert testing.reference_outputs(case, SM90, FWD) is not testing.reference_outputs(case, SM90)
    assert testing.oracle_outputs(case, BWD) is testing.oracle_outputs(case, BWD)


def test_per_operator_wrappers_are_check_with_the_operator():
    for name in registry.OPERATORS:
        check_op, assert_op = getattr(testing, f"check_{name}"), getattr(testing, f"assert_{name}")
        assert {f"check_{name}", f"assert_{name}"} <= set(testing.__all__)
        assert "op" not in inspect.signature(check_op).parameters and name in check_op.__doc__
    report = testing.check_mamba_mimo_fwd(ref_fn(FWD, SM90), policy=SM90, cases="smoke")
    assert report.operator == FWD and report.passed
    assert testing.assert_mamba_mimo_bwd_bwd(ref_fn(BWD, SM90), policy=SM90, cases="smoke").operator == BWD
    with pytest.raises(TypeError, match="check_mamba_mimo_fwd gates mamba_mimo_fwd only"):
        testing.check_mamba_mimo_fwd(ref_fn(FWD, SM90), op=BWD, policy=SM90)


# ---------------------------------------------------------------------------------------------------- tolerances
def test_tolerance_lookup_falls_back_from_operator_output_format_to_the_generic_entry(monkeypatch):
    assert tolerances.keys_for("x", "op", "out", "float16") == (
        "op.out.float16.x", "op.out.x", "op.float16.x", "op.x", "float16.x", "x")
    assert tolerances.keys_for("x") == ("x",)
    assert tolerances.lookup("same_policy_rel_rms", "mamba_mimo_bwd_fwd", "dz", "bfloat16")[0] == "same_policy_rel_rms"
    assert tolerances.lookup("same_policy_rel_rms", BWD, "dk", "bfloat16")[0] == f"{BWD}.dk.same_policy_rel_rms"
    assert tolerances.lookup("same_policy_rel_rms", BWD, "dq")[0] == f"{BWD}.same_policy_rel_rms"
    with pytest.raises(KeyError, match="unknown tolerance 'nope'"):
        tolerances.get("nope", BWD)
    # an output-and-format entry reaches the gate, its table and its message
    monkeypatch.setitem(tolerances.TOLERANCES, f"{FWD}.o.float16.same_policy_rel_rms",
                        tolerances.Tolerance(1e-5, "test entry", "this test"))
    fp16 = smoke(FWD, "float16")
    report = testing.check(ref_fn(FWD, "upstream_sm90_fp16"), op=FWD, policy="upstream_sm90_fp16", cases=fp16)
    check = report.cases[0].outputs[0]
    assert check.tol_base == 1e-5 and check.tol_entry == f"{FWD}.o.float16.same_policy_rel_rms"
    assert report.settings.tol_same == tolerances.get(f"{FWD}.same_policy_rel_rms")
    assert report.output_settings()[("o", "float16")].tol_same == 1e-5
    assert f"o: tol_same 1e-05 ({FWD}.o.float16.same_policy_rel_rms)" in str(report)


@pytest.mark.parametrize("op", OPS)
def test_gate_settings_hold_on_the_fp32_level_perturbations(op):
    """Every FP32-level perturbation of the reference passes both gates with the operator's settings (the
    measurement behind the generic noise-floor entries on this operator; the gate grid: the slow test below)."""
    for preset in ("upstream_sm90", "fp32"):
        for row in testing.measure_gate_noise(preset, "smoke", op=op):
            settings = testing.GateSettings.from_table(op=op, output=row["output"])
            assert row["ref_err_oracle"] + row["excess"] <= settings.alpha * row["ref_err_oracle"] + settings.floor
            assert row["same"] <= settings.tol_same, row


# reproduces the gate entries' CPU-noise figures: the forward's in the default suite (about 19 s on a loaded 2-core
# machine), stage 2's (81 s there) kept slow
@pytest.mark.parametrize("op", [FWD, pytest.param(BWD, marks=pytest.mark.slow)])
def test_gate_settings_hold_on_the_gate_grid(op):
    for preset in ("upstream_sm90", "fp32"):
        rows = testing.measure_gate_noise(preset, "gate", op=op)
        for row in rows:
            settings = testing.GateSettings.from_table(op=op, output=row["output"])
            assert row["ref_err_oracle"] + row["excess"] <= settings.alpha * row["ref_err_oracle"] + settings.floor
            assert row["same"] <= settings.tol_same, row
        assert 0 < max(row["same"] for row in rows)


# ---------------------------------------------------------------------------------------------------- the plugin
def _plugin_args():
    """``-p`` the plugin unless the installed package registers it through its ``pytest11`` entry point."""
    if not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        eps = importlib.metadata.entry_points()
        group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
        if any(ep.value == "mimo_numerics.pytest_plugin" for ep in group):
            return []
    return ["-p", "mimo_numerics.pytest_plugin"]


def _run(pytester, *args):
    return pytester.runpytest_inprocess(*_plugin_args(), "-p", "no:cacheprovider", *args)


def test_plugin_gates_the_forward_with_op(pytester):
    pytester.makepyfile(test_mimo_plugin_fwd="""
        import functools, pytest
        from mimo_numerics import presets
        from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd

        @pytest.mark.mimo_grid("smoke")
        def test_good(mimo_gate, mimo_policy):
            report = mimo_gate(functools.partial(mamba_mimo_fwd, policy=mimo_policy), op="mamba_mimo_fwd")
            assert report.operator == "mamba_mimo_fwd"

        @pytest.mark.mimo_grid("smoke")
        def test_fp32_semantics(mimo_gate):
            mimo_gate(functools.partial(mamba_mimo_fwd, policy=presets.get("fp32")), op="mamba_mimo_fwd")
    """)
    result = _run(pytester, "-rs")
    result.assert_outcomes(passed=2, failed=2, skipped=2)
    result.stdout.fnmatch_lines([
        "mamba_mimo_fwd gate FAILED: policy upstream_sm90*",
        "output*status*vs ref?P?*noise*tol*use*vs fp64*ref vs fp64*ratio*limit*bit-eq*note*",
        "o *FAIL*same-policy gate*",
        "*mimo_numerics gates*",
        "*4 case gate(s) run, 2 failed, 2 skipped (operator mamba_mimo_fwd)*",
        "*largest same-policy use:*(mamba_mimo_fwd, *",
    ])


def test_plugin_operator_marker_option_and_ini(pytester):
    pytester.makepyfile(test_mimo_plugin_ops="""
        import functools, pytest
        from mimo_numerics import operator

        def reference(op, policy):
            return functools.partial(operator.get(op).load("reference"), policy=policy)

        @pytest.mark.mimo_op("mamba_mimo_fwd")
        @pytest.mark.mimo_grid("whole_op")
        def test_whole_op(mimo_gate, mimo_op, mimo_policy, mimo_case):
            assert mimo_op == "mamba_mimo_fwd" and mimo_case.case_id.startswith("whole_op_")
            mimo_gate(reference(mimo_op, mimo_policy), pass_policy=True, dtype_mismatch="adapt")

        @pytest.mark.mimo_grid("smoke")
        def test_configured(mimo_gate, mimo_op, mimo_policy):
            mimo_gate(reference(mimo_op, mimo_policy))

        @pytest.mark.mimo_op("mamba_mimo_fwd")
        @pytest.mark.mimo_grid("whole_op")
        def test_wrong_operator_for_the_case(mimo_gate, mimo_policy):
            mimo_gate(reference("mamba_mimo_bwd_fwd", mimo_policy), op="mamba_mimo_bwd_fwd")
    """)
    result = _run(pytester, "--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert sum("test_whole_op[whole_op_" in i for i in ids) == 3
    result = _run(pytester, "-rs", "-k", "not wrong_operator")
    result.assert_outcomes(passed=5, skipped=1)  # 3 whole-op cases; the default operator on 2 bf16 smoke cases
    result = _run(pytester, "-rs", "--mimo-op", "mamba_mimo_bwd_bwd", "-k", "configured")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*mimo_numerics gates: op=mamba_mimo_bwd_bwd*",
                                 "*(operator mamba_mimo_bwd_bwd)*"])
    result = _run(pytester, "-k", "wrong_operator")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*is not a case of mamba_mimo_bwd_fwd*@pytest.mark.mimo_op('mamba_mimo_bwd_fwd')*"])
    # a grid name the test's operator lacks, from the command line, skips that test
    result = _run(pytester, "-rs", "--mimo-grid", "whole_op", "-k", "configured")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--mimo-grid 'whole_op' is not a grid of mamba_mimo_bwd_fwd*"])
    result = _run(pytester, "--mimo-op", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mimo-op 'nope': unknown operator*"])
    pytester.makeini("[pytest]\nmimo_op = mamba_mimo_fwd\n")
    _run(pytester, "-k", "configured").assert_outcomes(passed=2, skipped=1)


def test_plugin_skips_an_operator_the_policy_does_not_define(pytester):
    pytester.makepyfile(test_mimo_plugin_undefined="""
        import functools, pytest
        from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd

        @pytest.mark.mimo_policy("seed_bf16")
        @pytest.mark.mimo_grid("smoke")
        def test_forward(mimo_gate, mimo_policy):
            mimo_gate(functools.partial(mamba_mimo_fwd, policy="upstream_sm90"), op="mamba_mimo_fwd")
    """)
    result = _run(pytester, "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*defines no rounding for operator 'mamba_mimo_fwd'*"])

