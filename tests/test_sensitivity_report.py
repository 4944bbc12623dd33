"""scripts/make_sensitivity_report.py on operators other than stage 1: the script end to end on one small golden case
of the forward (about 10 s), its command-line errors, and the committed reports of the forward and stage 2."""

import importlib.util
import re
from pathlib import Path

import pytest

from mimo_numerics import operator, sensitivity
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba_mimo_fwd import golden as fwd_golden

ROOT = Path(__file__).resolve().parents[1]
#: The cheapest golden case of the forward (R = 1, one chunk of 64 per 128 tokens; about 1 ms a reference call).
SMALL_CASE = "x_B1_S128_H2_N64_P64_R1_C64_zdo"


def _load_script():
    spec = importlib.util.spec_from_file_location("make_sensitivity_report",
                                                  ROOT / "scripts" / "make_sensitivity_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return _load_script()


@pytest.fixture(scope="module")
def fwd_report(script, tmp_path_factory):
    out = tmp_path_factory.mktemp("sensrep") / "fwd.md"
    assert script.main(["--op", "mamba_mimo_fwd", "--cases", SMALL_CASE, "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def _section(text: str, number: int) -> str:
    start = text.index(f"## {number}. ")
    end = text.find(f"## {number + 1}. ", start)
    return text[start:] if end < 0 else text[start:end]


def test_forward_report_on_one_case_has_every_section_and_site(fwd_report):
    text = fwd_report
    assert text.startswith("# Sensitivity of `upstream_sm90` on the golden H200 cases: `mamba_mimo_fwd`")
    assert f"`{SMALL_CASE}`" in text and "1 of the 12 golden cases" in text
    assert re.search(r"at commit `[0-9a-f]{7,}`", text) and re.search(r"Run time \d+ s wall", text)
    for number in range(1, 6):
        assert f"## {number}. " in text
    sites = registry.site_table("mamba_mimo_fwd")
    for number in (1, 2):  # both rank_sites tables list every switch of the forward, with the output's columns
        section = _section(text, number)
        assert all(f"| `{s}` |" in section for s in sites), number
    assert "| rank | site | one_on o | one_off o | score |" in _section(text, 1)
    assert "| rank | site | one_off o | one_on o | restored |" in _section(text, 2)
    assert re.search(r"\*\*(Recovered policy|Best-fitting policy, not a unique recovery)\*\* \(mamba_mimo_fwd\)",
                     _section(text, 5))


def test_forward_report_numbers_are_the_tools(fwd_report):
    """Section 3 holds output_errors of the presets against upstream's outputs on that case."""
    op = operator.get("mamba_mimo_fwd")
    case = next(c for c in op.load("golden")() if c.source == SMALL_CASE)
    errors = sensitivity.output_errors(op.draw(case), ["fp32", "upstream_sm90"],
                                       fwd_golden.upstream_outputs(SMALL_CASE), op=op.name)
    section = _section(fwd_report, 3)
    for preset, by_output in errors.items():
        assert f"| `{preset}` | {by_output['o']:.3g} |" in section, (preset, by_output)
    assert errors["upstream_sm90"]["o"] < errors["fp32"]["o"]  # the table is not all equal


def test_unknown_case_and_bad_limits_are_named(script, tmp_path):
    out = tmp_path / "x.md"
    with pytest.raises(SystemExit, match="unknown case.*no_such_case"):
        script.main(["--op", "mamba_mimo_fwd", "--cases", "no_such_case", "--out", str(out)])
    with pytest.raises(SystemExit, match="--limit must be >= 1"):
        script.main(["--op", "mamba_mimo_fwd", "--limit", "0", "--out", str(out)])
    with pytest.raises(SystemExit, match="--inference-limit is not supported for stage 1"):
        script.main(["--inference-limit", "1", "--out", str(out)])
    assert not out.exists()


@pytest.mark.parametrize("op_name", ["mamba_mimo_fwd", "mamba_mimo_bwd_bwd"])
def test_committed_report_lists_every_site_and_lp_output(op_name):
    """The committed reports cover every site of the operator, with one_on/one_off columns for each lp output
    (dq, dk, dv for stage 2) against fp64 and one_off against upstream."""
    op = operator.get(op_name)
    text = (ROOT / "reports" / f"sensitivity_{op_name}_golden.md").read_text(encoding="utf-8")
    assert f"`{op_name}`" in text.splitlines()[0]
    assert all(f"| `{s}` |" in text for s in registry.site_table(op_name))
    for output in op.lp_outputs:
        assert f"one_on {output} | one_off {output}" in text and f"one_off {output} | one_on {output}" in text
    assert re.search(r"\*\*(Recovered policy|Best-fitting policy, not a unique recovery)\*\*", text)
    assert "Run time" in text
