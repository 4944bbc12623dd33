"""``mimo-numerics report``: one case's numerics report (Markdown, JSON metrics and PNG figures).

Usage::

    mimo-numerics report [--case NAME] [--out DIR] [--baseline fp64|oracle] [--policies a,b,c] [--claimed P]
                         [--no-inference]
    python -m mimo_numerics.report [same arguments]

With no arguments it reports on the golden case ``seed_branch_ro1_z1_d1`` (every branch on, real H200 outputs) on
the CPU in a few seconds, and writes to ``reports/<yyyymmdd>_<case>/`` under the current directory.

``--case`` accepts a golden case name (``mimo_numerics.golden``; the device result is the real upstream H200
output), ``<grid>:<index>`` or a ``CaseSpec.case_id`` of a grid of ``mimo_numerics.cases`` (no device outputs: the
device is emulated by the Triton kernels, or the reference, under ``seed_bf16``), or a result bundle directory
(``mimo_numerics.bundles``; ``DIR`` or ``DIR::CASE``), whose outputs are the device result.

The output directory gets:

* ``summary.md``: what was run, the output errors of every policy and of the device against the FP64 baseline, the
  agreement of each policy with the device, drift by stage (against FP64, and against the claimed policy, by
  default ``upstream_sm90``: where each run departs from it) and along the sequence, the sensitivity ranking of
  ``upstream_sm90``, the attribution of the ``seed_bf16`` → ``upstream_sm90`` gap and the policy inferred from the
  device outputs;
* ``metrics.json``: every number of the summary (NaN/inf written as null/"inf");
* ``fig_drift_by_stage.png``, ``fig_drift_vs_claimed.png``, ``fig_drift_along_sequence.png``,
  ``fig_sensitivity.png``, ``fig_output_errors.png``, ``fig_gap.png`` and, with device outputs,
  ``fig_inference.png``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import drift as _drift
from . import golden as _golden
from . import plots as _plots
from . import presets as _presets
from .inference import infer_policy, lp_dtype_of, run_reference, single_threaded
from .metrics import bit_equal_fraction, rel_rms
from .outputs import OUTPUT_NAMES
from .sensitivity import attribute_gap, baseline_outputs, output_errors, rank_sites

#: The case of ``mimo-numerics report`` without ``--case``.
DEFAULT_CASE = _golden.DEFAULT_CASE
#: Policies the report compares by default.
DEFAULT_POLICIES = ("fp32", "seed_bf16", "upstream_sm90")
#: The policy the stage drift is also measured against (``--claimed``): the one the device claims to implement.
DEFAULT_CLAIMED = "upstream_sm90"
#: Runs left out of the figure against the claimed policy: high-precision runs, whose distance to it is the claimed
#: policy's own error (already in ``fig_drift_by_stage.png``).
HIGH_PRECISION_RUNS = ("fp64", "fp32")
#: Figure file names.
FIGURES = ("fig_drift_by_stage.png", "fig_drift_vs_claimed.png", "fig_drift_along_sequence.png",
           "fig_sensitivity.png", "fig_output_errors.png", "fig_gap.png", "fig_inference.png")


class ReportError(ValueError):
    """A bad ``report`` argument; ``hint`` says what to give instead (``mimo-numerics: error: ... (hint: ...)``)."""

    def __init__(self, message: str, hint: str = "mimo-numerics report --help describes the options"):
        super().__init__(message)
        self.hint = hint


_CASE_HINT = "--case takes a golden case name, <grid>:<index>, a grid case_id, or a bundle DIR[::CASE]"


@dataclass
class ReportCase:
    """A case to report on: inputs, the device outputs when known, and where they come from."""

    name: str
    inputs: Dict[str, Any]
    device_outputs: Optional[Dict[str, Any]]
    device_label: Optional[str]
    description: str


def _grid_case(name: str):
    from . import cases as _cases

    if ":" in name:
        grid_name, _, index = name.partition(":")
        if grid_name in _cases.grid_names() and index.isdigit():
            grid = _cases.grid(grid_name)
            if int(index) >= len(grid):
                raise ReportError(f"--case {name}: grid {grid_name!r} has {len(grid)} cases; index {index} is out "
                                  "of range", f"use {grid_name}:0 .. {grid_name}:{len(grid) - 1}")
            return grid[int(index)]
    for grid_name in _cases.grid_names():
        for spec in _cases.grid(grid_name):
            if spec.case_id == name:
                return spec
    return None


def resolve_case(name: str) -> ReportCase:
    """A :class:`ReportCase` from a golden name, a grid case (``grid:index`` or case id) or a bundle directory."""
    if name in _golden.golden_names():
        inputs, upstream = _golden.golden_case(name)
        kw = _golden.golden_kwargs(name)
        return ReportCase(name, inputs, upstream, "device: H200 upstream (golden)",
                          f"golden case `{name}` (seed formula, {kw}); device = real upstream kernel on an NVIDIA "
                          f"H200 (tests/data/upstream_h200_seed_cases.pt)")
    path_text, _, bundle_case = name.partition("::")
    path = Path(path_text)
    if (path / "manifest.json").is_file():
        runs = _drift.bundle_runs(path, bundle_case or None)
        if not runs:
            raise ReportError(f"--case {name}: bundle {path} has no case with outputs"
                              + (f" named {bundle_case!r}" if bundle_case else ""),
                              "mimo-numerics verify DIR lists its cases; give DIR::CASE of a case with outputs")
        case_name, inputs, run, label = runs[0]
        outputs = {o: run.get(_drift.OUTPUT_PREFIX + o) for o in OUTPUT_NAMES}
        return ReportCase(f"{path.name}_{case_name}", inputs, outputs, label,
                          f"bundle `{path}`, case `{case_name}`; {label}")
    spec = _grid_case(name)
    if spec is not None:
        from .cases import make_inputs

        return ReportCase(spec.case_id, make_inputs(spec), None, None,
                          f"grid case `{spec.case_id}` (no device outputs: the device is emulated)")
    if bundle_case or "/" in path_text or path.exists():
        what = "is not a bundle (no manifest.json)" if path.exists() else "does not exist"
        raise ReportError(f"--case {name}: {path} {what}", _CASE_HINT)
    raise ReportError(f"--case {name}: unknown case; golden cases are {', '.join(_golden.golden_names())}",
                      _CASE_HINT)


def default_out_dir(case_name: str, root: Path = Path("reports")) -> Path:
    """``reports/<yyyymmdd>_<case>`` (UTC date)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in case_name)
    return root / f"{stamp}_{safe}"


def _jsonable(value):
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.3g}"


def _table(rows: Sequence[Sequence[str]], head: Sequence[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


@single_threaded
def build_report(case: str = DEFAULT_CASE, out: Optional[Path] = None, policies: Sequence[str] = DEFAULT_POLICIES,
                 baseline: str = "fp64", infer: bool = True, log=None, claimed: str = DEFAULT_CLAIMED) -> Path:
    """Write the report of one case (module docstring) and return its directory.

    Args:
        case (str): see :func:`resolve_case`.
        out (Path, optional): output directory (default :func:`default_out_dir`).
        policies (sequence of str): reference policies to compare (preset names or policy JSON paths).
        baseline (str): ``"fp64"`` (reference preset, with stages) or ``"oracle"`` (outputs only for the output
            errors; the stage drift always uses the ``fp64`` preset, the only baseline with stages).
        infer (bool): infer the device's policy (skipped without device outputs).
        log (callable, optional): progress messages (default: none).
        claimed (str): the policy the stage drift is also measured against (preset name or JSON path; its reference
            is run when it is not among ``policies``).
    """
    say = log or (lambda message: None)
    started = time.monotonic()
    rc = resolve_case(case)
    out = Path(out) if out is not None else default_out_dir(rc.name)
    out.mkdir(parents=True, exist_ok=True)
    inputs = rc.inputs
    lp = lp_dtype_of(inputs)
    chunk = int(inputs["chunk_size"])
    resolved = [_presets.resolve(p) for p in policies]
    labels = [p.name if p.name != "custom" else f"custom{i}" for i, p in enumerate(resolved)]
    metrics: Dict[str, Any] = {"case": rc.name, "description": rc.description, "baseline": baseline,
                               "policies": {l: p.to_dict() for l, p in zip(labels, resolved)},
                               "device_label": rc.device_label, "lp_dtype": lp}

    # ---- runs and drift
    say("recording stages")
    runs = _drift.standard_runs(inputs, resolved, device_outputs=rc.device_outputs,
                                device_label=rc.device_label or "device")
    device_label = [l for l in runs if l.startswith("device") or l.startswith("emulation")]
    device_label = device_label[0] if device_label else None
    stage_table = _drift.stage_drift(runs, "fp64", lp)
    seq = _drift.sequence_drift(runs, "fp64", chunk, per="token")
    seq_chunk = _drift.sequence_drift(runs, "fp64", chunk, per="chunk")
    departure = {}
    if "upstream_sm90" in runs:
        vs_up = _drift.stage_drift(runs, "upstream_sm90", lp)
        departure = {l: vs_up.entry_stage(l) for l in vs_up.labels()}
    claimed_policy = _presets.resolve(claimed)
    claimed_label = claimed_policy.name if claimed_policy.name != "custom" else "claimed"
    if claimed_label not in runs:
        runs[claimed_label] = _drift.reference_run(inputs, claimed_policy)
    vs_claimed = _drift.stage_drift({l: r for l, r in runs.items()
                                     if l == claimed_label or l not in HIGH_PRECISION_RUNS}, claimed_label, lp)
    metrics["claimed_policy"] = {"label": claimed_label, "policy": claimed_policy.to_dict()}
    metrics["stage_drift"] = stage_table.to_dict()
    metrics["stage_drift_vs_claimed"] = vs_claimed.to_dict()
    metrics["entry_stage_vs_claimed"] = {l: vs_claimed.entry_stage(l) for l in vs_claimed.labels()}
    metrics["entry_stage_vs_upstream_sm90"] = departure
    metrics["sequence_drift_token"] = seq.to_dict()
    metrics["sequence_drift_chunk"] = seq_chunk.to_dict()

    # ---- output errors
    say("output errors")
    errors = output_errors(inputs, dict(zip(labels, resolved)), baseline)
    base = baseline_outputs(inputs, baseline)[0]
    if device_label is not None:
        device_run = runs[device_label]
        errors[device_label] = {o: rel_rms(device_run[_drift.OUTPUT_PREFIX + o], base[o]) for o in OUTPUT_NAMES
                                if _drift.OUTPUT_PREFIX + o in device_run and base.get(o) is not None}
    metrics["output_errors"] = errors
    agreement: Dict[str, Dict[str, Dict[str, float]]] = {}
    if rc.device_outputs is not None:
        for label, policy in zip(labels, resolved):
            if policy.lp_dtype != lp:
                continue
            outs = run_reference(inputs, policy)
            agreement[label] = {o: {"rel_rms": rel_rms(outs[o], rc.device_outputs[o]),
                                    "bit_equal": bit_equal_fraction(outs[o], rc.device_outputs[o])}
                                for o in OUTPUT_NAMES if rc.device_outputs.get(o) is not None
                                and outs[o] is not None and outs[o].dtype == rc.device_outputs[o].dtype}
    metrics["device_agreement"] = agreement

    # ---- sensitivity, gap, inference
    say("sensitivity ranking")
    sens = rank_sites(inputs, _presets.get("upstream_sm90").replace(lp_dtype=lp), baseline)
    metrics["sensitivity"] = sens.to_dict()
    say("gap attribution")
    gap = attribute_gap(inputs, _presets.get("seed_bf16").replace(lp_dtype=lp),
                        _presets.get("upstream_sm90").replace(lp_dtype=lp),
                        target=rc.device_outputs if rc.device_outputs is not None else None)
    metrics["gap_attribution"] = gap.to_dict()
    inference = None
    if infer and rc.device_outputs is not None:
        say("policy inference")
        inference = infer_policy(inputs, rc.device_outputs, start="seed_bf16")
        metrics["inference"] = inference.to_dict()

    # ---- figures
    say("figures")
    figures: List[str] = []
    _plots.save_figure(_plots.plot_stage_drift(stage_table, title=f"Error by stage vs fp64: {rc.name}"),
                       out / "fig_drift_by_stage.png")
    figures.append("fig_drift_by_stage.png")
    _plots.save_figure(_plots.plot_stage_drift(vs_claimed, title=f"Error by stage vs the claimed policy "
                                                                 f"{claimed_label}: {rc.name}"),
                       out / "fig_drift_vs_claimed.png")
    figures.append("fig_drift_vs_claimed.png")
    token_stages = [s for s in ("out", "output.dz", "output.qk_dot") if s in seq.stages()][:2]
    _plots.save_figure(_plots.plot_sequence_drift(seq, token_stages, title=f"Error along the sequence: {rc.name}"),
                       out / "fig_drift_along_sequence.png")
    figures.append("fig_drift_along_sequence.png")
    _plots.save_figure(_plots.plot_sensitivity(sens), out / "fig_sensitivity.png")
    figures.append("fig_sensitivity.png")
    _plots.save_figure(_plots.plot_output_errors(errors, baseline), out / "fig_output_errors.png")
    figures.append("fig_output_errors.png")
    _plots.save_figure(_plots.plot_gap_attribution(gap), out / "fig_gap.png")
    figures.append("fig_gap.png")
    if inference is not None:
        start_label = f"start: {inference.start.name}"
        _plots.save_figure(_plots.plot_inference(inference, extra={start_label: inference.start_distance}),
                           out / "fig_inference.png")
        figures.append("fig_inference.png")
    metrics["figures"] = figures
    metrics["seconds"] = time.monotonic() - started

    # ---- summary
    (out / "metrics.json").write_text(json.dumps(_jsonable(metrics), indent=1), encoding="utf-8")
    (out / "summary.md").write_text(_summary(rc, metrics, stage_table, vs_claimed, seq_chunk, errors, agreement,
                                             sens, gap, inference, figures, baseline), encoding="utf-8")
    say(f"wrote {out} in {metrics['seconds']:.1f} s")
    return out


def _summary(rc, metrics, stage_table, vs_claimed, seq_chunk, errors, agreement, sens, gap, inference, figures,
             baseline) -> str:
    import torch

    from . import __version__

    lines = [f"# Numerics report: {rc.name}", "",
             f"{rc.description}.", "",
             f"Generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by `mimo-numerics report` "
             f"(mimo_numerics {__version__}, torch {torch.__version__}) in {metrics['seconds']:.1f} s. Baseline: "
             f"`{baseline}`. Policies: " + ", ".join(f"`{p}`" for p in metrics["policies"]) + ".", ""]
    outputs = [o for o in OUTPUT_NAMES if any(o in e for e in errors.values())]
    lines += ["## Output error against the baseline (relative RMS)", "",
              _table([[f"`{l}`"] + [_fmt(e.get(o)) for o in outputs] for l, e in errors.items()], ["run", *outputs]),
              ""]
    if agreement:
        lines += [f"## Agreement with the device ({rc.device_label})", "",
                  "relative RMS / bit-equal fraction of each policy's outputs against the device outputs.", "",
                  _table([[f"`{l}`"] + [f"{a[o]['rel_rms']:.3g} / {a[o]['bit_equal']:.4f}" if o in a else "–"
                                        for o in outputs] for l, a in agreement.items()], ["policy", *outputs]), ""]
    lines += ["## Drift by stage", "", "![drift by stage](fig_drift_by_stage.png)", "",
              stage_table.to_markdown(), ""]
    claimed = metrics["claimed_policy"]["label"]
    lines += [f"## Drift by stage against the claimed policy `{claimed}`", "",
              "![drift against the claimed policy](fig_drift_vs_claimed.png)", "",
              f"The same stages against `{claimed}` instead of FP64: a run is bit-identical to it (on the `0 (exact)` "
              "line) up to the first stage where its rounding semantics differ. High-precision runs ("
              + ", ".join(f"`{l}`" for l in HIGH_PRECISION_RUNS) + ") are left out: their distance to it is its own "
              "error, shown above.", "",
              f"First stage (pipeline order) where each run departs from `{claimed}`: "
              + ", ".join(f"`{l}`: {s or 'never'}" for l, s in metrics["entry_stage_vs_claimed"].items()), "",
              vs_claimed.to_markdown(), ""]
    chunk_stages = [s for s in ("state", "out", "output.states", "output.dz") if s in seq_chunk.stages()]
    lines += ["## Drift along the sequence", "", "![drift along the sequence](fig_drift_along_sequence.png)", "",
              "Relative RMS error against fp64 per chunk:", ""]
    rows = []
    for label, stages in seq_chunk.values.items():
        for s in chunk_stages:
            if s in stages:
                rows.append([f"`{label}`", f"`{s}`", ", ".join(_fmt(v) if v == v else "–" for v in stages[s])])
    lines += [_table(rows, ["run", "stage", "per chunk"]), ""]
    lines += [f"## Sensitivity of `{sens.policy.name}` (one-on / one-off, against `{sens.baseline}`)", "",
              "![sensitivity](fig_sensitivity.png)", "",
              "one-on: only this site rounded; one-off: every site of the policy but this one; score: fraction of "
              "the policy's error the site adds alone, mean over outputs (`mimo_numerics.sensitivity`).", "",
              sens.to_markdown(), ""]
    lines += ["## Gap attribution", "", "![gap](fig_gap.png)", "", gap.to_markdown(), "",
              "Field closing most of the gap per output: "
              + ", ".join(f"{o}: `{gap.top(o)}`" for o in gap.outputs if gap.rows and gap.gap[o] > 0), ""]
    if inference is not None:
        seed_d = inference.start_distance
        ratio = seed_d / inference.distance if inference.distance > 0 else math.inf
        lines += ["## Policy inferred from the device outputs", "", "![inference](fig_inference.png)", "",
                  inference.to_markdown(), "",
                  f"Distance of the start policy `{inference.start.name}` over the recovered one: {ratio:.3g}×.", ""]
    lines += ["## Files", "", "`metrics.json` (every number above), " + ", ".join(f"`{f}`" for f in figures), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- CLI
def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``report`` options to ``parser`` (used by ``mimo-numerics report`` and ``python -m``)."""
    parser.add_argument("--case", default=DEFAULT_CASE,
                        help=f"golden case name, <grid>:<index>, a grid case_id, or a bundle dir[::case] "
                             f"(default {DEFAULT_CASE})")
    parser.add_argument("--out", default=None, type=Path,
                        help="output directory (default reports/<yyyymmdd>_<case> under the current directory)")
    parser.add_argument("--baseline", default="fp64", choices=("fp64", "oracle"),
                        help="what output errors are measured against (default fp64)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                        help="comma-separated preset names or policy JSON paths to compare "
                             f"(default {','.join(DEFAULT_POLICIES)})")
    parser.add_argument("--claimed", default=DEFAULT_CLAIMED,
                        help="policy the stage drift is also measured against: the one the device claims to "
                             f"implement (default {DEFAULT_CLAIMED})")
    parser.add_argument("--no-inference", action="store_true", help="skip inferring the device's policy")
    parser.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
    return parser


def run_report(args: argparse.Namespace) -> int:
    """Run the report for parsed ``args`` (from :func:`add_report_arguments`); returns 0.

    Raises:
        ReportError: a bad ``--case`` or ``--policies`` (``mimo-numerics`` prints it as its one-line error).
    """
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ReportError("--policies is empty", "give comma-separated preset names, e.g. fp32,seed_bf16")
    for option, policy in [("--policies", p) for p in policies] + [("--claimed", args.claimed)]:
        try:
            _presets.resolve(policy)
        except (ValueError, TypeError, OSError) as exc:
            raise ReportError(f"{option} {policy}: {exc}",
                              "mimo-numerics presets lists the preset names; a policy file must end in .json") \
                from None
    log = None if args.quiet else (lambda message: print(f"report: {message}", file=sys.stderr, flush=True))
    out = build_report(args.case, args.out, policies, args.baseline, infer=not args.no_inference, log=log,
                       claimed=args.claimed)
    print(out)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m mimo_numerics.report``: the same as ``mimo-numerics report`` (errors in its one-line format)."""
    import matplotlib

    from . import cli

    matplotlib.use("Agg")
    return cli.main(["report", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
