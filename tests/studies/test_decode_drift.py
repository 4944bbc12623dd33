"""Smoke test of the decode-drift study (``mimo_numerics/studies/decode_drift.py``) at a small size: the FP64 policy
decodes at the FP64 truth, an lp policy at the lp level, the decode's lp stores are what its error comes from, and
the report is written from the results."""

import json

import pytest

import mimo_numerics as mn
from mimo_numerics.ops.mamba3_mimo.cases import small_case
from mimo_numerics.studies import decode_drift

SPEC = small_case(seqlen=40, seed=5)
PREFILL = 16


@pytest.fixture(scope="module")
def study():
    policies = {"fp64": "fp64", "upstream_sm90": "upstream_sm90",
                "no stores": mn.presets.get("upstream_sm90").replace(round_outputs=False)}
    return decode_drift.run(SPEC, PREFILL, policies, progress=False)


def test_the_fp64_policy_decodes_at_the_fp64_truth(study):
    record = study["results"]["fp64"]
    assert len(record["out"]) == SPEC.seqlen - PREFILL == len(record["chunked"])
    assert max(record["out"]) <= 1e-12 and max(record["chunked"]) <= 1e-12
    assert all(value <= 1e-12 for mark in record["state"].values() for value in mark.values())


def test_the_lp_stores_are_what_the_decode_error_comes_from(study):
    rows = decode_drift.reading(study)
    stored, unstored = rows["upstream_sm90"], rows["no stores"]
    assert 5e-4 <= stored["decode_last"] <= 2e-2  # the lp output store: about half a bf16 ulp
    assert unstored["decode_last"] < stored["decode_last"] / 2
    assert stored["k_last"] >= 5e-4 and unstored["k_last"] < 1e-5  # the stored k is the next token's k_state
    assert sorted(study["results"]["upstream_sm90"]["state"]) == decode_drift.checkpoints(SPEC.seqlen - PREFILL)


def test_the_report_is_written_from_the_results(study, tmp_path):
    readme = decode_drift.write_report(study, tmp_path, command="pytest")
    text = readme.read_text()
    assert "| upstream_sm90 |" in text and "decode_drift.png" in text
    assert json.loads((tmp_path / "decode_drift.json").read_text())["tokens"] == SPEC.seqlen - PREFILL
    assert (tmp_path / "decode_drift.png").stat().st_size > 1000


def test_prefill_out_of_range_is_refused():
    with pytest.raises(ValueError, match="prefill must be in 1"):
        decode_drift.run(SPEC, SPEC.seqlen, {"fp32": "fp32"}, progress=False)


def test_without_the_chunked_baseline_its_columns_are_empty(tmp_path):
    short = small_case(seqlen=20, seed=6)
    study = decode_drift.run(short, 8, {"upstream_sm90": "upstream_sm90"}, chunked=False, progress=False)
    assert study["results"]["upstream_sm90"]["chunked"] == []
    text = decode_drift.write_report(study, tmp_path).read_text()
    assert "| upstream_sm90 | " in text and " - | - |" in text
