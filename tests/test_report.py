"""The report command (mimo_numerics.report), its figures, and the parallel sweep machinery (mimo_numerics.sweep)."""

import argparse
import io
import json
import subprocess
import sys

import pytest

from mimo_numerics import cases, golden, plots, report, sweep

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
    assert metrics["seconds"] < 60
    summary = (out / "summary.md").read_text()
    for heading in ("Output error against the baseline", "Agreement with the device", "Drift by stage",
                    "Drift along the sequence", "Sensitivity of `upstream_sm90`", "Gap attribution",
                    "Policy inferred from the device outputs"):
        assert heading in summary
    for name in MAIN_FIGURES:
        assert f"({name})" in summary


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
    assert metrics["case"] == cases.grid("smoke")[0].case_id
    assert any(label.startswith("emulation:") for label in metrics["output_errors"])


def test_report_arguments_and_errors(tmp_path, capsys):
    parser = report.add_report_arguments(argparse.ArgumentParser())
    args = parser.parse_args([])
    assert args.case == report.DEFAULT_CASE and args.out is None and args.baseline == "fp64"
    bad = parser.parse_args(["--case", "no_such_case", "--out", str(tmp_path / "x")])
    assert report.run_report(bad) == 2
    assert "unknown case" in capsys.readouterr().err
    assert report.default_out_dir("seed_gqa").name.endswith("_seed_gqa")
    assert report.resolve_case("gate:0").device_outputs is None
    assert report.resolve_case(cases.grid("smoke")[1].case_id).name == cases.grid("smoke")[1].case_id


def test_report_case_from_a_bundle(tmp_path):
    from mimo_numerics import bundles

    bundles.golden_to_bundle(golden.DEFAULT_PATH, tmp_path / "gb")
    rc = report.resolve_case(f"{tmp_path / 'gb'}::seed_tail_chunk")
    _, upstream = golden.golden_case("seed_tail_chunk")
    assert rc.device_label.startswith("device:") and "H200" in rc.device_label
    assert all((rc.device_outputs[k] is None and v is None) or bool((rc.device_outputs[k] == v).all())
               for k, v in upstream.items())


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
    fp16 = cases.grid("smoke")[2]
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
