"""Plumbing of ``scripts/check_reference_bits.py`` (the bit-identity tool): one tiny case per target, save then
compare finds no mismatch, a changed digest, a changed stored value and a changed exception are each reported, and a
policy a target does not define is skipped. Not a numerical test (the tool's digests are same-machine only)."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_reference_bits.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("check_reference_bits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _tiny_plan(tool):
    """The first (smallest) case of every target, under ``upstream_sm90`` and ``seed_bf16`` (bf16 only)."""
    plan = tool.build_plan(list(tool.all_targets()), quick=True, sweep=None, headline=False,
                           policy_names=["upstream_sm90", "seed_bf16", "bfloat16:fma=1:bias_sums_in_lp=1",
                                         "bfloat16:fma=0:bias_sums_in_lp=0"])
    return [(target, cases[:1], policies) for target, cases, policies in plan]


def _args(path, **extra):
    return argparse.Namespace(baseline=str(path), no_values=False, quick=True, **extra)


@pytest.fixture(scope="module")
def saved(tool, tmp_path_factory):
    plan = _tiny_plan(tool)
    path = tmp_path_factory.mktemp("bits") / "baseline.json"
    assert tool.save(_args(path), plan) == 0
    return plan, path


def test_every_target_is_covered(tool):
    names = [target.name for target, _, _ in _tiny_plan(tool)]
    assert names[:3] == ["mamba_mimo_fwd", "mamba_mimo_bwd_fwd", "mamba_mimo_bwd_bwd"]
    assert names[-2:] == ["mamba3_mimo_epilogue", "mamba3_mimo"]


def test_save_then_compare_matches(tool, saved, capsys):
    plan, path = saved
    data = json.loads(path.read_text())
    for target, cases, _ in plan:
        entry = data["operators"][target.name]["cases"][cases[0].label]
        assert entry["inputs"], target.name
        runs = {p: r for p, r in entry["policies"].items() if r["error"] is None}
        assert runs and all(r["digests"] for r in runs.values()), target.name
    whole = data["operators"]["mamba3_mimo"]["cases"]
    digests = next(iter(whole.values()))["policies"]["upstream_sm90"]["digests"]
    assert "Out" in digests and "grad.dQ" in digests and any(k.startswith("record.") for k in digests)
    capsys.readouterr()
    assert tool.compare(_args(path), plan) == 0
    out = capsys.readouterr().out
    assert ", 0 mismatches" in out and "MISMATCH" not in out
    # seed_bf16 defines only stage 1: skipped (stored as the exception) for the forward, stage 2, the whole op
    assert "skipped mamba_mimo_fwd seed_bf16" in out and "skipped mamba3_mimo seed_bf16" in out
    assert "skipped mamba_mimo_bwd_fwd seed_bf16" not in out


def test_compare_reports_changes(tool, saved, tmp_path, capsys):
    plan, path = saved
    data = json.loads(path.read_text())
    stage1 = data["operators"]["mamba_mimo_bwd_fwd"]["cases"]
    label = next(iter(stage1))
    stage1[label]["policies"]["upstream_sm90"]["digests"]["dz"] = "0" * 64        # a changed output
    fwd = data["operators"]["mamba_mimo_fwd"]["cases"]
    fwd[next(iter(fwd))]["policies"]["seed_bf16"]["error"] = None                   # no longer raises
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(data))
    tool.values_dir(changed).symlink_to(tool.values_dir(path), target_is_directory=True)
    capsys.readouterr()
    assert tool.compare(_args(changed), plan) == 1
    out = capsys.readouterr().out
    assert f"mamba_mimo_bwd_fwd  {label}  upstream_sm90  dz: 0 of" in out  # the stored values are equal
    assert "mamba_mimo_fwd  " in out and "seed_bf16  exception: None -> \"PolicyUndefined: " in out
    assert ", 2 mismatches" in out
    assert tool.main(["diff", "--baseline", str(path), "--other", str(changed)]) == 1
    out = capsys.readouterr().out
    assert f"{label}  upstream_sm90  dz: digests differ" in out and ", 2 mismatches" in out
    assert tool.main(["diff", "--baseline", str(path), "--other", str(path)]) == 0


def test_count_differences(tool):
    a = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.bfloat16)
    b = a.clone()
    b[2] = 4.0
    assert tool.count_differences(a, a.clone()) == "0 of 3 elements differ"
    assert tool.count_differences(a, b) == "1 of 3 elements differ"
    assert tool.count_differences(a, b.float()).startswith("dtype/shape")
    assert tool.digest(a) == tool.digest(a.clone()) != tool.digest(b)
