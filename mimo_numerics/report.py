"""``mimo-numerics report``: one case's numerics report for one operator (Markdown, JSON metrics, PNG figures).

Usage::

    mimo-numerics report [--op OP] [--case NAME] [--out DIR] [--baseline fp64|oracle] [--policies a,b,c]
                         [--claimed P] [--no-inference]
    python -m mimo_numerics.report [same arguments]

``--op`` names the operator (one of ``registry.OPERATORS``: the forward, backward stage 1 or stage 2; default
``registry.DEFAULT_OPERATOR``, backward stage 1). Everything operator-specific comes from its spec
(``mimo_numerics.operator``): stages, sites, sequence axes, outputs, cases and golden data. ``--op`` also takes
``registry.WHOLE_OP``, the whole op, a composite operator: :func:`build_report` hands it to its spec's ``report``
(``mimo_numerics.studies.report``, built on the same tools: ``drift.stage_drift`` and ``sensitivity.rank_sites``
with ``op="mamba3_mimo"``; its report: ``Out`` and the 14 gradients, one drift plot of the whole chain, the
one-site-off ranking of its roundings; ``--case``, ``--out``, ``--policies`` and ``--quiet`` apply, ``--baseline`` is the op's fp64 run either way).

With no ``--case`` it reports on the operator's embedded default case (:func:`default_case`: its first golden case
with every branch on; ``seed_branch_ro1_z1_d1`` for stage 1, real H200 outputs) on the CPU in a few seconds, and
writes to ``reports/<yyyymmdd>_<case>/`` under the current directory (``<yyyymmdd>_<op>_<case>`` for the other
operators, whose golden cases share their names).

``--case`` accepts a golden case name of the operator (``op.load("golden")``; the device result is the real upstream
H200 output), ``<grid>:<index>`` or a case id of one of its grids (``op.cases``; no device outputs: the device is
emulated by the Triton kernels, or the reference, under ``seed_bf16`` where that policy defines the operator), or a
result bundle directory (``mimo_numerics.bundles``; ``DIR`` or ``DIR::CASE``), whose outputs are the device result.

The output directory gets:

* ``summary.md``: what was run, the output errors of every policy and of the device against the FP64 baseline (and
  the ``fp64`` reference against the independent oracle), the agreement of each policy with the device, drift by
  stage (against FP64, and against the claimed policy, by default ``upstream_sm90``: where each run departs from
  it) and along the sequence, the sensitivity ranking of ``upstream_sm90``, the attribution of the ``seed_bf16`` →
  ``upstream_sm90`` gap and the policy inferred from the device outputs (those two where ``seed_bf16`` defines the
  operator), and the operator's stages with their sites;
* ``metrics.json``: every number of the summary (NaN/inf written as null/"inf");
* ``fig_drift_by_stage.png``, ``fig_drift_vs_claimed.png``, ``fig_drift_along_sequence.png``,
  ``fig_sensitivity.png``, ``fig_output_errors.png`` and, where the sections exist, ``fig_gap.png`` and
  ``fig_inference.png``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import drift as _drift
from . import operator as _operator
from . import plots as _plots
from . import presets as _presets
from .inference import infer_policy, single_threaded
from .metrics import bit_equal_fraction, rel_rms
from .ops import registry
from .sensitivity import attribute_gap, rank_sites

#: Policies the report compares by default (those of them that define the operator).
DEFAULT_POLICIES = ("fp32", "seed_bf16", "upstream_sm90")
#: The policy the stage drift is also measured against (``--claimed``): the one the device claims to implement.
DEFAULT_CLAIMED = "upstream_sm90"
#: The device emulated for a case without device outputs (the NPU port's policy), where it defines the operator.
EMULATION_POLICY = "seed_bf16"
#: The two policies of the gap attribution (A → B) and the start of the policy inference (A).
#: Candidate (from, to) pairs of the gap attribution, in order; the first both of whose presets define the operator.
GAP_POLICIES = (("seed_bf16", "upstream_sm90"), ("fp32", "upstream_sm90"))
#: The policy whose sites are ranked.
SENSITIVITY_POLICY = "upstream_sm90"
#: Runs left out of the figure against the claimed policy: high-precision runs, whose distance to it is the claimed
#: policy's own error (already in ``fig_drift_by_stage.png``).
HIGH_PRECISION_RUNS = ("fp64", "fp32")
#: Figure file names.
FIGURES = ("fig_drift_by_stage.png", "fig_drift_vs_claimed.png", "fig_drift_along_sequence.png",
           "fig_sensitivity.png", "fig_output_errors.png", "fig_gap.png", "fig_inference.png")

_P = _drift.OUTPUT_PREFIX


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


# ---------------------------------------------------------------------------------------------- cases
def _golden_specs(op) -> Dict[str, Any]:
    """``op``'s golden cases by name (none when it has no golden data)."""
    if op.golden is None:
        return {}
    return {spec.case_id: spec for spec in op.load("golden")()}


def _golden_upstream(op, name: str) -> Optional[Dict[str, Any]]:
    """The recorded upstream outputs of golden case ``name`` (``upstream_outputs`` of the golden loader's module)."""
    module = importlib.import_module(op.golden.partition(":")[0])
    outputs = module.upstream_outputs(name)
    return None if outputs is None else _drift.outputs_dict(outputs, op)


def default_case(op=None) -> str:
    """The case ``report`` uses without ``--case``: ``op``'s first golden case with every branch on (reduced
    output projection, Z and D), else its first golden case, else the first case of its first grid."""
    op = _operator.get(op)
    golden = list(_golden_specs(op).values())
    full = [s for s in golden if s.reduce_o and s.has_z and s.has_d]
    if full or golden:
        return (full or golden)[0].case_id
    grids = op.load("grids")()
    return next(iter(grids.values()))[0].case_id


def __getattr__(name: str):
    # DEFAULT_CASE: the default operator's default case, computed on first use (it reads the golden data)
    if name == "DEFAULT_CASE":
        return default_case()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _grid_case(name: str, op):
    grids = op.load("grids")()
    if ":" in name:
        grid_name, _, index = name.partition(":")
        if grid_name in grids and index.isdigit():
            grid = grids[grid_name]
            if int(index) >= len(grid):
                raise ReportError(f"--case {name}: grid {grid_name!r} has {len(grid)} cases; index {index} is out "
                                  "of range", f"use {grid_name}:0 .. {grid_name}:{len(grid) - 1}")
            return grid[int(index)]
    for grid in grids.values():
        for spec in grid:
            if spec.case_id == name:
                return spec
    return None


def _sizes(spec) -> str:
    branches = [flag for flag in ("reduce_o", "has_z", "has_d") if getattr(spec, flag)]
    return (f"B={spec.batch}, S={spec.seqlen}, H={spec.heads}, G={spec.groups}, N={spec.state_dim}, "
            f"P={spec.value_dim}, R={spec.rank}, C={spec.chunk_size}; {', '.join(branches) or 'no branch'}; "
            f"{spec.dtype}")


def _emulated(op) -> bool:
    return _presets.resolve(EMULATION_POLICY).defines(op.name)


def resolve_case(name: str, op=None) -> ReportCase:
    """A :class:`ReportCase` of operator ``op`` from a golden name, a grid case (``grid:index`` or case id) or a
    bundle directory."""
    op = _operator.get(op)
    golden = _golden_specs(op)
    if name in golden:
        return ReportCase(name, op.draw(golden[name]), _golden_upstream(op, name), "device: H200 upstream (golden)",
                          f"golden case `{name}` of `{op.name}` ({_sizes(golden[name])}); device = real upstream "
                          f"kernel on an NVIDIA H200 (golden data: `{op.golden.partition(':')[0]}`)")
    path_text, _, bundle_case = name.partition("::")
    path = Path(path_text)
    if (path / "manifest.json").is_file():
        runs = _drift.bundle_runs(path, bundle_case or None, op=op)
        if not runs:
            raise ReportError(f"--case {name}: bundle {path} has no case with outputs"
                              + (f" named {bundle_case!r}" if bundle_case else ""),
                              "mimo-numerics verify DIR lists its cases; give DIR::CASE of a case with outputs")
        case_name, inputs, run, label = runs[0]
        outputs = {o: run.get(_P + o) for o in op.output_names}
        return ReportCase(f"{path.name}_{case_name}", inputs, outputs, label,
                          f"bundle `{path}`, case `{case_name}`; {label}")
    spec = _grid_case(name, op)
    if spec is not None:
        device = "the device is emulated" if _emulated(op) else f"{EMULATION_POLICY} does not define it: no device run"
        return ReportCase(spec.case_id, op.draw(spec), None, None,
                          f"grid case `{spec.case_id}` of `{op.name}` (no device outputs: {device})")
    if bundle_case or "/" in path_text or path.exists():
        what = "is not a bundle (no manifest.json)" if path.exists() else "does not exist"
        raise ReportError(f"--case {name}: {path} {what}", _CASE_HINT)
    known = ", ".join(golden) or "none"
    raise ReportError(f"--case {name}: unknown case; golden cases are {known}", _CASE_HINT)


def default_out_dir(case_name: str, root: Path = Path("reports"), op=None) -> Path:
    """``reports/<yyyymmdd>_<case>`` (UTC date); ``<yyyymmdd>_<op>_<case>`` for an operator other than the
    default one."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    name = _operator.get(op).name
    tag = case_name if name == registry.DEFAULT_OPERATOR else f"{name}_{case_name}"
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in tag)
    return root / f"{stamp}_{safe}"


# ---------------------------------------------------------------------------------------------- helpers
def jsonable(value):
    """``value`` with NaN as None, infinities as strings and tuples as lists (for ``json.dumps``)."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def fmt3(value) -> str:
    """Three significant digits, ``–`` for None."""
    return "–" if value is None else f"{value:.3g}"


def markdown_table(rows: Sequence[Sequence[str]], head: Sequence[str]) -> str:
    """A Markdown table of ``rows`` under ``head``."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _error(actual, expected) -> float:
    """Relative RMS error (NaN, from non-finite values, counted as inf, as ``sensitivity.output_errors`` does)."""
    value = rel_rms(actual, expected)
    return math.inf if math.isnan(value) else value


def _run_errors(run, base: Dict[str, Any], op) -> Dict[str, float]:
    return {o: _error(run[_P + o], base[o]) for o in op.output_names if _P + o in run and base.get(o) is not None}


def _gap_policies(op) -> tuple:
    """The (from, to) pair of the gap attribution and the inference start: the first pair of
    :data:`GAP_POLICIES` whose presets both define ``op`` (``seed_bf16`` defines stage 1 only)."""
    for pair in GAP_POLICIES:
        if all(_presets.get(p).defines(op.name) for p in pair):
            return pair
    return ()


def _policies(names: Optional[Sequence[str]], op, lp: str) -> Dict[str, Any]:
    """``{label: policy}`` moved to the case's lp dtype; None: :data:`DEFAULT_POLICIES` that define ``op``."""
    if names is None:
        names = [p for p in DEFAULT_POLICIES if _presets.resolve(p).defines(op.name)]
    out: Dict[str, Any] = {}
    for i, name in enumerate(names):
        if not _presets.resolve(name).defines(op.name):
            raise ReportError(f"--policies {name}: it defines no rounding for {op.name}",
                              "mimo-numerics presets lists the presets and the operators each defines")
        label, policy = _drift.policy_at(name, lp)
        out[f"custom{i}" if label == "custom" else label] = policy
    return out


# ---------------------------------------------------------------------------------------------- the report
@single_threaded
def build_report(case: Optional[str] = None, out: Optional[Path] = None, policies: Optional[Sequence[str]] = None,
                 baseline: str = "fp64", infer: bool = True, log=None, claimed: str = DEFAULT_CLAIMED,
                 op=None) -> Path:
    """Write the report of one case (module docstring) and return its directory.

    Args:
        case (str, optional): see :func:`resolve_case`; default :func:`default_case` of ``op``.
        out (Path, optional): output directory (default :func:`default_out_dir`).
        policies (sequence of str, optional): reference policies to compare (preset names or policy JSON paths),
            run in the case's lp dtype; default :data:`DEFAULT_POLICIES`, those that define ``op``.
        baseline (str): ``"fp64"`` (reference preset, with stages) or ``"oracle"`` (``op``'s independent FP64
            oracle, outputs only, for the output errors; the stage drift always uses the ``fp64`` preset, the only
            baseline with stages).
        infer (bool): infer the device's policy (skipped without device outputs).
        log (callable, optional): progress messages (default: none).
        claimed (str): the policy the stage drift is also measured against (preset name or JSON path; its reference
            is run when it is not among ``policies``).
        op: the operator (a registry name or an ``Operator``; default ``registry.DEFAULT_OPERATOR``), or
            ``registry.WHOLE_OP`` (module docstring).

    Raises:
        ReportError: a bad case, or a policy that defines no rounding for ``op``.
    """
    composite = registry.composite(op)
    if composite is not None:  # the whole op: its spec's report (mimo_numerics.studies.report) writes the sections
        if claimed != DEFAULT_CLAIMED:
            raise ReportError(f"--claimed {claimed}: the {composite.name} report draws every stage against fp64 "
                              "only", "drop --claimed (the per-operator reports, --op NAME, use it)")
        return composite.load("report")(case, out, policies, log=log, progress=log is not None)
    say = log or (lambda message: None)
    started = time.monotonic()
    op = _operator.get(op)
    rc = resolve_case(default_case(op) if case is None else case, op)
    inputs = rc.inputs
    lp = _drift.lp_dtype_of(inputs, op)
    chosen = _policies(policies, op, lp)
    claimed_label, claimed_policy = _drift.policy_at(claimed, lp)
    if not claimed_policy.defines(op.name):
        raise ReportError(f"--claimed {claimed}: it defines no rounding for {op.name}",
                          "mimo-numerics presets lists the presets and the operators each defines")
    claimed_label = "claimed" if claimed_label.startswith("custom") else claimed_label
    out = Path(out) if out is not None else default_out_dir(rc.name, op=op)
    out.mkdir(parents=True, exist_ok=True)
    chunk = int(inputs["chunk_size"])
    metrics: Dict[str, Any] = {"case": rc.name, "operator": op.name, "description": rc.description,
                               "baseline": baseline, "policies": {l: p.to_dict() for l, p in chosen.items()},
                               "device_label": rc.device_label, "lp_dtype": lp, "chunk_size": chunk}

    # ---- runs and drift
    say("recording stages")
    runs = _drift.standard_runs(inputs, chosen, device_outputs=rc.device_outputs,
                                device_label=rc.device_label or "device",
                                emulation_policy=EMULATION_POLICY if _emulated(op) else None, op=op)
    device_label = [l for l in runs if l.startswith("device") or l.startswith("emulation")]
    device_label = device_label[0] if device_label else None
    stage_table = _drift.stage_drift(runs, "fp64", lp, op=op)
    seq = _drift.sequence_drift(runs, "fp64", chunk, per="token", op=op)
    seq_chunk = _drift.sequence_drift(runs, "fp64", chunk, per="chunk", op=op)
    departure = {}
    if "upstream_sm90" in runs:
        vs_up = _drift.stage_drift(runs, "upstream_sm90", lp, op=op)
        departure = {l: vs_up.entry_stage(l) for l in vs_up.labels()}
    if claimed_label not in runs:
        runs[claimed_label] = _drift.reference_run(inputs, claimed_policy, op)
    vs_claimed = _drift.stage_drift({l: r for l, r in runs.items()
                                     if l == claimed_label or l not in HIGH_PRECISION_RUNS}, claimed_label, lp, op=op)
    metrics["claimed_policy"] = {"label": claimed_label, "policy": claimed_policy.to_dict()}
    metrics["stage_drift"] = stage_table.to_dict()
    metrics["stage_drift_vs_claimed"] = vs_claimed.to_dict()
    metrics["entry_stage_vs_claimed"] = {l: vs_claimed.entry_stage(l) for l in vs_claimed.labels()}
    metrics["entry_stage_vs_upstream_sm90"] = departure
    metrics["sequence_drift_token"] = seq.to_dict()
    metrics["sequence_drift_chunk"] = seq_chunk.to_dict()

    # ---- output errors, from the runs (the reference is deterministic: the same outputs as a fresh call)
    say("output errors")
    fp64_outputs = {o: runs["fp64"].get(_P + o) for o in op.output_names}
    oracle = _drift.outputs_dict(op.run_oracle(inputs), op)
    base = oracle if baseline == "oracle" else fp64_outputs
    errors = {label: _run_errors(runs[label], base, op) for label in chosen}
    if device_label is not None:
        errors[device_label] = _run_errors(runs[device_label], base, op)
    metrics["output_errors"] = errors
    metrics["fp64_vs_oracle"] = _run_errors(runs["fp64"], oracle, op)
    agreement: Dict[str, Dict[str, Dict[str, float]]] = {}
    if rc.device_outputs is not None:
        for label in chosen:
            outs = {o: runs[label].get(_P + o) for o in op.output_names}
            agreement[label] = {o: {"rel_rms": rel_rms(outs[o], rc.device_outputs[o]),
                                    "bit_equal": bit_equal_fraction(outs[o], rc.device_outputs[o])}
                                for o in op.output_names if rc.device_outputs.get(o) is not None
                                and outs[o] is not None and outs[o].dtype == rc.device_outputs[o].dtype}
    metrics["device_agreement"] = agreement

    # ---- sensitivity, gap, inference
    skipped: Dict[str, str] = {}
    sens = gap = inference = None
    say("sensitivity ranking")
    sens = rank_sites(inputs, _presets.get(SENSITIVITY_POLICY).replace(lp_dtype=lp), baseline, op=op.name)
    metrics["sensitivity"] = sens.to_dict()
    pair = _gap_policies(op)
    if not pair:
        skipped["gap"] = skipped["inference"] = f"no pair of {GAP_POLICIES} defines {op.name}"
    else:
        say("gap attribution")
        a, b = (_presets.get(p).replace(lp_dtype=lp) for p in pair)
        gap = attribute_gap(inputs, a, b, target=rc.device_outputs if rc.device_outputs is not None else None,
                            op=op.name)
        metrics["gap_attribution"] = gap.to_dict()
        if infer and rc.device_outputs is not None:
            say("policy inference")
            inference = infer_policy(inputs, rc.device_outputs, start=pair[0], op=op.name)
            metrics["inference"] = inference.to_dict()
    metrics["skipped"] = skipped

    # ---- figures
    say("figures")
    where = f"{rc.name} ({op.name})"
    figures: List[str] = []

    def save(fig, name):
        _plots.save_figure(fig, out / name)
        figures.append(name)

    save(_plots.plot_stage_drift(stage_table, title=f"Error by stage vs fp64: {where}"), "fig_drift_by_stage.png")
    save(_plots.plot_stage_drift(vs_claimed, title=f"Error by stage vs the claimed policy {claimed_label}: {where}"),
         "fig_drift_vs_claimed.png")
    token_stages = [s for s in _drift.sequence_stages(op, "token") if s in seq.stages()][:2]
    if token_stages:
        save(_plots.plot_sequence_drift(seq, token_stages, title=f"Error along the sequence, per token: {where}"),
             "fig_drift_along_sequence.png")
    if sens is not None:
        save(_plots.plot_sensitivity(sens), "fig_sensitivity.png")
    save(_plots.plot_output_errors(errors, baseline), "fig_output_errors.png")
    if gap is not None:
        save(_plots.plot_gap_attribution(gap), "fig_gap.png")
    if inference is not None:
        start_label = f"start: {inference.start.name}"
        save(_plots.plot_inference(inference, extra={start_label: inference.start_distance}), "fig_inference.png")
    metrics["figures"] = figures
    metrics["seconds"] = time.monotonic() - started

    # ---- summary
    (out / "metrics.json").write_text(json.dumps(jsonable(metrics), indent=1), encoding="utf-8")
    (out / "summary.md").write_text(_summary(rc, op, metrics, stage_table, vs_claimed, seq_chunk, errors, agreement,
                                             sens, gap, inference, figures, baseline), encoding="utf-8")
    say(f"wrote {out} in {metrics['seconds']:.1f} s")
    return out


def _summary(rc, op, metrics, stage_table, vs_claimed, seq_chunk, errors, agreement, sens, gap, inference, figures,
             baseline) -> str:
    import torch

    from . import __version__

    lines = [f"# Numerics report: {rc.name}", "",
             f"{rc.description}.", "",
             f"Generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by `mimo-numerics report` "
             f"(mimo_numerics {__version__}, torch {torch.__version__}) in {metrics['seconds']:.1f} s. Operator: "
             f"`{op.name}` ({op.title}). Baseline: `{baseline}`. Policies: "
             + ", ".join(f"`{p}`" for p in metrics["policies"]) + ".", ""]
    outputs = [o for o in op.output_names if any(o in e for e in errors.values())]
    check = metrics["fp64_vs_oracle"]
    lines += ["## Output error against the baseline (relative RMS)", "",
              markdown_table([[f"`{l}`"] + [fmt3(e.get(o)) for o in outputs] for l, e in errors.items()], ["run", *outputs]),
              "", "The `fp64` reference (the stage baseline) against the independent FP64 oracle: "
              + ", ".join(f"{o}: {fmt3(v)}" for o, v in check.items()) + ".", ""]
    if agreement:
        lines += [f"## Agreement with the device ({rc.device_label})", "",
                  "relative RMS / bit-equal fraction of each policy's outputs against the device outputs.", "",
                  markdown_table([[f"`{l}`"] + [f"{a[o]['rel_rms']:.3g} / {a[o]['bit_equal']:.4f}" if o in a else "–"
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
    chunk_stages = [s for s in _drift.sequence_stages(op, "chunk") if s in seq_chunk.stages()]
    figure = ["Per token (the figure's x axis is the token index):", "",
              "![drift along the sequence, per token](fig_drift_along_sequence.png)", ""] \
        if "fig_drift_along_sequence.png" in figures else []
    lines += ["## Drift along the sequence", "", *figure,
              f"Per chunk ({metrics['chunk_size']} tokens each; chunk 0 first): relative RMS error against fp64:", ""]
    rows = []
    for label, stages in seq_chunk.values.items():
        for s in chunk_stages:
            if s in stages:
                rows.append([f"`{label}`", f"`{s}`", ", ".join(fmt3(v) if v == v else "–" for v in stages[s])])
    lines += [markdown_table(rows, ["run", "stage", "per chunk (chunk 0, 1, ...)"]), ""]
    skipped = metrics["skipped"]
    if sens is not None:
        lines += [f"## Sensitivity of `{sens.policy.name}` (one-on / one-off, against `{sens.baseline}`)", "",
                  "![sensitivity](fig_sensitivity.png)", "",
                  "one-on: only this site rounded; one-off: every site of the policy but this one; score: fraction "
                  "of the policy's error the site adds alone, mean over outputs (`mimo_numerics.sensitivity`).", "",
                  sens.to_markdown(), ""]
    if gap is not None:
        lines += ["## Gap attribution", "", "![gap](fig_gap.png)", "", gap.to_markdown(), "",
                  "Field closing most of the gap per output: "
                  + ", ".join(f"{o}: `{gap.top(o)}`" for o in gap.outputs if gap.rows and gap.gap[o] > 0), ""]
    if inference is not None:
        seed_d = inference.start_distance
        ratio = seed_d / inference.distance if inference.distance > 0 else math.inf
        lines += ["## Policy inferred from the device outputs", "", "![inference](fig_inference.png)", "",
                  inference.to_markdown(), "",
                  f"Distance of the start policy `{inference.start.name}` over the "
                  f"{'best fit' if inference.undetermined() else 'recovered one'}: {ratio:.3g}×.", ""]
    if skipped:
        titles = {"sensitivity": "sensitivity ranking", "gap": "gap attribution", "inference": "policy inference"}
        lines += ["## Left out", ""] + [f"* {titles[k]}: {why}." for k, why in skipped.items()] + [""]
    lines += [f"## Stages of `{op.name}`", "", _drift.describe_stages(op), ""]
    lines += ["## Files", "", "`metrics.json` (every number above), " + ", ".join(f"`{f}`" for f in figures), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- CLI
def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``report`` options to ``parser`` (used by ``mimo-numerics report`` and ``python -m``)."""
    parser.add_argument("--op", default=registry.DEFAULT_OPERATOR, choices=registry.REPORT_OPERATORS,
                        help=f"the operator (default {registry.DEFAULT_OPERATOR}), or {registry.WHOLE_OP}: the whole "
                             "op (Out and its 14 gradients, every stage of the chain, its roundings ranked)")
    parser.add_argument("--case", default=None,
                        help="golden case name, <grid>:<index>, a grid case_id, or a bundle dir[::case] (default: the "
                             "operator's first golden case with every branch on; seed_branch_ro1_z1_d1 for "
                             f"{registry.DEFAULT_OPERATOR})")
    parser.add_argument("--out", default=None, type=Path,
                        help="output directory (default reports/<yyyymmdd>_<case> under the current directory, "
                             "<yyyymmdd>_<op>_<case> for another operator than the default)")
    parser.add_argument("--baseline", default="fp64", choices=("fp64", "oracle"),
                        help="what output errors are measured against (default fp64)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated preset names or policy JSON paths to compare (default "
                             f"{','.join(DEFAULT_POLICIES)}: those of them that define the operator)")
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
    policies = None
    if args.policies is not None:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise ReportError("--policies is empty", "give comma-separated preset names, e.g. fp32,seed_bf16")
    for option, policy in [("--policies", p) for p in policies or ()] + [("--claimed", args.claimed)]:
        try:
            _presets.resolve(policy)
        except (ValueError, TypeError, OSError) as exc:
            raise ReportError(f"{option} {policy}: {exc}",
                              "mimo-numerics presets lists the preset names; a policy file must end in .json") \
                from None
    log = None if args.quiet else (lambda message: print(f"report: {message}", file=sys.stderr, flush=True))
    out = build_report(args.case, args.out, policies, args.baseline, infer=not args.no_inference, log=log,
                       claimed=args.claimed, op=getattr(args, "op", None))
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
