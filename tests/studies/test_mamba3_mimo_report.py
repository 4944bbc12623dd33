"""The whole op's report (``mimo-numerics report --op mamba3_mimo``): its runs, the chain's drift, the site ranking."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mimo_numerics import drift, plots, sensitivity, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba3_mimo import cases, runs
from mimo_numerics.ops.mamba3_mimo.runs import OUTPUT_KEYS
from mimo_numerics.studies import report as op_report
from mimo_numerics.studies import site_ranking


@pytest.fixture(scope="module")
def small_inputs():
    return cases.make_op_inputs(cases.small_case())


@pytest.fixture(scope="module")
def small_fp64(small_inputs):
    return runs.fp64_run(small_inputs)


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    """The report on its default case: the first whole-op golden case with every branch on (H200 outputs)."""
    out = tmp_path_factory.mktemp("op_report") / "default"
    return op_report.build_report(out=out)


def test_chain_order_holds_every_stage_a_run_records(small_inputs, small_fp64):
    run = runs.policy_run(small_inputs, "upstream_sm90")
    order = runs.chain_order()
    assert len(order) == len(set(order))
    assert set(run) <= set(order), sorted(set(run) - set(order))
    groups = [runs.group_of(key) for key in order]
    # contiguous groups, in chain order: preprocessing, forward, stage 1, stage 2, epilogue
    assert list(dict.fromkeys(groups)) == ["mamba3_mimo_preprocess", "mamba_mimo_fwd", "mamba_mimo_bwd_fwd",
                                           "mamba_mimo_bwd_bwd", "mamba3_mimo_epilogue"]
    assert sum(1 for a, b in zip(groups, groups[1:]) if a != b) == 4
    # every stage of the policy run has an fp64 counterpart (the internal stages come from fp64_stages)
    assert set(run) <= set(small_fp64), sorted(set(run) - set(small_fp64))
    with pytest.raises(KeyError, match="not a record key"):
        runs.group_of("nonsense.stage")


def test_fp64_stages_agree_with_the_fp64_oracles(small_inputs, small_fp64):
    """The fp64 run's outputs are the FP64 oracles'; the references under fp64, run on the same float64 tensors,
    must give the same outputs to FP64 summation order."""
    oracle = runs.policy_run(small_inputs, "fp64")
    stages = runs.fp64_stages(small_inputs, oracle)
    outputs = [key for key in stages if ".outputs." in key and oracle.get(key) is not None]
    assert len(outputs) >= 15  # o, stage 1's outputs, stage 2's twelve
    limit = tolerances.get("fp64_reference_vs_oracle_rel_rms")
    for key in outputs:
        assert stages[key].dtype == torch.float64, key
        assert rel_rms(stages[key], oracle[key]) <= limit, key


def test_the_whole_op_is_a_composite_operator_of_the_generic_tools():
    spec = registry.composite(registry.WHOLE_OP)
    assert spec is registry.whole_op() and registry.composite(spec) is spec
    assert registry.composite("mamba_mimo_bwd_fwd") is None and registry.composite(None) is None
    assert spec.components == registry.OPERATORS and spec.output_names == OUTPUT_KEYS
    assert spec.score_outputs == cases.OP_GRAD_NAMES
    assert drift.pipeline(registry.WHOLE_OP) == runs.chain_order() == spec.stage_names
    keys = runs.chain_order()
    assert drift.stage_groups(keys, registry.WHOLE_OP) == runs.groups(keys)
    assert drift.stage_groups(keys, "mamba_mimo_bwd_fwd") == {}


def test_output_errors_cover_out_and_every_gradient(small_inputs, small_fp64):
    errors = sensitivity.run_errors(runs.policy_run(small_inputs, "upstream_sm90"), small_fp64)
    assert list(errors) == list(OUTPUT_KEYS)  # the small case has every branch
    assert all(0 < e < 0.1 for e in errors.values()), errors
    assert sensitivity.run_errors(small_fp64, small_fp64) == {o: 0.0 for o in OUTPUT_KEYS}


def test_ranking_forward_sites_move_out_only_and_backward_sites_leave_out(small_inputs, small_fp64):
    result = sensitivity.rank_sites([small_inputs], "upstream_sm90", [small_fp64], op=registry.WHOLE_OP,
                                    progress=False, names=["small"])
    assert isinstance(result, sensitivity.OneOffRanking)
    rows = {r.label: r for r in result.rows}
    forward = [r for r in result.rows if r.operator == "mamba_mimo_fwd"]
    backward = [r for r in result.rows if r.operator in ("mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd")]
    assert forward and backward
    for r in forward:  # the backward recomputes what it needs: a forward site changes Out only
        assert all(r.errors[g] == result.policy_error[g] for g in result.gradients), r.label
    assert any(r.errors["Out"] != result.policy_error["Out"] for r in forward)
    for r in backward:
        assert r.errors["Out"] == result.policy_error["Out"], r.label
    # fp32 math in place of every lp rounding is not a single site; but some stage-2 site must matter to dq
    assert max(result.fraction(r, "dQ") for r in backward) > 0.1
    assert all(0.0 <= r.score <= 1.0 for r in result.rows)
    assert result.ranked()[0].score == max(r.score for r in result.rows)
    assert "mamba_mimo_bwd_bwd.dphio" in rows
    assert set(result.without_effect()) >= {r.label for r in forward}
    table = result.to_markdown(top=5)
    assert table.count("\n") == 2 + 5
    json.dumps(result.to_dict())
    # the mean drop is what the error does: 1 - off / policy, averaged over the gradients
    top = result.ranked()[0]
    drops = [1 - top.errors[g] / result.policy_error[g] for g in result.gradients]
    assert result.drop(top) == pytest.approx(sum(drops) / len(drops), rel=1e-12)
    assert result.drop(top) < top.score  # a quadrature share exceeds the drop it stands for
    with pytest.raises(ValueError, match="inputs is empty"):
        sensitivity.rank_sites([], "upstream_sm90", op=registry.WHOLE_OP)
    with pytest.raises(ValueError, match="one baseline run per case"):
        sensitivity.rank_sites([small_inputs], "upstream_sm90", [small_fp64, small_fp64], op=registry.WHOLE_OP)
    with pytest.raises(ValueError, match="not in this ranking"):
        result.ranked("dNothing")


def test_report_default_case_writes_every_file(default_report):
    out = default_report
    for name in op_report.FIGURES:
        path = out / name
        assert plots.is_png(path) and path.stat().st_size > 10_000, name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["case"] == op_report.DEFAULT_CASE and metrics["operator"] == registry.WHOLE_OP
    assert metrics["outputs"] == list(OUTPUT_KEYS)
    assert set(metrics["output_errors"]) == {"fp32", "upstream_sm90", op_report.UPSTREAM_LABEL}
    # the policy that models the hardware is closer to the real upstream op than fp32, on every output
    agreement = metrics["upstream_agreement"]
    for output in OUTPUT_KEYS:
        assert agreement["upstream_sm90"][output] < agreement["fp32"][output], output
    assert math.isfinite(metrics["seconds"]) and metrics["seconds"] > 0
    summary = (out / "summary.md").read_text()
    assert metrics["provenance"]["command"].startswith("mimo-numerics report --op mamba3_mimo")
    assert f"Generated by `{metrics['provenance']['command']}` at commit `{metrics['provenance']['commit']}`" in summary
    for heading in ("Out and the 14 gradients against FP64", "Error through the chain, stage by stage",
                    "Which roundings cause each gradient's error"):
        assert heading in summary
    for name in op_report.FIGURES:
        assert f"({name})" in summary


def test_report_drift_spans_the_whole_chain(default_report):
    metrics = json.loads((default_report / "metrics.json").read_text())
    table = metrics["stage_drift"]
    assert table["order"] == list(runs.chain_order())
    stages = {row["stage"] for row in table["rows"] if row["label"] == "upstream_sm90"}
    assert {runs.group_of(s) for s in stages} == set(runs.group_of(k) for k in runs.chain_order())
    upstream = {row["stage"] for row in table["rows"] if row["label"] == op_report.UPSTREAM_LABEL}
    assert runs.OUT_KEY in upstream and "mamba3_mimo_epilogue.dQ" in upstream


def test_cli_report_small_case_and_errors(tmp_path):
    out = tmp_path / "small"
    done = subprocess.run([sys.executable, "-m", "mimo_numerics", "report", "--op", registry.WHOLE_OP, "--case",
                           "small", "--out", str(out), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["upstream_label"] is None and metrics["upstream_agreement"] == {}
    bad = subprocess.run([sys.executable, "-m", "mimo_numerics", "report", "--op", registry.WHOLE_OP, "--case",
                          "no_such_case", "--out", str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "mimo-numerics: error: --case no_such_case" in bad.stderr and "hint:" in bad.stderr
    assert "Traceback" not in bad.stderr
    claimed = subprocess.run([sys.executable, "-m", "mimo_numerics", "report", "--op", registry.WHOLE_OP,
                              "--claimed", "fp32", "--out", str(tmp_path / "c")], capture_output=True, text=True)
    assert claimed.returncode != 0 and "--claimed" in claimed.stderr and "Traceback" not in claimed.stderr


def test_report_refuses_the_baseline_and_policies_without_every_operator():
    with pytest.raises(op_report.ReportError, match="fp64 baseline"):
        op_report.build_report(case="small", policies=["fp64"])
    with pytest.raises(op_report.ReportError, match="seed_bf16"):
        op_report.build_report(case="small", policies=["seed_bf16"])


def test_site_ranking_generator_smoke(tmp_path):
    """The generator of reports/mamba3_mimo_site_ranking.md in its smoke mode (one small drawn case): its files,
    its provenance line and a reading computed from the result."""
    out = tmp_path / "ranking.md"
    assert site_ranking.main(["--smoke", "--quiet", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Generated by `python scripts/rank_whole_op_sites.py --smoke" in text and "at commit `" in text
    payload = json.loads(out.with_suffix(".json").read_text())
    assert payload["cases"] == ["small"] and payload["provenance"]["commit"]
    top = payload["rows"][0]
    assert f"`{top['label']}` off: score {top['score']:.3f}" in text
    assert f"drops by {payload['drop'][top['label']]:.1%}" in text
    assert plots.is_png(out.with_suffix(".png"))


def test_site_ranking_runs_each_variant_on_the_backend_that_expresses_it(tmp_path, monkeypatch):
    """``--backend triton``: every policy run asks for the kernels where ``runs.backend_for`` says they express the
    variant, the fp64 baseline runs the FP64 model, and the report says so. (The runs themselves are replaced by one
    recorded reference run: the kernels' agreement with the reference is gated in the kernel tests.)"""
    x = cases.make_op_inputs(cases.small_case())
    recorded = runs.policy_run(x, "upstream_sm90")
    calls = []

    def fake_policy_run(inputs, policy, *, backend="reference"):
        calls.append((sensitivity._presets.resolve(policy), backend))
        return recorded

    monkeypatch.setattr(runs, "policy_run", fake_policy_run)
    monkeypatch.setattr(site_ranking, "smoke_cases", lambda: {"small": (x, recorded)})
    out = tmp_path / "ranking.md"
    assert site_ranking.main(["--smoke", "--quiet", "--backend", "triton", "--out", str(out)]) == 0
    assert len(calls) > 10 and all(backend == runs.backend_for(p, "triton") for p, backend in calls)
    # every one-off variant of upstream_sm90 has kernels but the FP32-level models' ones (tensor-core gemm_model,
    # the MUFU special functions, the contracted FP32 of fp32_fma, TileLang 0.1.15's dζ order: reference only)
    default = lambda p: (p.gemm_model == "fp32" and p.special_functions == "accurate" and not p.fp32_fma  # noqa: E731
                         and p.tilelang == "0.1.8")
    assert {backend for p, backend in calls if default(p)} == {"triton"}
    assert {backend for p, backend in calls if p.gemm_model != "fp32"} == {"reference"}
    assert {backend for p, backend in calls if p.special_functions != "accurate"} == {"reference"}
    assert {backend for p, backend in calls if p.fp32_fma} == {"reference"}
    assert calls[0][0].name == "upstream_sm90"
    assert "the policy runs on the Triton kernels" in out.read_text()
    assert json.loads(out.with_suffix(".json").read_text())["backend"] == "triton"
    with pytest.raises(ValueError, match="backend must be 'reference' or 'triton'"):
        sensitivity.rank_sites_one_off(x, "upstream_sm90", [recorded], backend="cuda")
    with pytest.raises(ValueError, match="is for the whole op"):
        sensitivity.rank_sites(x, "upstream_sm90", op="mamba_mimo_fwd", backend="triton")


@pytest.mark.slow
def test_golden_ranking_script_writes_its_report(tmp_path):
    """The generator of reports/mamba3_mimo_site_ranking.md on two golden cases."""
    out = tmp_path / "ranking.md"
    done = subprocess.run([sys.executable, "scripts/rank_whole_op_sites.py", "--quiet", "--cases",
                           "g_B1_S64_H2_N64_P64_R4_C16_zdo,x_B1_S56_H2_N64_P64_R4_C16_zdo_tail", "--out", str(out)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "Not run" in text and "x_B1_S56_H2_N64_P64_R4_C16_zdo_tail" in text  # S % C != 0: upstream's limit
    assert plots.is_png(out.with_suffix(".png"))
    payload = json.loads(out.with_suffix(".json").read_text())
    assert payload["cases"] == ["g_B1_S64_H2_N64_P64_R4_C16_zdo"] and payload["rows"]
