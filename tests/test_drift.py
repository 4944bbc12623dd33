"""Per-stage and per-chunk drift (mimo_numerics.drift)."""

import json
import math

import numpy as np
import pytest
import torch

from mimo_numerics import bundles, cases, drift, presets, tolerances
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import MimoBwdFwdOutputs

TINY = cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True)


@pytest.fixture(scope="module")
def tiny():
    return stage1_cases.make_inputs(TINY)


@pytest.fixture(scope="module")
def runs(tiny):
    return drift.standard_runs(tiny, ("fp32", "seed_bf16", "upstream_sm90"), emulation_policy=None)


def test_reference_run_records_every_stage_in_pipeline_order(runs):
    run = runs["upstream_sm90"]
    assert set(run) == set(drift.STAGES)  # every branch on: every stage and output is recorded
    assert list(runs) == ["fp64", "fp32", "seed_bf16", "upstream_sm90"]


def test_stage_drift_of_a_run_against_itself_is_zero(runs):
    table = drift.stage_drift({"a": runs["seed_bf16"]}, runs["seed_bf16"])
    assert all(r.rel_rms == 0 and r.max_abs == 0 and r.max_ulp == 0 for r in table.rows)
    assert table.entry_stage("a") is None


def test_fp32_and_bf16_drift_levels(runs):
    table = drift.stage_drift(runs, "fp64")
    fp32, bf16 = table.pivot()["fp32"], table.pivot()["upstream_sm90"]
    for stage in drift.STAGES[:23]:  # internal stages: FP32 math stays at the FP32 level
        assert fp32[stage] <= tolerances.get("drift_fp32_level_rel_rms"), stage
    for stage in ("q_biased", "psiv", "state", "out", "dz_accum"):  # BF16 enters at the first rounded stage
        assert bf16[stage] > tolerances.get("drift_lp_level_min"), stage
    assert table.entry_stage("upstream_sm90", threshold=tolerances.get("drift_lp_level_min")) == "q_biased"
    # the lp output stores round FP32 too
    assert (fp32["output.states"] > tolerances.get("drift_lp_level_min")
            and fp32["output.dmimo_o"] <= tolerances.get("drift_fp32_level_rel_rms"))
    assert table.stages() == [s for s in drift.STAGES if s in fp32]
    json.dumps(table.to_dict())
    assert "`output.dz`" in table.to_markdown()


@pytest.mark.parametrize("change, entry", [({"diag_mode": "mul_then_add"}, "diag_accum"), ({"out": False}, "out"),
                                           ({"k_state": False}, "k_state"), ({"dphio": False}, "dphio")])
def test_entry_stage_is_where_the_policies_differ(tiny, change, entry):
    base = presets.get("upstream_sm90")
    runs = {"base": drift.reference_run(tiny, base), "changed": drift.reference_run(tiny, base.replace(**change))}
    assert drift.stage_drift(runs, "base").entry_stage("changed") == entry


def test_outputs_only_runs_compare_at_the_outputs(runs):
    names = ("dmimo_o", "states", "dz", "dmimo_z", "qk_dot")
    device = drift.make_run(outputs=MimoBwdFwdOutputs(**{n: runs["seed_bf16"]["output." + n] for n in names}))
    assert set(device) == {"output." + n for n in names}
    table = drift.stage_drift({"device": device, "seed_bf16": runs["seed_bf16"]}, runs["fp64"])
    assert table.stages("device") == ["output." + n for n in names]
    for n in names:
        assert table.value("device", "output." + n) == table.value("seed_bf16", "output." + n)
    with pytest.raises(KeyError):
        table.value("device", "state")


def test_sequence_drift_shapes_and_chunk_zero(runs, tiny):
    per_chunk = drift.sequence_drift(runs, "fp64", tiny["chunk_size"], per="chunk")
    nc = TINY.nchunks
    assert per_chunk.positions.tolist() == list(range(nc))
    series = per_chunk.values["upstream_sm90"]
    assert all(len(v) == nc for v in series.values())
    assert series["state"][0] == 0.0  # h_0 = 0 exactly in every run
    assert "output.dmimo_o" not in series  # no sequence axis
    per_token = drift.sequence_drift(runs, "fp64", tiny["chunk_size"], per="token")
    assert all(len(v) == TINY.seqlen for v in per_token.values["fp32"].values())
    assert "state" not in per_token.values["fp32"]
    assert np.isfinite(per_token.values["seed_bf16"]["output.dz"]).all()
    assert per_chunk.growth("upstream_sm90", "state") > 0
    json.dumps(per_chunk.to_dict())


def test_sequence_axis_of_outputs():
    assert drift.sequence_axis("output.dz") == ("token", 1)
    assert drift.sequence_axis("output.qk_dot") == ("token", 2)
    assert drift.sequence_axis("output.states") == ("chunk", 2)
    assert drift.sequence_axis("output.dmimo_z") is None


def test_ulp_error():
    one = torch.tensor([1.0, 1.0, 0.0, -2.0], dtype=torch.float64)
    other = torch.tensor([1.0 + 2 ** -7, 1.0 + 2 ** -9, 0.0, -2.0 - 2 ** -6], dtype=torch.float64)
    assert drift.ulp_error(other, one, "bfloat16").tolist() == [1.0, 0.25, 0.0, 1.0]
    assert drift.ulp_error(other, one, "float16")[0].item() == 8.0
    assert drift.lp_ulp(torch.tensor([0.0]), "bfloat16").item() == 2.0 ** (-126 - 7)


def test_bundle_runs_and_standard_runs_with_a_device(tmp_path, tiny):
    out = drift.reference_run(tiny, "seed_bf16")
    outputs = MimoBwdFwdOutputs(**{n: out.get("output." + n) for n in ("dmimo_o", "states", "dz", "dmimo_z",
                                                                          "qk_dot")})
    case = bundles.BundleCase(name="tiny", inputs=tiny, outputs=outputs, spec=TINY,
                              policy=presets.get("seed_bf16"), backend="triton", device="npu:0",
                              device_name="Ascend 910B")
    bundles.save_bundle(tmp_path / "b", [case])
    [(name, inputs, run, label)] = drift.bundle_runs(tmp_path / "b")
    assert name == "tiny" and "triton" in label and "Ascend 910B" in label
    runs = drift.standard_runs(inputs, ("upstream_sm90",), device_outputs={k[7:]: v for k, v in run.items()},
                               device_label=label)
    table = drift.stage_drift(runs, "fp64")
    assert table.value(label, "output.dz") == drift.stage_drift({"s": out}, runs["fp64"]).value("s", "output.dz")
    assert table.stages(label) == [s for s in drift.STAGES if s.startswith("output.")]


def test_emulation_run_is_labelled(tiny):
    runs = drift.standard_runs(tiny, ("fp32",), use_kernels=False)
    assert list(runs) == ["fp64", "fp32", "emulation: reference seed_bf16"]
    assert torch.equal(runs["emulation: reference seed_bf16"]["output.dz"],
                       drift.reference_run(tiny, "seed_bf16")["output.dz"])


@pytest.mark.skipif(not drift.kernels_available(), reason="Triton kernels (mimo_numerics.kernels) not available")
def test_kernel_emulation_run_is_close_to_the_reference():
    inputs = stage1_cases.make_inputs(cases.CaseSpec(seqlen=8, state_dim=16, value_dim=16, rank=2, chunk_size=4,
                                              has_z=True))
    run = drift.kernel_run(inputs, "seed_bf16")
    ref = drift.reference_run(inputs, "seed_bf16")
    assert set(run) == set(ref)  # the kernel records every stage under the reference's names
    table = drift.stage_drift({"kernel": run}, ref)
    assert all(r.rel_rms <= tolerances.get("drift_fp32_level_rel_rms") for r in table.rows)  # FP32 level only


def test_golden_device_departs_from_upstream_only_at_fp32_level():
    inputs, upstream = golden.golden_case(golden.DEFAULT_CASE)
    runs = drift.standard_runs(inputs, ("seed_bf16", "upstream_sm90"), device_outputs=upstream,
                               device_label="device")
    table = drift.stage_drift(runs, "upstream_sm90")
    device = table.pivot()["device"]
    # 0 for states, dz and qk_dot on this case on every CPU configuration measured (docs/reproducibility.md), but
    # the reference's bf16 outputs come from FP32 GEMMs through the CPU's BLAS, where another summation order can
    # flip a rounding: gated with tests/ops/mamba_mimo_bwd_fwd/test_golden.py's tolerances for the same comparison, not as bits
    assert device["output.states"] <= tolerances.get("golden_states_qk_dot_rel_rms")
    assert device["output.qk_dot"] <= tolerances.get("golden_states_qk_dot_rel_rms")
    assert device["output.dz"] <= tolerances.get("golden_upstream_sm90_rel_rms")
    assert device["output.dmimo_o"] <= tolerances.get("drift_device_dmimo_o_rel_rms")
    assert table.entry_stage("seed_bf16", threshold=1e-6) == "diag_accum"
    assert not math.isnan(table.value("seed_bf16", "output.dz"))


# ---------------------------------------------------------------------------------------------- every operator
from mimo_numerics import operator as _operator  # noqa: E402
from mimo_numerics import tolerances  # noqa: E402
from mimo_numerics.inference import torch_threads  # noqa: E402
from mimo_numerics.ops import registry  # noqa: E402
from mimo_numerics.policy import write_fields  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases  # noqa: E402

OPS = registry.OPERATORS
OTHER_OPS = tuple(o for o in OPS if o != registry.DEFAULT_OPERATOR)


def test_default_operator_constants_are_the_stage_1_pipeline():
    """The module constants, now derived from stage 1's spec, are the lists this module hard-coded before."""
    assert drift.STAGES == (
        "q_biased", "k_biased", "qk_dot", "q_rot", "k_rot", "gamma", "shifted_gamma", "trap_scale", "k_scaled",
        "psiv", "k_state", "state", "state_operand", "inter", "causal_scores", "intra", "diag_accum", "diag", "out",
        "gate", "dphio", "dzz", "dz_accum", "output.dmimo_o", "output.states", "output.dz", "output.dmimo_z",
        "output.qk_dot")
    assert drift.CHUNK_STAGES == ("state", "state_operand", "causal_scores", "output.states")
    assert drift.NO_SEQUENCE_STAGES == ("output.dmimo_o", "output.dmimo_z")
    assert drift._TOKEN_AXIS == {"output.dz": 1}
    assert drift.pipeline() == drift.pipeline(registry.DEFAULT_OPERATOR) == drift.STAGES
    # the stages the report shows along the sequence (chosen from the spec) are the ones it hard-coded before
    assert drift.sequence_stages(per="token") == ("out", "output.dz", "output.qk_dot")
    assert drift.sequence_stages(per="chunk") == ("state", "out", "output.states", "output.dz")


@pytest.mark.parametrize("op", OPS)
def test_pipeline_and_sequence_axes_come_from_the_spec(op):
    spec = _operator.get(op)
    assert drift.pipeline(op) == spec.stage_names + tuple("output." + o for o in spec.output_names)
    for stage in spec.stages:
        assert drift.sequence_axis(stage.name, op) == stage.sequence_axis
        assert drift.stage_sites(op)[stage.name] == stage.site
    for out in spec.outputs:
        assert drift.sequence_axis("output." + out.name, op) == out.sequence_axis
    assert drift.sequence_axis("no_such_stage", op) is None
    text = drift.describe_stages(op)
    assert all(f"| `{s}` |" in text for s in drift.pipeline(op))


def test_sequence_axes_of_the_forward_and_stage_2_outputs():
    assert drift.sequence_axis("output.o", "mamba_mimo_fwd") == ("token", 1)  # [B, S, (R), H, P]
    assert drift.sequence_axis("o", "mamba_mimo_fwd") == ("token", 1)
    assert drift.sequence_axis("output.dq", "mamba_mimo_bwd_bwd") == ("token", 1)  # [B, S, R, H, N]
    assert drift.sequence_axis("output.ddA", "mamba_mimo_bwd_bwd") == ("token", 2)  # [B, H, S]
    assert drift.sequence_axis("output.dSSdA", "mamba_mimo_bwd_bwd") == ("chunk", 2)  # [B, H, nc, C, C]
    assert drift.sequence_axis("output.dmimo_v", "mamba_mimo_bwd_bwd") is None
    assert drift.sequence_axis("lkq", "mamba_mimo_bwd_bwd") == ("chunk", 2)


@pytest.fixture(scope="module")
def op_runs():
    """Every operator on TINY (all branches on): baseline, fp32 and upstream_sm90."""
    out = {}
    for op in OPS:
        x = _operator.get(op).draw(TINY)
        out[op] = (x, drift.standard_runs(x, ("fp32", "upstream_sm90"), emulation_policy=None, op=op))
    return out


@pytest.mark.parametrize("op", OPS)
def test_every_operator_records_its_whole_pipeline(op, op_runs):
    x, runs = op_runs[op]
    assert list(runs) == ["fp64", "fp32", "upstream_sm90"]
    assert set(runs["upstream_sm90"]) == set(drift.pipeline(op))  # every branch on: every stage and output
    table = drift.stage_drift(runs, "fp64", op=op)
    assert table.stages() == list(drift.pipeline(op)) and table.to_dict()["operator"] == _operator.get(op).name
    json.dumps(table.to_dict())
    spec = _operator.get(op)
    internal = [s.name for s in spec.stages if s.name not in spec.output_names]  # stored copies round like outputs
    fp32, sm90 = table.pivot()["fp32"], table.pivot()["upstream_sm90"]
    # FP32 math stays at the FP32 level inside; an lp policy is at the lp level at every stage a site rounds
    assert max(fp32[s] for s in internal) < 1e-5
    assert all(sm90[s.name] > 1e-4 for s in spec.stages if s.site)
    for name in spec.lp_outputs:
        assert fp32["output." + name] > 1e-4  # the lp output stores round FP32 math too


@pytest.mark.parametrize("op", OTHER_OPS)
def test_sequence_drift_of_the_forward_and_stage_2(op, op_runs):
    x, runs = op_runs[op]
    per_chunk = drift.sequence_drift(runs, "fp64", x["chunk_size"], per="chunk", op=op)
    assert per_chunk.positions.tolist() == list(range(TINY.nchunks))
    assert per_chunk.stages() == [s for s in drift.pipeline(op) if drift.sequence_axis(s, op) is not None]
    chunked = drift.chunk_stages(op)[0]  # the carried state: h_0 = 0 (forward), dstates after the last chunk = 0
    zero_chunk = 0 if op == "mamba_mimo_fwd" else -1
    assert per_chunk.values["upstream_sm90"][chunked][zero_chunk] == 0.0
    per_token = drift.sequence_drift(runs, "fp64", x["chunk_size"], per="token", op=op)
    assert all(len(v) == TINY.seqlen for v in per_token.values["fp32"].values())
    assert not set(drift.chunk_stages(op)) & set(per_token.stages())
    assert per_token.to_dict()["operator"] == op
    assert set(drift.sequence_stages(op, "token")) <= set(per_token.stages())
    assert set(drift.sequence_stages(op, "chunk")) <= set(per_chunk.stages())


#: Where one site's rounding shows first when it is not the site's own stage: stage 2 records ``gamma_lp`` (γ
#: rounded by ``gamma_diag``) right after ``dpsiv_accum``, its consumer.
RECORDED_AFTER_ITS_CONSUMER = {("mamba_mimo_bwd_bwd", "gamma_diag"): "dpsiv_accum"}


@pytest.mark.parametrize("op", OPS)
def test_turning_a_site_off_changes_its_stage_first(op, op_runs):
    """``Stage.site`` of the spec, checked against the reference: with one site of ``upstream_sm90`` switched off,
    the first stage that departs from ``upstream_sm90`` is the first stage that site rounds."""
    x, runs = op_runs[op]
    base = presets.get("upstream_sm90")
    first = {}
    for stage in _operator.get(op).stages:
        if stage.site:
            first.setdefault(stage.site, stage.name)
    assert first
    for site, stage in first.items():
        with torch_threads(1):  # speed only: many small reference calls
            changed = drift.reference_run(x, write_fields(base, op, **{site: False}), op)
        entry = drift.stage_drift({"off": changed}, runs["upstream_sm90"], op=op).entry_stage("off")
        assert entry == RECORDED_AFTER_ITS_CONSUMER.get((op, site), stage), (site, entry)


def test_outputs_dict_accepts_every_output_form():
    fwd, s2 = _operator.get("mamba_mimo_fwd"), _operator.get("mamba_mimo_bwd_bwd")
    o = torch.zeros(2)
    assert drift.outputs_dict(o, fwd) == {"o": o}  # the forward's oracle returns the bare tensor
    assert drift.make_run(outputs={"dq": o}, op=s2) == {"output.dq": o}
    with pytest.raises(TypeError, match="one-output"):
        drift.outputs_dict(o, s2)
    with pytest.raises(ValueError, match="has 12"):
        drift.outputs_dict((o, o), s2)


def test_lp_dtype_and_policies_follow_the_inputs():
    x = _operator.get("mamba_mimo_fwd").draw(stage1_cases.grid("smoke")[2])
    assert drift.lp_dtype_of(x, "mamba_mimo_fwd") == "float16"
    assert drift.policy_at("upstream_sm90", "float16") == ("upstream_sm90_fp16", presets.get("upstream_sm90_fp16"))
    assert drift.policy_at("fp32", "float16")[0] == "fp32[float16]"
    # the fp64 baseline takes the inputs' lp dtype (a bf16 policy is refused on fp16 inputs)
    runs = drift.standard_runs(x, {"sm90": presets.get("upstream_sm90_fp16")}, emulation_policy=None,
                               op="mamba_mimo_fwd")
    assert drift.stage_drift(runs, "fp64", "float16", op="mamba_mimo_fwd").value("sm90", "output.o") > 0
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        drift.lp_dtype_of({}, "mamba_mimo_fwd")


@pytest.mark.parametrize("op", OTHER_OPS)
def test_emulation_needs_a_policy_that_defines_the_operator(op):
    x = _operator.get(op).draw(stage1_cases.grid("smoke")[0])
    with pytest.warns(UserWarning, match="defines no rounding"):
        runs = drift.standard_runs(x, op=op)
    assert list(runs) == ["fp64", "fp32", "upstream_sm90"]  # default policies: those that define the operator
    if drift.kernels_available(op):  # the forward and stage 2 have Triton kernels
        run = drift.kernel_run(x, "upstream_sm90", op=op)
        if op == "mamba_mimo_fwd":
            assert "o_rank" in run and "d_term" in run  # the kernel's records, under the reference's stage names


@pytest.mark.parametrize("op, gate, ratio", [
    ("mamba_mimo_fwd", "fwd_golden_upstream_sm90_rel_rms", "fwd_golden_fp32_over_sm90_ratio_min"),
    ("mamba_mimo_bwd_bwd", "stage2_golden_lp_rel_rms", "stage2_golden_fp32_over_sm90_ratio_min")])
def test_golden_device_of_the_forward_and_stage_2_is_upstream_sm90(op, gate, ratio):
    """On the default report case (whole-op golden data), the H200 outputs are upstream_sm90's to the gate of the
    operator's own tests, and fp32 is further from them by at least their measured ratio."""
    from mimo_numerics import report

    case = report.resolve_case(report.default_case(op), op)
    runs = drift.standard_runs(case.inputs, device_outputs=case.device_outputs, device_label="device", op=op)
    table = drift.stage_drift(runs, "device", op=op)
    assert table.stages("upstream_sm90")[-len(_operator.get(op).outputs):] == [
        "output." + o for o in _operator.get(op).output_names]  # the device has outputs only
    for name in _operator.get(op).lp_outputs:
        sm90, fp32 = table.value("upstream_sm90", "output." + name), table.value("fp32", "output." + name)
        assert sm90 <= tolerances.get(gate), name
        assert fp32 >= tolerances.get(ratio) * sm90, name


def test_drift_report_modules_name_no_operator():
    """The contract of the generic modules (issue 16): the operator is a parameter; no operator and no stage-1-only
    name appears in drift, nonfinite, plots or report."""
    from pathlib import Path

    root = Path(drift.__file__).parent
    banned = registry.OPERATORS + ("MimoBwdFwdOutputs", "from .outputs import", "from . import golden")
    for module in ("drift.py", "nonfinite.py", "plots.py", "report.py"):
        text = (root / module).read_text(encoding="utf-8")
        assert not [b for b in banned if b in text], module
