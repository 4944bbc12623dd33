"""Tests of the accuracy gates (``mimo_numerics.testing``) and their pytest plugin (``mimo_numerics.pytest_plugin``).

Broken kernels are built from the reference: a skipped rounding site (``out=False``), ``mul_then_add`` where the
policy says ``fma``, a NaN, a wrong dtype or shape. Correct ones: the reference itself, FP32-reordered variants and
the real upstream kernel's H200 outputs (replayed from ``tests/data``).
"""

import functools
import importlib.metadata
import importlib.util
import json
import math
import os

import pytest
import torch

import mimo_numerics as mn
from mimo_numerics import testing, tolerances
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden, reference
from mimo_numerics.cases import CaseSpec, spec_from_seed_kwargs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import grid
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import MimoBwdFwdOutputs
from mimo_numerics.testing import assert_mamba_mimo_bwd_fwd, check_mamba_mimo_bwd_fwd
from mimo_numerics.ops.mamba_mimo_bwd_fwd import oracle as stage1_oracle

pytest_plugins = ["pytester"]

SM90 = mn.presets.get("upstream_sm90")
GATE_BF16 = [c for c in grid("gate") if c.dtype == "bfloat16"]
Z_CASE = grid("gate")[1]  # seed roZD: every output present


def ref_fn(policy):
    return functools.partial(reference.mamba_mimo_bwd_fwd, policy=policy)


def observable_out(case):
    """``out`` (and the diagonal inside it) reaches an output only through dmimo_o (reduced DOUT) or the Z branch."""
    return case.reduce_o or case.has_z


def caught(report):
    return {c.case_id for c in report.failed_cases}


def with_output(fn, **edits):
    """Wrap fn; each edit maps an output name to a function of (value, inputs) returning the new value."""

    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)._asdict()
        for name, edit in edits.items():
            out[name] = edit(out[name], args)
        return MimoBwdFwdOutputs(**out)

    return wrapped


# ---------------------------------------------------------------------------------------------------- correct fns
@pytest.mark.parametrize("preset,cases", [("upstream_sm90", "gate"), ("seed_bf16", "smoke"), ("fp32", "smoke"),
                                          ("upstream_sm90_fp16", "smoke"), ("fp64", "smoke")])
def test_plumbing_reference_passes_its_own_gate(preset, cases):
    """Plumbing: the reference gated against itself passes bit-exactly (the gate's wiring; implementations independent
    of the reference are gated in tests/test_gate_independent.py)."""
    report = check_mamba_mimo_bwd_fwd(reference.mamba_mimo_bwd_fwd, policy=preset, cases=cases, pass_policy=True,
                                      dtype_mismatch="adapt")
    assert report.passed, report.failure_message()
    assert len(report.checked) == len(grid(cases))
    for case in report.cases:
        for check in case.outputs:
            assert check.status == "absent" or (check.err_same == 0.0 and check.bit_equal == 1.0)


REORDERED = {
    "state_dim_order_seed1": lambda p: testing.permute_state_dim(ref_fn(p), seed=1),
    "state_dim_order_seed2": lambda p: testing.permute_state_dim(ref_fn(p), seed=2),
    "other_state_update": lambda p: ref_fn(p.replace(state_update="separate" if p.state_update == "accumulate_into"
                                                     else "accumulate_into")),
    "fp64_math": lambda p: ref_fn(p.replace(math_dtype="float64")),
    "fp64_math_and_state_dim_order": lambda p: testing.permute_state_dim(ref_fn(p.replace(math_dtype="float64")),
                                                                         seed=3),
}


@pytest.mark.parametrize("preset", ["upstream_sm90", "fp32"])
@pytest.mark.parametrize("variant", sorted(REORDERED))
def test_reordered_but_correct_variants_pass(preset, variant):
    policy = mn.presets.get(preset)
    report = check_mamba_mimo_bwd_fwd(REORDERED[variant](policy), policy=policy,
                                      cases="gate" if preset == "upstream_sm90" else "smoke")
    assert report.passed, report.failure_message()


def test_permute_state_dim_changes_the_order_not_the_math():
    inputs = testing.case_inputs(Z_CASE)
    args = [inputs[n] for n in mn.INPUT_NAMES]
    kw = {"chunk_size": inputs["chunk_size"], "rotary_dim_divisor": inputs["rotary_dim_divisor"]}
    oracle = stage1_oracle.mamba_mimo_bwd_fwd_oracle(*args, **kw)
    permuted = testing.permute_state_dim(stage1_oracle.mamba_mimo_bwd_fwd_oracle, seed=5)(*args, **kw)
    for name in mn.OUTPUT_NAMES:
        assert mn.metrics.rel_rms(getattr(permuted, name), getattr(oracle, name)) < 1e-13, name


def test_output_forms_dict_and_tuple_pass():
    as_dict = lambda *a, **k: ref_fn(SM90)(*a, **k)._asdict()  # noqa: E731
    as_tuple = lambda *a, **k: tuple(ref_fn(SM90)(*a, **k))  # noqa: E731
    for fn in (as_dict, as_tuple):
        assert_mamba_mimo_bwd_fwd(fn, policy=SM90, cases="smoke")


# ---------------------------------------------------------------------------------------------------- broken fns
def test_skipped_out_rounding_is_caught_wherever_out_is_observable():
    report = check_mamba_mimo_bwd_fwd(ref_fn(SM90.replace(out=False)), policy=SM90, cases="gate")
    assert not report.passed
    # fo-D and fo-- have neither reduced DOUT nor Z: no output depends on `out`, so no gate can see it there.
    assert caught(report) == {c.case_id for c in GATE_BF16 if observable_out(c)}
    with pytest.raises(AssertionError) as info:
        report.raise_if_failed()
    message = str(info.value)
    assert "gate FAILED: policy upstream_sm90" in message
    assert "same-policy gate" in message and "vs ref[P]" in message and "ref vs fp64" in message
    for case_id in caught(report):
        assert case_id in message
    failing_outputs = {(cid, out) for cid, out, _ in report.failures()}
    assert (Z_CASE.case_id, "dz") in failing_outputs
    assert (Z_CASE.case_id, "states") not in failing_outputs  # out does not reach states


def test_mul_then_add_instead_of_fma_is_caught_wherever_the_diagonal_is_observable():
    report = check_mamba_mimo_bwd_fwd(ref_fn(SM90.replace(diag_mode="mul_then_add")), policy=SM90, cases="gate")
    assert caught(report) == {c.case_id for c in GATE_BF16 if observable_out(c)}
    assert all("same-policy gate" in reason for _, _, reason in report.failures()
               if not reason.startswith("noise-floor"))
    # a kernel implementing the seed PR's bf16 semantics does not pass as upstream on Hopper
    assert not check_mamba_mimo_bwd_fwd(ref_fn(mn.presets.get("seed_bf16")), policy=SM90, cases="gate").passed


def test_nan_and_inf_are_caught_with_their_index():
    def put(value, index, x):
        value = value.clone()
        value[index] = x
        return value

    fn = with_output(ref_fn(SM90), dz=lambda v, a: put(v, (0, 3, 0, 5), math.nan),
                     states=lambda v, a: put(v, (0, 0, 1, 2, 3), math.inf))
    report = check_mamba_mimo_bwd_fwd(fn, policy=SM90, cases=[Z_CASE])
    problems = dict(((out, reason) for _, out, reason in report.failures()))
    assert "1 NaN/Inf element(s) where the reference is finite (first at (0, 3, 0, 5))" in problems["dz"]
    assert "first at (0, 0, 1, 2, 3)" in problems["states"]
    dz = next(o for o in report.cases[0].outputs if o.output == "dz")
    assert dz.nonfinite == 1 and dz.err_same == 0.0  # the other elements still compare exactly


def test_wrong_dtypes_are_caught():
    fn = with_output(ref_fn(SM90), states=lambda v, a: v.float(), dmimo_o=lambda v, a: v.to(torch.bfloat16))
    report = check_mamba_mimo_bwd_fwd(fn, policy=SM90, cases=[Z_CASE])
    problems = {}
    for _, out, reason in report.failures():
        problems.setdefault(out, []).append(reason)
    assert problems["states"] == ["dtype torch.float32, expected torch.bfloat16 (the policy's lp_dtype bfloat16)"]
    assert problems["dmimo_o"][0] == "dtype torch.bfloat16, expected torch.float32 (FP32 accumulation output)"
    assert problems["dmimo_o"][1].startswith("same-policy gate")  # rounding dmimo_o to bf16 is also an error
    assert set(problems) == {"states", "dmimo_o"}


def test_wrong_shapes_and_branch_pattern_are_caught():
    no_z = grid("gate")[0]  # ro--: dz and dmimo_z absent
    fn = with_output(ref_fn(SM90), qk_dot=lambda v, a: v.transpose(-1, -2)[..., :1],
                     dz=lambda v, a: torch.zeros_like(a[3]), dmimo_o=lambda v, a: None)
    report = check_mamba_mimo_bwd_fwd(fn, policy=SM90, cases=[no_z])
    problems = {out: reason for _, out, reason in report.failures()}
    assert problems["qk_dot"] == "shape [1, 1, 32, 4, 1], expected [1, 1, 32, 4, 4]"
    assert problems["dz"].startswith("returned a tensor [1, 32, 1, 64] but the reference has no dz")
    assert problems["dmimo_o"].startswith("missing (None)")
    assert "branch off" in report.failure_message()


def test_exceptions_bad_returns_and_input_mutation_are_caught():
    def boom(*args, **kwargs):
        raise RuntimeError("kernel launch failed: too many resources requested")

    def four(*args, **kwargs):
        return tuple(ref_fn(SM90)(*args, **kwargs))[:4]

    def mutates(dout, *rest, **kwargs):
        out = ref_fn(SM90)(dout, *rest, **kwargs)
        dout.zero_()
        return out

    report = check_mamba_mimo_bwd_fwd(boom, policy=SM90, cases="smoke")
    assert report.failures()[0][2] == "fn raised RuntimeError: kernel launch failed: too many resources requested"
    assert "traceback of fn" in report.failure_message() and "in boom" in report.failure_message()
    report = check_mamba_mimo_bwd_fwd(four, policy=SM90, cases="smoke")
    assert "sequence of 4 items" in report.failures()[0][2]
    report = check_mamba_mimo_bwd_fwd(lambda *a, **k: {"dz": None}, policy=SM90, cases="smoke")
    assert "missing ['dmimo_o', 'states', 'dmimo_z', 'qk_dot']" in report.failures()[0][2]
    report = check_mamba_mimo_bwd_fwd(mutates, policy=SM90, cases="smoke")
    assert [r for _, o, r in report.failures()] == ["fn modified its input(s) ['dout'] in place"] * 2


def test_outputs_on_another_device_are_caught():
    fn = with_output(ref_fn(SM90), qk_dot=lambda v, a: torch.empty(v.shape, dtype=v.dtype, device="meta"))
    report = check_mamba_mimo_bwd_fwd(fn, policy=SM90, cases=[Z_CASE])
    reasons = [r for _, o, r in report.failures() if o == "qk_dot"]
    assert reasons[0] == "on device meta, expected the input device cpu"
    assert reasons[1].startswith("cannot be copied to the CPU")
    assert [o for _, o, _ in report.failures()] == ["qk_dot", "qk_dot"]


# ---------------------------------------------------------------------------------------------------- the real kernel
def _golden_replay():
    """fn returning the real upstream kernel's H200 outputs for the golden inputs, and the golden StoredCases."""
    data = golden.load_golden()

    def same(a, b):
        return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                             and torch.equal(a, b.cpu()))

    def replay(*tensors, **kwargs):
        for inputs, upstream in data.values():
            if all(same(inputs[n], t) for n, t in zip(mn.INPUT_NAMES, tensors)):
                return {n: (None if upstream[n] is None else upstream[n].to(tensors[1].device))
                        for n in mn.OUTPUT_NAMES}
        raise KeyError("not a golden input")

    return replay, golden.stored_cases()


def test_noise_factor_covers_upstream_h200():
    replay, specs = _golden_replay()
    report = check_mamba_mimo_bwd_fwd(replay, policy=SM90, cases=specs)
    assert report.passed, report.failure_message()
    # where one flipped lp rounding of the state cascades (seed_batch_groups), upstream differs from the reference
    # by more than same_policy_rel_rms; this case's own FP32-order noise floor (measured, not the kernel's) covers it
    without_noise = check_mamba_mimo_bwd_fwd(replay, policy=SM90, cases=specs, noise_factor=0.0)
    assert caught(without_noise) == {"seed_batch_groups"}
    # and the gate tells upstream on Hopper from the seed PR's bf16 semantics and from upstream on Ampere
    with_z = [spec for spec in specs if spec.has_z]  # (8 of the 15; the Z branch exposes SiLU and the diagonal)
    assert caught(check_mamba_mimo_bwd_fwd(replay, policy="seed_bf16", cases=with_z)) == {s.case_id for s in with_z}


def test_gate_defaults_reproduce_their_measurements():
    settings = testing.GateSettings.from_table()
    assert settings == testing.GateSettings(tolerances.get("same_policy_rel_rms"),
                                            tolerances.get("gate_same_policy_noise_factor"),
                                            tolerances.get("gate_oracle_alpha"), tolerances.get("gate_oracle_floor"))
    for preset in ("upstream_sm90", "fp32"):
        rows = testing.measure_gate_noise(preset, "gate")
        for row in rows:
            # every FP32-level perturbation of the reference stays inside the noise-floor gate, with headroom
            bound = settings.alpha * row["ref_err_oracle"] + settings.floor
            assert row["ref_err_oracle"] + row["excess"] <= bound, row
            if preset == "upstream_sm90":
                assert row["ratio"] <= 1 + (settings.alpha - 1) / 2, row
        if preset == "upstream_sm90":
            # FP32-order noise of the gate grid stays under the same-policy tolerance times the noise factor (where
            # a flipped rounding cascades above same_policy_rel_rms itself, the noise factor covers it: the golden
            # case seed_batch_groups, test_noise_factor_covers_upstream_h200)
            same = max(row["same"] for row in rows)
            assert 0 < same < settings.tol_same * settings.noise_factor


# ---------------------------------------------------------------------------------------------------- API details
def test_report_api_and_json():
    report = check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy="upstream_sm90", cases="smoke")
    assert report.passed and len(report.cases) == 3 and len(report.checked) == 2
    assert report.cases[2].skipped.startswith("case dtype float16 differs from the policy's lp_dtype bfloat16")
    data = json.loads(report.to_json())
    assert data["passed"] and data["policy_label"] == "upstream_sm90" and len(data["cases"]) == 3
    header = report.table().splitlines()[0].split()
    assert header[:4] == ["case", "output", "status", "vs"] and "bit-eq" in header
    assert "PASSED" in str(report)
    custom = check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=SM90.replace(out=False), cases="smoke")
    assert "upstream_sm90 with out=False" in custom.summary()


def test_arguments_are_validated(tmp_path):
    with pytest.raises(ValueError, match="alpha must be >= 1"):
        check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=SM90, cases="smoke", alpha=0.5)
    with pytest.raises(ValueError, match="unknown grid"):
        check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=SM90, cases="nope")
    with pytest.raises(TypeError, match="must be a CaseSpec"):
        check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=SM90, cases=[{"seqlen": 8}])
    with pytest.raises(ValueError, match="dtype_mismatch"):
        check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=SM90, cases="smoke", dtype_mismatch="ignore")
    with pytest.raises(TypeError, match="fn must be callable"):
        check_mamba_mimo_bwd_fwd(None, policy=SM90)
    path = tmp_path / "policy.json"
    path.write_text(SM90.to_json())
    assert check_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=str(path), cases="smoke").passed
    fp16_only = [c for c in grid("smoke") if c.dtype == "float16"]
    with pytest.raises(AssertionError, match="no case was run"):
        assert_mamba_mimo_bwd_fwd(ref_fn(SM90), policy=SM90, cases=fp16_only)


def test_cache_is_per_case_and_policy():
    case = grid("smoke")[0]
    assert testing.reference_outputs(case, SM90) is testing.reference_outputs(case, "upstream_sm90")
    assert testing.reference_outputs(case, SM90) is not testing.reference_outputs(case, "seed_bf16")
    assert testing.oracle_outputs(case) is testing.oracle_outputs(case)


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


def test_plugin_parametrizes_over_the_grid_with_case_ids(pytester):
    pytester.makepyfile(test_mimo_plugin_ids="""
        import pytest
        from mimo_numerics.cases import CaseSpec

        def test_default(mimo_case):
            pass

        @pytest.mark.mimo_grid([CaseSpec(seqlen=8, chunk_size=4), CaseSpec(seqlen=12, chunk_size=4)])
        def test_marked(mimo_case):
            pass
    """)
    result = _run(pytester, "--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert f"test_mimo_plugin_ids.py::test_default[{grid('gate')[0].case_id}]" in ids
    assert sum("test_default[" in i for i in ids) == len(grid("gate"))
    assert f"test_mimo_plugin_ids.py::test_marked[{CaseSpec(seqlen=8, chunk_size=4).case_id}]" in ids
    assert sum("test_marked[" in i for i in ids) == 2
    result = _run(pytester, "--collect-only", "-q", "--mimo-grid", "smoke")  # the option wins over the marker
    ids = [line for line in result.outlines if "::" in line]
    assert len(ids) == 2 * len(grid("smoke")) and f"test_marked[{grid('smoke')[0].case_id}]" in "".join(ids)
    result = _run(pytester, "--mimo-grid", "huge")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mimo-grid 'huge': unknown grid*"])


def test_plugin_policy_selection(pytester, tmp_path, monkeypatch):
    pytester.makepyfile(test_mimo_plugin_policy="""
        import os, pytest

        def test_default(mimo_policy):
            assert mimo_policy.name == os.environ["EXPECT_DEFAULT"]

        @pytest.mark.mimo_policy("seed_bf16")
        def test_marked(mimo_policy):
            assert mimo_policy.name == os.environ["EXPECT_MARKED"]
    """)
    path = tmp_path / "mine.json"
    path.write_text(SM90.replace(out=False).to_json())
    cases = [((), "upstream_sm90", "seed_bf16"), (("--mimo-policy", "fp32"), "fp32", "fp32"),
             (("--mimo-policy", str(path)), "custom", "custom")]
    for args, default, marked in cases:
        monkeypatch.setenv("EXPECT_DEFAULT", default)
        monkeypatch.setenv("EXPECT_MARKED", marked)
        _run(pytester, *args).assert_outcomes(passed=2)
    pytester.makeini("[pytest]\nmimo_policy = upstream_sm80\n")
    monkeypatch.setenv("EXPECT_DEFAULT", "upstream_sm80")
    monkeypatch.setenv("EXPECT_MARKED", "seed_bf16")
    _run(pytester).assert_outcomes(passed=2)
    result = _run(pytester, "--mimo-policy", "no_such_preset")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_plugin_gate_fixture_passes_fails_and_skips(pytester):
    pytester.makepyfile(test_mimo_plugin_gate="""
        import functools, pytest
        from mimo_numerics import reference

        @pytest.mark.mimo_grid("smoke")
        def test_good(mimo_gate, mimo_policy):
            mimo_gate(functools.partial(reference.mamba_mimo_bwd_fwd, policy=mimo_policy))

        @pytest.mark.mimo_grid("smoke")
        def test_broken(mimo_gate, mimo_policy):
            mimo_gate(functools.partial(reference.mamba_mimo_bwd_fwd, policy=mimo_policy.replace(out=False)))
    """)
    result = _run(pytester, "-rs")
    result.assert_outcomes(passed=2, failed=2, skipped=2)
    result.stdout.fnmatch_lines([
        "mamba_mimo_bwd_fwd gate FAILED: policy upstream_sm90*",
        "output*status*vs ref?P?*noise*tol*use*vs fp64*ref vs fp64*ratio*limit*bit-eq*note*",
        "case seed_*",
        "dz*FAIL*same-policy gate*",
        "*mimo_numerics gates*",
        "*4 case gate(s) run, 2 failed, 2 skipped*",
        "*SKIPPED*case dtype float16 differs from the policy's lp_dtype bfloat16*",
    ])


def _failure_section(result):
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "= FAILURES =" in line)
    end = next(i for i, line in enumerate(lines) if "= mimo_numerics gates =" in line)
    return [line for line in lines[start + 1:end] if not line.startswith("_____")]


def test_plugin_gate_failure_is_the_table_alone_and_names_the_nearest_preset(pytester):
    """A kernel that implements seed_bf16 while claiming upstream_sm90 (the reference under seed_bf16): the failure
    is the report's table (no plugin frames, no fixture reprs), fits 120 columns and names seed_bf16 and how it
    differs; a kernel broken otherwise (a skipped rounding) is as far from every preset and gets no such hint."""
    pytester.makepyfile(test_mimo_plugin_wrong="""
        import functools, pytest
        from mimo_numerics import presets, reference

        @pytest.mark.mimo_grid("smoke")
        def test_seed_semantics(mimo_gate):
            mimo_gate(functools.partial(reference.mamba_mimo_bwd_fwd, policy=presets.get("seed_bf16")))

        @pytest.mark.mimo_grid("smoke")
        def test_skipped_rounding(mimo_gate, mimo_policy):
            mimo_gate(functools.partial(reference.mamba_mimo_bwd_fwd, policy=mimo_policy.replace(out=False)))
    """)
    result = _run(pytester, "-k", "seed_semantics")
    result.assert_outcomes(failed=2, skipped=1)
    section = _failure_section(result)
    text = "\n".join(section)
    assert "gate FAILED" in text and "same-policy gate" in text
    for unwanted in ("Traceback", "self = GateReport", "mimo_policy = RoundingPolicy", "pytest_plugin.py",
                     "AssertionError", "raise_if_failed"):
        assert unwanted not in text, unwanted
    assert max(len(line) for line in section) <= testing.FAILURE_WIDTH, max(section, key=len)
    flat = " ".join(text.split())  # the hint is wrapped to the width
    assert flat.count("hint: outputs look like preset `seed_bf16`") == 2
    assert "mean rel RMS 0 (bit-exact) to it" in flat and "diag_mode=mul_then_add" in flat
    result = _run(pytester, "-k", "skipped_rounding")
    result.assert_outcomes(failed=2, skipped=1)
    assert "outputs look like preset" not in "\n".join(_failure_section(result))


def test_failure_message_of_the_api_fits_and_names_the_nearest_preset():
    seed = mn.presets.get("seed_bf16")
    with pytest.raises(AssertionError) as excinfo:
        assert_mamba_mimo_bwd_fwd(ref_fn(seed), policy="upstream_sm90", cases="smoke")
    message = str(excinfo.value)
    assert message.startswith("mamba_mimo_bwd_fwd gate FAILED")
    assert max(len(line) for line in message.splitlines()) <= testing.FAILURE_WIDTH
    assert "outputs look like preset `seed_bf16` on 2 failing cases" in " ".join(message.split())
    report = check_mamba_mimo_bwd_fwd(ref_fn(seed), policy="upstream_sm90", cases="smoke")
    matches = report.nearest_presets()
    assert [m.nearest for m in matches] == ["seed_bf16", "seed_bf16"] and all(m.better for m in matches)
    assert all(m.nearest_distance == 0 and m.claimed_distance > 0 for m in matches)
    assert "diag_mode=mul_then_add" in matches[0].differences()
    # the wide table of the programmatic API is unchanged: one row per case and output, with the case column
    assert report.table().splitlines()[0].startswith("case ")
    assert report.table(width=100) != report.table()
    assert "fn_outputs" not in json.dumps(report.to_dict())


def test_a_device_that_is_not_here_is_refused_before_any_case_runs():
    calls = []

    def fn(*args, **kwargs):
        calls.append(1)
        return reference.mamba_mimo_bwd_fwd(*args, **kwargs)

    for device, reason in (("cuda", "torch has no CUDA device here"), ("npu", "torch_npu is not installed"),
                           ("nonsense", "not a torch device"), ("meta", "meta tensors hold no values")):
        if device == "cuda" and torch.cuda.is_available():
            continue
        if device == "npu" and importlib.util.find_spec("torch_npu") is not None:
            continue
        with pytest.raises(testing.DeviceUnavailableError, match=reason) as excinfo:
            check_mamba_mimo_bwd_fwd(fn, policy="upstream_sm90", cases="smoke", device=device)
        assert isinstance(excinfo.value, ValueError) and excinfo.value.hint
    assert not calls
    assert testing.check_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the usage error raised without CUDA")
def test_plugin_refuses_an_unusable_device_at_start(pytester):
    pytester.makepyfile(test_mimo_plugin_device="""
        import functools
        from mimo_numerics import reference

        def test_kernel(mimo_gate, mimo_policy):
            mimo_gate(functools.partial(reference.mamba_mimo_bwd_fwd, policy=mimo_policy))
    """)
    for args, expected in ((("--mimo-device", "cuda"), "*--mimo-device cuda: torch has no CUDA device here*hint:*"),
                           (("--mimo-device", "tpu9"), "*--mimo-device tpu9: not a torch device*")):
        result = _run(pytester, *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([expected])
        assert "Traceback" not in result.stdout.str() + result.stderr.str()
        assert "failed" not in result.stdout.str()
    pytester.makeini("[pytest]\nmimo_device = cuda\n")
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini mimo_device cuda: torch has no CUDA device here*"])
