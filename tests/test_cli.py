"""The ``mimo-numerics`` command line, end to end on CPU (reference backend, Triton interpreter, bundles)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mimo_numerics import cli
from mimo_numerics.bundles import cases_from_golden, load_bundle, save_bundle
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

GOLDEN = Path(__file__).parent / "data" / "upstream_h200_seed_cases.pt"
SMALL = "B=1,S=12,N=16,P=16,R=2,C=4,has_z=true,has_d=true"


def _kernels_unusable():
    try:
        from mimo_numerics import kernels
    except Exception as exc:  # pragma: no cover - depends on the checkout
        return f"mimo_numerics.kernels does not import: {exc}"
    if not kernels.triton_available():
        return "triton is not installed"
    if not hasattr(kernels, "mamba_mimo_bwd_fwd"):  # pragma: no cover
        return "mimo_numerics.kernels has no mamba_mimo_bwd_fwd"
    return None


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def smoke_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "smoke_ref"
    assert cli.main(["run", "--backend", "reference", "--policy", "upstream_sm90", "--grid", "smoke", "--out",
                     str(out), "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def golden_bundle(tmp_path_factory):
    return save_bundle(tmp_path_factory.mktemp("cli") / "golden", cases_from_golden(GOLDEN))


# ---------------------------------------------------------------------------------------------------------- run
def test_run_reference_smoke_writes_a_verified_bundle(smoke_reference, capsys):
    bundle = load_bundle(smoke_reference)
    assert len(bundle) == 3 and all(c.outputs is not None for c in bundle)
    assert {c.backend for c in bundle} == {"reference"}
    assert [c.policy.name for c in bundle] == ["upstream_sm90", "upstream_sm90", "upstream_sm90_fp16"]
    assert all(isinstance(c.spec, CaseSpec) and c.name == c.spec.case_id for c in bundle)
    assert all("torch" in c.versions and c.device == "cpu" and c.device_name.startswith("cpu") for c in bundle)
    assert bundle.meta["backend"] == "reference" and bundle.meta["grid"] == "smoke"
    code, out, _ = run_cli(capsys, "verify", str(smoke_reference))
    assert code == 0 and out.startswith("OK ") and "3 case(s)" in out
    code, out, _ = run_cli(capsys, "compare", str(smoke_reference), str(smoke_reference), "--threshold", "0")
    assert code == 0 and "OK: 3 case(s) compared" in out and "100.00%" in out


def test_run_prints_progress_on_stderr(tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", "--backend", "reference", "--case", SMALL, "--out", str(tmp_path / "b"))
    assert code == 0 and "wrote" in out
    assert "1/1" in err and "ok" in err


def test_run_triton_interpreter_smoke_matches_reference(smoke_reference, tmp_path, capsys):
    reason = _kernels_unusable()
    if reason:
        pytest.skip(f"Triton backend unusable here: {reason}")
    out = tmp_path / "smoke_triton"
    code, _, err = run_cli(capsys, "run", "--backend", "triton", "--policy", "upstream_sm90", "--grid", "smoke",
                           "--out", str(out))
    assert code == 0, err
    assert "runs in Triton's interpreter: about" in err and "estimated for 3 case(s)" in err
    bundle = load_bundle(out)
    assert {c.backend for c in bundle} == {"triton"} and all(c.outputs is not None for c in bundle)
    code, text, _ = run_cli(capsys, "compare", str(smoke_reference), str(out), "--threshold", "1e-3", "--json",
                            str(tmp_path / "m.json"))
    assert code == 0, text
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert set(metrics["cases"]) == set(load_bundle(smoke_reference).names())


@pytest.mark.parametrize("op_name", ["mamba_mimo_fwd", "mamba_mimo_bwd_bwd"])
def test_run_triton_of_the_forward_and_stage2_matches_the_reference(op_name, tmp_path, capsys):
    """The forward and stage 2 have Triton kernels too: ``run --op OP --backend triton`` writes a bundle that
    ``compare`` finds within 1e-3 of the reference's on the same case."""
    reason = _kernels_unusable()
    if reason:
        pytest.skip(f"Triton backend unusable here: {reason}")
    for backend in ("reference", "triton"):
        code, _, err = run_cli(capsys, "run", "--op", op_name, "--backend", backend, "--policy", "upstream_sm90",
                               "--case", SMALL, "--out", str(tmp_path / backend), "--quiet")
        assert code == 0, err
    assert {c.backend for c in load_bundle(tmp_path / "triton")} == {"triton"}
    code, text, _ = run_cli(capsys, "compare", str(tmp_path / "reference"), str(tmp_path / "triton"), "--threshold",
                            "1e-3")
    assert code == 0, text


def test_run_on_the_inputs_of_another_bundle(golden_bundle, tmp_path, capsys):
    out = tmp_path / "ref_on_golden"
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--inputs-from", str(golden_bundle), "--only",
                           "seed_branch_*", "--out", str(out), "--quiet")
    assert code == 0, err
    assert load_bundle(out).names() == ("seed_branch_ro1_z0_d0", "seed_branch_ro1_z1_d1", "seed_branch_ro0_z0_d1",
                                        "seed_branch_ro0_z1_d0")
    # same inputs, so compare accepts it; golden cases absent from B fail unless --allow-missing
    code, text, _ = run_cli(capsys, "compare", str(golden_bundle), str(out))
    assert code == 1 and "only in A" in text and "present in only one bundle" in text
    code, text, _ = run_cli(capsys, "compare", str(golden_bundle), str(out), "--allow-missing", "--threshold", "0.05")
    assert code == 0, text


def test_run_adapts_or_refuses_the_policy_dtype(tmp_path, capsys):
    fp16 = SMALL + ",dtype=float16"
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--policy", "upstream_sm90", "--case", fp16,
                           "--out", str(tmp_path / "a"))
    assert code == 0 and "lp_dtype set to float16" in err
    assert load_bundle(tmp_path / "a")[0].policy.lp_dtype == "float16"
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--policy", "upstream_sm90", "--case", fp16,
                           "--out", str(tmp_path / "b"), "--strict-dtype")
    assert code == 2 and "lp_dtype is bfloat16" in err and not (tmp_path / "b").exists()


def test_run_with_a_policy_file(tmp_path, capsys):
    from mimo_numerics import presets

    path = tmp_path / "p.json"
    path.write_text(presets.get("seed_bf16").replace(dz_accum=False).to_json())
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--policy", str(path), "--case", SMALL, "--out",
                           str(tmp_path / "b"), "--quiet")
    assert code == 0, err
    assert load_bundle(tmp_path / "b")[0].policy.get("dz_accum") is False


def test_run_refuses_an_existing_output(smoke_reference, capsys):
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--case", SMALL, "--out", str(smoke_reference))
    assert code == 2 and "already exists" in err and "--overwrite" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the error raised without CUDA")
def test_run_upstream_without_cuda_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", "--backend", "upstream", "--grid", "smoke", "--out", str(tmp_path / "u"))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("mimo-numerics: error: CUDA is not available") and "hint:" in err
    code, _, err = run_cli(capsys, "run", "--backend", "upstream", "--policy", "fp32", "--grid", "smoke", "--out",
                           str(tmp_path / "u"))
    assert code == 2 and "--policy does not apply" in err


def _unusable_devices():
    import importlib.util

    devices = [("nonsense", "not a torch device"), ("meta", "meta tensors hold no values")]
    if not torch.cuda.is_available():
        devices += [("cuda", "torch has no CUDA device here"), ("cuda:1", "torch has no CUDA device here")]
    if importlib.util.find_spec("torch_npu") is None:
        devices.append(("npu", "torch_npu is not installed"))
    return devices


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("device,reason", _unusable_devices())
def test_run_on_a_device_that_is_not_here_is_one_line_before_any_case(backend, device, reason, tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", "--backend", backend, "--device", device, "--case", SMALL, "--out",
                             str(tmp_path / "b"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"mimo-numerics: error: --device {device}: {reason}") and "(hint: " in err
    assert "Traceback" not in err and "AssertionError" not in err and "1/1" not in err
    assert not (tmp_path / "b").exists()


def test_run_triton_on_cpu_estimates_the_whole_run_and_refuses_it_above_the_limit(tmp_path, capsys, monkeypatch):
    """The interpreter's estimate applies to the run (sum over cases), not only per case: the sweep grid, whose
    cases each pass the per-case limit, is refused up front unless --allow-slow-interpreter."""
    reason = _kernels_unusable()
    if reason:
        pytest.skip(f"Triton backend unusable here: {reason}")
    from mimo_numerics import cases, kernels

    found = [(spec.case_id, spec, None) for spec in stage1_cases.grid("sweep")]
    total, per_case = cli.interpreter_estimate(found)
    assert all(seconds <= kernels.INTERPRETER_LIMIT_S for _, seconds in per_case)
    assert total > kernels.INTERPRETER_LIMIT_S
    assert total == pytest.approx(sum(s for _, s in per_case))
    # refusal and override, on one small case under a lowered limit (so the test never runs a long case)
    small_total, _ = cli.interpreter_estimate([("s", cli.parse_case_spec(SMALL), None)])
    monkeypatch.setattr(kernels, "INTERPRETER_LIMIT_S", small_total / 2)
    code, _, err = run_cli(capsys, "run", "--backend", "triton", "--case", SMALL, "--out", str(tmp_path / "a"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("mimo-numerics: error: --backend triton --device cpu: the 1 case(s) would take about")
    assert "--allow-slow-interpreter" in err and "1/1" not in err and not (tmp_path / "a").exists()
    code, _, err = run_cli(capsys, "run", "--backend", "triton", "--case", SMALL, "--out", str(tmp_path / "b"),
                           "--allow-slow-interpreter")
    assert code == 0, err
    assert "estimated for 1 case(s)" in err and load_bundle(tmp_path / "b")[0].outputs is not None


def test_run_triton_refuses_a_policy_it_cannot_express(tmp_path, capsys):
    if _kernels_unusable():
        pytest.skip(_kernels_unusable())
    code, _, err = run_cli(capsys, "run", "--backend", "triton", "--policy", "fp64", "--case", SMALL, "--out",
                           str(tmp_path / "t"))
    assert code == 2 and "math_dtype" in err and "--backend reference" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------------------- compare
def _variant(golden_bundle, tmp_path, name, edit):
    """A copy of two golden cases where ``edit(case) -> case`` changed seed_gqa."""
    bundle = load_bundle(golden_bundle)
    return save_bundle(tmp_path / name, [bundle.case("seed_tail_chunk"), edit(bundle.case("seed_gqa"))])


def test_compare_threshold_and_nan(golden_bundle, tmp_path, capsys):
    def bump(case):
        states = case.outputs.states.clone()
        states.view(-1)[0] += 1.0
        return case.replace(outputs=case.outputs._replace(states=states))

    def nan(case):
        dz = case.outputs.dz.clone()
        dz.view(-1)[3] = float("nan")
        return case.replace(outputs=case.outputs._replace(dz=dz))

    a = _variant(golden_bundle, tmp_path, "a", lambda c: c)
    b = _variant(golden_bundle, tmp_path, "b", bump)
    c = _variant(golden_bundle, tmp_path, "c", nan)
    code, text, _ = run_cli(capsys, "compare", str(a), str(b))
    assert code == 0 and "no threshold given" in text
    code, text, _ = run_cli(capsys, "compare", str(a), str(b), "--threshold", "1e-6")
    assert code == 1 and "> threshold" in text and "FAIL" in text and "states" in text
    code, text, _ = run_cli(capsys, "compare", str(a), str(b), "--threshold", "2", "--metric", "max_abs")
    assert code == 0
    code, text, _ = run_cli(capsys, "compare", str(a), str(c), "--threshold", "1e9", "--json", "-")
    assert code == 1 and "nan" in text
    report = json.loads(text[text.index("{"):text.rindex("}") + 1])
    assert report["cases"]["seed_gqa"]["dz"]["rel_rms"] is None and report["failures"]


def test_compare_refuses_different_inputs(golden_bundle, tmp_path, capsys):
    def other_inputs(case):
        q = case.inputs["q"].clone()
        q.view(-1)[0] = -q.view(-1)[0]
        return case.replace(inputs=dict(case.inputs, q=q))

    def other_q_and_dt(case):
        case = other_inputs(case)
        return case.replace(inputs=dict(case.inputs, dt=case.inputs["dt"] * 2))

    a = _variant(golden_bundle, tmp_path, "a", lambda c: c)
    b = _variant(golden_bundle, tmp_path, "b", other_inputs)
    code, _, err = run_cli(capsys, "compare", str(a), str(b))
    assert code == 2 and "inputs differ" in err and "--allow-different-inputs" in err
    assert "for 1 case(s): seed_gqa (q)" in err  # the tensor that differs, not only the case
    code, text, _ = run_cli(capsys, "compare", str(a), str(b), "--allow-different-inputs")
    assert code == 0 and "warning: inputs differ for 1 case(s) (--allow-different-inputs): seed_gqa (q)" in text
    c = _variant(golden_bundle, tmp_path, "c", other_q_and_dt)
    code, _, err = run_cli(capsys, "compare", str(a), str(c))
    assert code == 2 and "seed_gqa (q, dt)" in err


def test_compare_explains_bits_that_differ_only_in_the_sign_of_zero(golden_bundle, tmp_path, capsys):
    """-0 against +0: rel RMS and max abs are 0 while the bit-equal fraction is below 100 %; compare says why."""
    def zeros(sign):
        def edit(case):
            dz = case.outputs.dz.clone()
            dz.view(-1)[:3] = sign * 0.0
            return case.replace(outputs=case.outputs._replace(dz=dz))
        return edit

    a = _variant(golden_bundle, tmp_path, "a", zeros(1.0))
    b = _variant(golden_bundle, tmp_path, "b", zeros(-1.0))
    code, text, _ = run_cli(capsys, "compare", str(a), str(b), "--json", str(tmp_path / "m.json"))
    assert code == 0, text
    numel = load_bundle(a).case("seed_gqa").outputs.dz.numel()
    row = next(line for line in text.splitlines() if line.startswith("seed_gqa") and " dz " in line)
    assert "0.000e+00  0.000e+00" in row and "100.00%" not in row
    assert (f"note: {100 * 3 / numel:.2f} % of dz differ only in the sign of zero (-0 vs +0); every value is equal"
            in text)
    assert text.count("sign of zero") == 1  # the other outputs and the other case are bit-equal
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["cases"]["seed_gqa"]["dz"]["zero_sign_fraction"] == pytest.approx(3 / numel)
    assert metrics["cases"]["seed_gqa"]["states"]["zero_sign_fraction"] == 0


def test_compare_reports_skipped_cases(golden_bundle, tmp_path, capsys):
    a = _variant(golden_bundle, tmp_path, "a", lambda c: c)
    b = _variant(golden_bundle, tmp_path, "b", lambda c: c.replace(outputs=None, skipped="upstream limitation: x"))
    code, text, _ = run_cli(capsys, "compare", str(a), str(b), "--threshold", "0")
    assert code == 0 and "skipped in B: upstream limitation: x" in text


# ---------------------------------------------------------------------------------------------------------- errors
def test_verify_corrupt_bundle_is_one_line_unless_debug(golden_bundle, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(golden_bundle, copy)
    target = copy / "seed_gqa.outputs.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "verify", str(copy))
    assert code == 2 and err.count("\n") == 1
    assert "seed_gqa.outputs.safetensors: sha256 mismatch" in err and "hint:" in err
    code, _, err = run_cli(capsys, "--debug", "verify", str(copy))
    assert code == 2 and "Traceback" in err
    code, _, err = run_cli(capsys, "verify", str(tmp_path / "nothing"))
    assert code == 2 and "no such directory" in err and "check the path" in err


# ---------------------------------------------------------------------------------------------------------- --case
def test_case_spec_syntax(tmp_path):
    spec = cli.parse_case_spec("B=2, S=64,H=4,G=2,N=32,P=16,R=2,C=8,rd=2,has_z=yes,reduce_o=0,formula=realistic,"
                               "dtype=float16,seed=7")
    assert spec == CaseSpec(batch=2, seqlen=64, heads=4, groups=2, state_dim=32, value_dim=16, rank=2, chunk_size=8,
                            rotary_dim_divisor=2, has_z=True, reduce_o=False, formula="realistic", dtype="float16",
                            seed=7)
    assert cli.parse_case_spec('{"seqlen": 40, "has_d": true}') == CaseSpec(seqlen=40, has_d=True)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(CaseSpec(rank=1).to_dict()))
    assert cli.parse_case_spec(f"@{path}") == CaseSpec(rank=1)
    for bad, message in (("X=1", "unknown field 'X'"), ("S=abc", "not an integer"), ("has_z=maybe", "not a boolean"),
                         ("S=1,seqlen=2", "given twice"), ("S", "not key=value")):
        with pytest.raises(cli.CliError, match=message):
            cli.parse_case_spec(bad)
    with pytest.raises(ValueError, match="heads .* must be a multiple of groups"):
        cli.parse_case_spec("H=3,G=2")


# ---------------------------------------------------------------------------------------------------------- others
def test_presets_and_policy_commands(tmp_path, capsys):
    from mimo_numerics import presets

    code, out, _ = run_cli(capsys, "presets")
    assert code == 0 and all(name in out for name in presets.names()) and "evidence:" in out
    code, out, err = run_cli(capsys, "policy", "show", "upstream_sm90")
    assert code == 0 and "preset 'upstream_sm90'" in err
    assert presets.name_of(presets.RoundingPolicy.from_json(out)) == "upstream_sm90"
    path = tmp_path / "custom.json"
    path.write_text(presets.get("upstream_sm90").replace(out=False).to_json())
    code, out, err = run_cli(capsys, "policy", "show", str(path))
    assert code == 0 and "custom policy" in err
    code, out, _ = run_cli(capsys, "policy", "diff", "upstream_sm90", str(path))
    assert code == 0 and "out" in out and "True  ->  False" in out
    code, out, _ = run_cli(capsys, "policy", "diff", "upstream_sm90", "upstream_sm90")
    assert code == 0 and "identical" in out
    code, _, err = run_cli(capsys, "policy", "show", "nope")
    assert code == 2 and "unknown preset 'nope'" in err and "mimo-numerics presets" in err


def test_import_golden(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "import-golden", str(GOLDEN), "--out", str(tmp_path / "g"))
    assert code == 0 and "15 golden case(s)" in out
    assert len(load_bundle(tmp_path / "g")) == 15


def test_report_subcommand_delegates(capsys, monkeypatch):
    try:
        import mimo_numerics.report  # noqa: F401
        available = True
    except ImportError:
        available = False
    if available:
        with pytest.raises(SystemExit) as exc:
            cli.main(["report", "--help"])
        assert exc.value.code == 0
        assert "usage: mimo-numerics report" in capsys.readouterr().out
    import mimo_numerics

    monkeypatch.delattr(mimo_numerics, "report", raising=False)
    monkeypatch.setitem(sys.modules, "mimo_numerics.report", None)  # makes the import fail
    code, _, err = run_cli(capsys, "report")
    assert code == 2 and "report subcommand is unavailable" in err


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "mimo_numerics", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0
    for command in ("run", "compare", "verify", "upgrade", "presets", "policy", "report", "import-golden"):
        assert command in result.stdout


# ---------------------------------------------------------------------------------------------------------- operators
FWD, STAGE2 = "mamba_mimo_fwd", "mamba_mimo_bwd_bwd"


def test_progress_is_a_tqdm_bar(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--case", SMALL, "--out", str(tmp_path / "b"))
    assert code == 0 and "run mamba_mimo_bwd_fwd: 100%|" in err and "1/1 [" in err
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--case", SMALL, "--out", str(tmp_path / "c"),
                           "--quiet")
    assert code == 0 and err == ""


def test_forward_golden_data_run_and_compare_end_to_end(tmp_path, capsys):
    """The forward through the CLI: its golden H200 cases as a bundle, the reference on their inputs, and compare
    within the forward's measured gate (tolerances: fwd_golden_upstream_sm90_rel_rms, on the 7 ``g_`` cases)."""
    from mimo_numerics import tolerances

    golden = tmp_path / "golden_fwd"
    code, out, _ = run_cli(capsys, "import-golden", "--op", FWD, "--out", str(golden))
    assert code == 0 and f"12 golden case(s) of {FWD}" in out
    code, out, _ = run_cli(capsys, "verify", str(golden))
    assert code == 0 and f"operator {FWD}, 12 case(s)" in out
    ref = tmp_path / "ref_fwd"
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--inputs-from", str(golden), "--only", "g_*",
                           "--out", str(ref), "--quiet")
    assert code == 0, err
    bundle = load_bundle(ref)
    assert bundle.operator == FWD and len(bundle) == 7 and bundle.meta["operator"] == FWD
    assert {c.policy.name for c in bundle} == {"upstream_sm90"}
    threshold = str(tolerances.get("fwd_golden_upstream_sm90_rel_rms"))
    code, text, _ = run_cli(capsys, "compare", str(golden), str(ref), "--allow-missing", "--threshold", threshold,
                            "--json", str(tmp_path / "m.json"))
    assert code == 0, text
    assert f"[{FWD}; 12 cases; backend upstream" in text and "OK: 7 case(s) compared (within threshold)" in text
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["operator"] == FWD and all(set(m) == {"o"} for m in metrics["cases"].values())
    # the threshold has teeth: the fp32 preset is above it (on the case where it is nearest: 6.2e-3, tolerances)
    fp32 = tmp_path / "fp32_fwd"
    assert cli.main(["run", "--backend", "reference", "--policy", "fp32", "--inputs-from", str(golden), "--only",
                     "g_*_plain", "--out", str(fp32), "--quiet"]) == 0
    code, text, _ = run_cli(capsys, "compare", str(golden), str(fp32), "--allow-missing", "--threshold", threshold)
    assert code == 1 and "> threshold" in text


def test_stage2_golden_data_run_and_compare(tmp_path, capsys):
    """Stage 2 through the CLI on two golden cases: dq, dk, dv, dmimo_v of the reference within the stage-2 gate
    (tolerances: stage2_golden_lp_rel_rms); the partial terms are judged on Σ|terms| elsewhere, so no threshold."""
    from mimo_numerics import tolerances

    golden = tmp_path / "golden_s2"
    assert cli.main(["import-golden", "--op", STAGE2, "--out", str(golden)]) == 0
    ref = tmp_path / "ref_s2"
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--inputs-from", str(golden), "--only",
                           "g_*_plain", "--only", "g_*_nored_z", "--out", str(ref), "--quiet")
    assert code == 0, err
    code, text, _ = run_cli(capsys, "compare", str(golden), str(ref), "--allow-missing", "--json", "-")
    assert code == 0, text
    report = json.loads(text[text.index("{"):text.rindex("}") + 1])
    assert report["operator"] == STAGE2 and len(report["cases"]) == 2
    for case in report["cases"].values():
        assert set(case) == set(load_bundle(ref).op.output_names)
        for output in ("dq", "dk", "dv", "dmimo_v"):
            assert case[output]["rel_rms"] <= tolerances.get("stage2_golden_lp_rel_rms"), output
    assert report["cases"]["g_B1_S64_H2_N64_P64_R4_C16_plain"]["dD"] is None  # no D in that case


@pytest.mark.parametrize("op_name", [FWD, STAGE2])
def test_run_other_operators_on_grids_and_cases(op_name, tmp_path, capsys):
    out = tmp_path / "b"
    code, _, err = run_cli(capsys, "run", "--op", op_name, "--backend", "reference", "--policy", "fp32", "--case",
                           SMALL, "--grid", "smoke", "--only", "seed_*", "--out", str(out), "--quiet")
    assert code == 0, err
    bundle = load_bundle(out)
    assert bundle.operator == op_name and len(bundle) == 3
    assert [c.policy.name for c in bundle] == ["fp32", "custom", "fp32"]  # smoke's fp16 case: no fp32 fp16 preset
    assert bundle[1].meta["policy_name"] == "fp32 with lp_dtype=float16"
    # --inputs-from takes the bundle's operator; another --op is refused
    again = tmp_path / "again"
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--inputs-from", str(out), "--out", str(again),
                           "--quiet")
    assert code == 0, err
    assert load_bundle(again).operator == op_name
    code, text, _ = run_cli(capsys, "compare", str(out), str(again), "--op", op_name)
    assert code == 0 and "OK: 3 case(s) compared" in text
    code, _, err = run_cli(capsys, "run", "--op", "mamba_mimo_bwd_fwd", "--backend", "reference", "--inputs-from",
                           str(out), "--out", str(tmp_path / "never"))
    assert code == 2 and f"holds cases of {op_name}" in err and f"pass --op {op_name}" in err
    code, _, err = run_cli(capsys, "compare", str(out), str(again), "--op", "mamba_mimo_bwd_fwd")
    assert code == 2 and f"both bundles hold {op_name}" in err


def test_forward_whole_op_grid(tmp_path, capsys):
    from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec

    code, _, err = run_cli(capsys, "run", "--op", FWD, "--backend", "reference", "--grid", "whole_op", "--only",
                           "*_s0", "--out", str(tmp_path / "w"), "--quiet")
    assert code == 0, err
    [case] = load_bundle(tmp_path / "w").cases
    assert isinstance(case.spec, OpCaseSpec) and case.name == case.spec.case_id
    code, _, err = run_cli(capsys, "run", "--backend", "reference", "--grid", "whole_op", "--out", str(tmp_path / "x"))
    assert code == 2 and "unknown grid 'whole_op' of mamba_mimo_bwd_fwd" in err


def test_compare_refuses_bundles_of_different_operators(smoke_reference, tmp_path, capsys):
    other = tmp_path / "fwd"
    assert run_cli(capsys, "run", "--op", FWD, "--backend", "reference", "--grid", "smoke", "--out", str(other),
                   "--quiet")[0] == 0
    code, out, err = run_cli(capsys, "compare", str(smoke_reference), str(other))
    assert code == 2 and err.count("\n") == 1
    assert f"the bundles hold different operators: A ({smoke_reference}) mamba_mimo_bwd_fwd, B ({other}) {FWD}" in err


def test_backends_an_operator_lacks_are_one_line(tmp_path, capsys):
    from mimo_numerics import operator as _operator

    stage2 = _operator.get(STAGE2)
    kernels_path = stage2.kernels
    object.__setattr__(stage2, "kernels", None)  # every operator has kernels now: take stage 2's away (frozen)
    try:
        code, _, err = run_cli(capsys, "run", "--op", STAGE2, "--backend", "triton", "--case", SMALL, "--out",
                               str(tmp_path / "t"))
    finally:
        object.__setattr__(stage2, "kernels", kernels_path)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"mimo-numerics: error: --backend triton: operator {STAGE2} has no kernels (hint: "
                          "--backend triton exists for mamba_mimo_fwd, mamba_mimo_bwd_fwd; use --backend reference "
                          f"or upstream for {STAGE2})")
    code, _, err = run_cli(capsys, "run", "--op", FWD, "--backend", "reference", "--policy", "seed_bf16", "--case",
                           SMALL, "--out", str(tmp_path / "t"))
    assert code == 2 and "--policy seed_bf16: policy 'seed_bf16' defines no rounding for operator 'mamba_mimo_fwd'" in err
    assert "mimo-numerics presets shows which operators each preset defines" in err
    assert not (tmp_path / "t").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the error raised without CUDA")
@pytest.mark.parametrize("op_name", [FWD, STAGE2])
def test_run_upstream_of_other_operators_without_cuda_is_one_line(op_name, tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", "--op", op_name, "--backend", "upstream", "--grid", "smoke", "--out",
                           str(tmp_path / "u"))
    assert code == 2 and err.count("\n") == 1 and err.startswith("mimo-numerics: error: CUDA is not available")


def test_run_upstream_forward_with_a_stand_in_runner(tmp_path, capsys, monkeypatch):
    """``run --backend upstream`` on the forward, the runner replaced by a stand-in (no CUDA here): the runner's
    module gives the CUDA check, the source info, the launch record and the refusal class; a refused case is recorded
    as skipped."""
    from mimo_numerics import presets
    from mimo_numerics.ops.mamba3_mimo import upstream as runners

    from mimo_numerics import operator

    fwd = operator.get(FWD)

    def stand_in(*tensors, chunk_size, rotary_dim_divisor, source_dir=None):
        inputs = dict(zip(fwd.input_names, tensors), chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor)
        if inputs["q"].shape[2] == 1:
            raise runners.UpstreamUnsupported("upstream limitation: stand-in refuses R = 1")
        runners.last_launch.clear()
        runners.last_launch.update(kernel="stand-in")
        return fwd.run_reference(inputs, presets.get("upstream_sm90_fp16" if inputs["q"].dtype == torch.float16
                                                     else "upstream_sm90"))

    monkeypatch.setattr(runners, "run_forward", stand_in)
    monkeypatch.setattr(runners, "check_cuda", lambda device=None: None)
    monkeypatch.setattr(runners, "source_info", lambda source_dir=None: {"mamba_ssm": "stand-in"})
    code, _, err = run_cli(capsys, "run", "--op", FWD, "--backend", "upstream", "--device", "cpu", "--grid", "smoke",
                           "--out", str(tmp_path / "u"))
    assert code == 0, err
    assert "skip: seed_B1_S12_H1_G1_N16_P16_R1_C4_ro-D_fp16_s123_rd2: upstream limitation: stand-in refuses R = 1" in err
    bundle = load_bundle(tmp_path / "u")
    assert bundle.operator == FWD and [c.outputs is None for c in bundle] == [False, False, True]
    assert all(c.policy is None and c.backend == "upstream" and c.versions["mamba_ssm"] == "stand-in" for c in bundle)
    assert bundle[0].meta["upstream_launch"] == {"kernel": "stand-in"} and bundle[2].skipped.startswith("upstream")


def test_policy_show_names_the_file_in_json_errors(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 2, "base": "upstream_sm90",')
    code, _, err = run_cli(capsys, "policy", "show", str(broken))
    assert code == 2 and err.count("\n") == 1
    assert f"policy file {broken} is not valid JSON" in err
    assert "preset names" not in err and "must end in .json" not in err and "fix the file" in err
    future = tmp_path / "future.json"
    future.write_text('{"schema_version": 2, "base": "upstream_sm90", "math_dtype": "float64", "fp32_fma": true}')
    code, _, err = run_cli(capsys, "policy", "show", str(future))
    assert code == 2 and f"policy file {future}: RoundingPolicy.fp32_fma=True models FP32 arithmetic" in err
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    code, _, err = run_cli(capsys, "policy", "diff", "upstream_sm90", str(listed))
    assert code == 2 and f"policy data in {listed} must be a dict" in err and "Traceback" not in err


class _StandInReport:
    """A ``mimo_numerics.report`` stand-in recording the parsed arguments (``with_op``: it defines ``--op``)."""

    class ReportError(Exception):
        hint = None

    def __init__(self, with_op):
        self.with_op, self.seen = with_op, []

    def add_report_arguments(self, parser):
        parser.add_argument("--case", default="x")
        if self.with_op:
            parser.add_argument("--op", default="theirs")
        return parser

    def run_report(self, args):
        self.seen.append(vars(args))
        return 0


def test_report_op_is_passed_on(capsys, monkeypatch):
    import mimo_numerics

    own = _StandInReport(with_op=True)  # the report module defines --op; the CLI passes it on unchanged
    monkeypatch.setattr(mimo_numerics, "report", own, raising=False)
    monkeypatch.setitem(sys.modules, "mimo_numerics.report", own)
    assert cli.main(["report", "--op", FWD]) == 0 and own.seen == [{"case": "x", "op": FWD}]
