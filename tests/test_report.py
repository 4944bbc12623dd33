"""The report command (mimo_numerics.report), its figures, and the parallel sweep machinery (mimo_numerics.sweep)."""

import argparse
import io
import json
import math
import subprocess
import sys

import pytest

from mimo_numerics import cases, drift, plots, report, sweep
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics import operator as _operator
from mimo_numerics import tolerances
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases

MAIN_FIGURES = ("fig_drift_by_stage.png", "fig_drift_along_sequence.png", "fig_sensitivity.png")


def _check_png(path, min_bytes=10_000):
    assert plots.is_png(path), path
    assert path.stat().st_size >= min_bytes, path  # an empty canvas compresses to a few KB
    width, height = plots.png_size(path)
    assert width >= 400 and height >= 300, (path, width, height)


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "default"
    return report.build_report(out=out)


def test_report_default_case_writes_every_file(default_report):
    out = default_report
    assert (out / "summary.md").is_file() and (out / "metrics.json").is_file()
    for name in report.FIGURES:  # the default case is golden: the inference figure is there too
        _check_png(out / name)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["case"] == golden.DEFAULT_CASE
    assert metrics["inference"]["best"]["diag_mode"] == "fma"
    assert metrics["gap_attribution"]["top"]["dz"] == "diag_mode"
    assert set(metrics["figures"]) == set(report.FIGURES)
    # the wall time is recorded, not gated: it depends on the CPU and the machine's load (67 s under
    # ATEN_CPU_CAPABILITY=default on a busy 2-core machine, docs/reproducibility.md); speed is measured in scripts
    assert math.isfinite(metrics["seconds"]) and metrics["seconds"] > 0
    summary = (out / "summary.md").read_text()
    for heading in ("Output error against the baseline", "Agreement with the device", "Drift by stage",
                    "Drift along the sequence", "Sensitivity of `upstream_sm90`", "Gap attribution",
                    "Policy inferred from the device outputs"):
        assert heading in summary
    for name in MAIN_FIGURES:
        assert f"({name})" in summary


def test_report_plots_every_policy_against_the_claimed_one(default_report):
    """The figure that tells the policies apart (notebook 01): seed_bf16 is bit-identical to upstream_sm90 up to
    the stages where its rounding semantics differ (the diagonal's rank sum), then about 3e-3 away."""
    _check_png(default_report / "fig_drift_vs_claimed.png")
    metrics = json.loads((default_report / "metrics.json").read_text())
    assert metrics["claimed_policy"]["label"] == "upstream_sm90"
    rows = metrics["stage_drift_vs_claimed"]["rows"]
    assert metrics["stage_drift_vs_claimed"]["baseline"] == "upstream_sm90"
    assert {r["label"] for r in rows} == {"seed_bf16", "device: H200 upstream (golden)"}  # no fp64/fp32
    seed = {r["stage"]: r["rel_rms"] for r in rows if r["label"] == "seed_bf16"}
    for stage in ("q_biased", "k_biased", "qk_dot", "q_rot", "k_rot", "gamma", "k_scaled", "psiv", "k_state"):
        assert seed[stage] == 0, stage  # the same roundings, elementwise or in the same reduction code
    assert seed["diag_accum"] > 1e-3  # measured 3.1e-3 on this case
    summary = (default_report / "summary.md").read_text()
    assert "## Drift by stage against the claimed policy `upstream_sm90`" in summary
    assert "(fig_drift_vs_claimed.png)" in summary


def test_stage_plot_shows_exact_zeros_on_their_own_line():
    from mimo_numerics.drift import DriftRow, DriftTable

    table = DriftTable("upstream_sm90", "bfloat16", [DriftRow("seed_bf16", "q_biased", 0.0, 0.0, 0.0, 4),
                                                     DriftRow("seed_bf16", "diag_accum", 3e-3, 1e-2, 2.0, 4)])
    ax = plots.plot_stage_drift(table).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1] == plots.ZERO_LABEL
    zero_tick = ax.get_yticks()[-1]
    assert ax.get_ylim()[0] < zero_tick < 3e-3 / 10  # below a gap under the smallest positive value


def test_stage_plot_names_the_site_of_each_stage():
    from mimo_numerics.drift import DriftRow, DriftTable

    rows = [DriftRow("fp32", s, 1e-7, 1e-7, 0.1, 4) for s in ("gamma", "psiv", "out", "output.o")]
    table = DriftTable("fp64", "bfloat16", rows, operator="mamba_mimo_fwd")
    labels = [t.get_text() for t in plots.plot_stage_drift(table, sites=True).axes[0].get_xticklabels()]
    assert labels == ["gamma", "psiv [psiv]", "out", "out:o [out_accum]"]  # Stage.site of the forward's spec
    assert [t.get_text() for t in plots.plot_stage_drift(table).axes[0].get_xticklabels()][1] == "psiv"


def test_sensitivity_scores_use_a_linear_axis_and_errors_a_log_axis():
    from mimo_numerics import presets
    from mimo_numerics.sensitivity import rank_sites

    inputs = stage1_cases.make_inputs(cases.CaseSpec(seqlen=8, state_dim=16, value_dim=16, rank=2, chunk_size=4,
                                              has_z=True))
    table = rank_sites(inputs, presets.get("upstream_sm90"), "fp64")
    fig = plots.plot_sensitivity(table)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear"
    shown = {t.get_text() for t in ax.texts}
    assert f"{table.ranked()[0].score:.2g}" in shown  # every bar carries its value
    assert plots.plot_sensitivity(table, output="dz").axes[0].get_xscale() == "log"


def test_report_cli_end_to_end_on_a_grid_case(tmp_path):
    """``python -m mimo_numerics.report`` on a case without device data (emulated device)."""
    out = tmp_path / "smoke"
    proc = subprocess.run([sys.executable, "-m", "mimo_numerics.report", "--case", "smoke:0", "--out", str(out),
                           "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    for name in MAIN_FIGURES + ("fig_output_errors.png", "fig_gap.png"):
        _check_png(out / name)
    assert not (out / "fig_inference.png").exists()  # no device outputs: nothing to infer from
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["case"] == stage1_cases.grid("smoke")[0].case_id
    assert any(label.startswith("emulation:") for label in metrics["output_errors"])


def test_report_arguments_and_errors(tmp_path, capsys):
    parser = report.add_report_arguments(argparse.ArgumentParser())
    args = parser.parse_args([])
    assert args.case is None and args.out is None and args.baseline == "fp64" and args.policies is None
    assert args.op == registry.DEFAULT_OPERATOR
    assert report.DEFAULT_CASE == report.default_case() == golden.DEFAULT_CASE  # the rule picks stage 1's default
    bad = parser.parse_args(["--case", "no_such_case", "--out", str(tmp_path / "x")])
    with pytest.raises(report.ReportError, match="unknown case") as excinfo:
        report.run_report(bad)
    assert isinstance(excinfo.value, ValueError) and "--case takes" in excinfo.value.hint
    assert report.default_out_dir("seed_gqa").name.endswith("_seed_gqa")
    assert report.resolve_case("gate:0").device_outputs is None
    assert report.resolve_case(stage1_cases.grid("smoke")[1].case_id).name == stage1_cases.grid("smoke")[1].case_id


@pytest.mark.parametrize("argv, message, hint", [
    (["--case", "no_such_case"], "--case no_such_case: unknown case; golden cases are seed_", "--case takes"),
    (["--case", "smoke:99"], "--case smoke:99: grid 'smoke' has 3 cases; index 99 is out of range", "smoke:0 .."),
    (["--case", "missing_dir/b::x"], "--case missing_dir/b::x: missing_dir/b does not exist", "bundle DIR[::CASE]"),
    (["--policies", "fp32,nope"], "--policies nope: unknown preset 'nope'", "mimo-numerics presets"),
])
def test_report_errors_use_the_cli_format(argv, message, hint, tmp_path, capsys, monkeypatch):
    """``mimo-numerics report`` errors read like every other command's: one line, ``... (hint: ...)``."""
    from mimo_numerics import cli

    monkeypatch.chdir(tmp_path)
    code = cli.main(["report", "--quiet", "--out", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"mimo-numerics: error: {message}") and hint in err.split(" (hint: ", 1)[1]
    assert not (tmp_path / "r").exists()


def test_python_dash_m_report_errors_use_the_cli_format(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mimo_numerics.report", "--case", "no_such_case", "--out",
                           str(tmp_path / "r")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("mimo-numerics: error: --case no_such_case: unknown case")
    assert "(hint: " in proc.stderr


def test_report_case_from_a_bundle(tmp_path):
    from mimo_numerics import bundles

    bundles.golden_to_bundle(golden.DEFAULT_PATH, tmp_path / "gb")
    rc = report.resolve_case(f"{tmp_path / 'gb'}::seed_tail_chunk")
    _, upstream = golden.golden_case("seed_tail_chunk")
    assert rc.device_label.startswith("device:") and "H200" in rc.device_label
    assert all((rc.device_outputs[k] is None and v is None) or bool((rc.device_outputs[k] == v).all())
               for k, v in upstream.items())


OTHER_OPS = tuple(o for o in registry.OPERATORS if o != registry.DEFAULT_OPERATOR)
#: The gate of each operator's lp outputs against the H200 golden data (its own reference tests).
LP_GATE = {"mamba_mimo_fwd": "fwd_golden_upstream_sm90_rel_rms", "mamba_mimo_bwd_bwd": "stage2_golden_lp_rel_rms"}


@pytest.mark.parametrize("op", OTHER_OPS)
def test_report_of_the_forward_and_stage_2_on_their_golden_case(op, tmp_path):
    """``mimo-numerics report --op OP``: the same report for the forward and stage 2 on the embedded default case
    (the first whole-op golden case with every branch on): reference policies and the real upstream per stage and
    per output, drift against the claimed policy, and the sensitivity ranking where this build's
    ``sensitivity.rank_sites`` takes the operator."""
    from mimo_numerics import cli

    out = tmp_path / "r"
    assert cli.main(["report", "--op", op, "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    spec = _operator.get(op)
    assert metrics["operator"] == op and metrics["case"] == report.default_case(op)
    golden_case = next(c for c in spec.load("golden")() if c.case_id == metrics["case"])
    assert golden_case.reduce_o and golden_case.has_z and golden_case.has_d
    assert list(metrics["policies"]) == ["fp32", "upstream_sm90"]  # seed_bf16 defines neither operator
    device = "device: H200 upstream (golden)"
    assert set(metrics["output_errors"]) == {"fp32", "upstream_sm90", device}
    assert set(metrics["output_errors"][device]) == set(spec.output_names)
    stages = {r["stage"] for r in metrics["stage_drift"]["rows"] if r["label"] == "upstream_sm90"}
    assert stages == set(drift.pipeline(op))  # every branch on: every stage and output
    assert metrics["stage_drift"]["operator"] == op
    for name in spec.lp_outputs:
        assert metrics["device_agreement"]["upstream_sm90"][name]["rel_rms"] <= tolerances.get(LP_GATE[op]), name
    assert max(metrics["fp64_vs_oracle"].values()) < 1e-10  # the stage baseline is the FP64 oracle's numbers
    assert {r["label"] for r in metrics["stage_drift_vs_claimed"]["rows"]} == {device}
    summary = (out / "summary.md").read_text()
    for heading in ("Output error against the baseline", "Agreement with the device", "Drift by stage",
                    "Drift by stage against the claimed policy `upstream_sm90`", "Drift along the sequence",
                    f"## Stages of `{op}`"):
        assert heading in summary
    for name in ("fig_drift_by_stage.png", "fig_drift_vs_claimed.png", "fig_drift_along_sequence.png",
                 "fig_output_errors.png"):
        _check_png(out / name)
    # seed_bf16 defines neither operator: the gap and the inference go from fp32 to upstream_sm90
    assert metrics["skipped"] == {}
    assert metrics["gap_attribution"]["name_a"] == "fp32" and metrics["inference"]["operator"] == op
    _check_png(out / "fig_sensitivity.png")
    assert "Sensitivity of `upstream_sm90`" in summary and metrics["sensitivity"]["rows"]
    assert {r["site"] for r in metrics["sensitivity"]["rows"] if r["kind"] == "switch"} == set(
        registry.site_table(op))


def test_report_operator_arguments(tmp_path):
    parser = report.add_report_arguments(argparse.ArgumentParser())
    with pytest.raises(report.ReportError, match="seed_bf16: it defines no rounding for mamba_mimo_fwd"):
        report.run_report(parser.parse_args(["--op", "mamba_mimo_fwd", "--policies", "seed_bf16", "--out",
                                             str(tmp_path / "x")]))
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):
        parser.parse_args(["--op", "no_such_op"])
    assert report.default_out_dir("c", op="mamba_mimo_fwd").name.endswith("_mamba_mimo_fwd_c")
    assert report.default_out_dir("c").name.endswith("_c") and "mamba" not in report.default_out_dir("c").name
    rc = report.resolve_case("smoke:0", "mamba_mimo_bwd_bwd")
    assert rc.device_outputs is None and "no device run" in rc.description
    assert set(rc.inputs) == set(_operator.get("mamba_mimo_bwd_bwd").input_names) | {"chunk_size",
                                                                                     "rotary_dim_divisor"}
    with pytest.raises(report.ReportError, match="golden cases are g_"):
        report.resolve_case("seed_branch_ro1_z1_d1", "mamba_mimo_fwd")  # stage 1's golden names are not the forward's


def _square(x):
    return x * x


def test_parallel_map_keeps_order_across_spawned_workers():
    stream = io.StringIO()
    assert sweep.parallel_map(_square, range(7), workers=2, progress=False) == [i * i for i in range(7)]
    with sweep.progress_bar(3, "t", stream=stream) as bar:
        for _ in range(3):
            bar.update()
    assert stream.getvalue().startswith("\rt: ") and "3/3" in stream.getvalue()
    assert sweep.parallel_map(_square, [3], workers=1, progress=False) == [9]
    with pytest.raises(ValueError):
        sweep.parallel_map(_square, [1], workers=0)


def test_run_sweep_cases_by_policies_in_parallel():
    fp16 = stage1_cases.grid("smoke")[2]
    assert fp16.dtype == "float16"
    specs = [cases.CaseSpec(seqlen=12, state_dim=16, value_dim=16, rank=2, chunk_size=4, has_z=True),
             "seed_branch_ro1_z0_d0", fp16]
    result = sweep.run_sweep(specs, ["seed_bf16", "upstream_sm90"], workers=2, progress=False)
    assert [(r["case"], r["policy"]) for r in result.records] == [
        (specs[0].case_id, "seed_bf16"), (specs[0].case_id, "upstream_sm90"),
        ("seed_branch_ro1_z0_d0", "seed_bf16"), ("seed_branch_ro1_z0_d0", "upstream_sm90"),
        (fp16.case_id, "seed_bf16[float16]"), (fp16.case_id, "upstream_sm90[float16]")]
    assert result.records[-1]["policy_json"]["lp_dtype"] == "float16"
    table = result.pivot("dmimo_o", against="vs_device")
    assert table["seed_branch_ro1_z0_d0"]["upstream_sm90"] < table["seed_branch_ro1_z0_d0"]["seed_bf16"]
    assert "vs_device" not in result.records[0]
    assert "| case |" in result.to_markdown("states")
    json.dumps(result.to_dict())
