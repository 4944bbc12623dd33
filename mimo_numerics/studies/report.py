"""``mimo-numerics report --op mamba3_mimo``: the numerics report of the whole op on one case.

The generic report (``mimo_numerics.report.build_report``) hands the whole op, a composite operator
(``mimo_numerics.ops.mamba3_mimo.spec``), to :func:`build_report` here. The measurements are the generic tools'
(``sensitivity.run_errors`` and ``sensitivity.rank_sites``, ``drift.stage_drift`` and ``drift.stage_groups`` with
``op="mamba3_mimo"``); what is the whole op's own is its cases (golden, ``small``, the oracle grid), its runs
(``ops/mamba3_mimo/runs.py``: forward and ``backward(dout)`` with every stage recorded) and the summary's wording.

Usage::

    mimo-numerics report --op mamba3_mimo [--case NAME] [--out DIR] [--policies a,b] [--quiet]

The op (``mn.mamba3_mimo``: preprocessing, forward, backward stage 1, stage 2, FP32 epilogue) runs from the raw
inputs, forward and ``backward(dout)``, under each policy (default :data:`DEFAULT_POLICIES`) and under ``fp64`` (the
baseline: FP64 oracles of every step; :func:`runs.fp64_run` adds the internal stages). With no ``--case`` it reports
on :data:`DEFAULT_CASE`, the first whole-op golden case with every branch on (real H200 outputs of upstream, about
10-20 s on 2 CPU cores), and writes ``reports/<yyyymmdd>_mamba3_mimo_<case>/`` under the current directory.

``--case`` takes a whole-op golden case name (``golden.load()``; the upstream run is its recorded H200 tensors),
``small`` (``cases.small_case()``, drawn, no upstream) or the ``case_id`` (or ``oracle:<index>``) of a case of
``cases.ORACLE_GRID`` the backward supports.

The output directory gets:

* ``summary.md``: the error of ``Out`` and of the 14 gradients against FP64 under each policy and upstream (golden),
  how close each policy is to upstream, the error of every stage of the whole chain, and the one-site-off ranking of
  the whole op's roundings per gradient (``sensitivity.rank_sites(..., op="mamba3_mimo")``, under
  :data:`RANKING_POLICY`);
* ``metrics.json``: every number of the summary (NaN written as null, inf as "inf");
* :data:`FIGURES`: the output errors, the one drift plot of the chain (x: every stage in chain order, grouped by
  operator; y: rel RMS vs the fp64 run's same stage, log, exact zeros on their own line) and the ranking heat map.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .. import drift as _drift
from .. import plots as _plots
from .. import presets as _presets
from .. import sensitivity as _sensitivity
from ..inference import single_threaded
from ..metrics import rel_rms
from ..ops import registry
from ..ops.mamba3_mimo import cases as _cases
from ..ops.mamba3_mimo import golden as _golden
from ..ops.mamba3_mimo import runs as _runs
from ..ops.mamba3_mimo.runs import OUTPUT_KEYS
from ..report import ReportError
from ..report import fmt3 as _fmt
from ..report import jsonable as _jsonable
from ..report import markdown_table as _table
from .. import provenance as _provenance

#: The whole op's name (the report's ``--op``; ``registry.WHOLE_OP``).
OP_NAME = registry.WHOLE_OP
#: The report's case without ``--case``: the first whole-op golden case with every branch on (MIMO_Out, Z, D).
DEFAULT_CASE = "g_B1_S64_H2_N64_P64_R4_C16_zdo"
#: Policies compared by default.
DEFAULT_POLICIES = ("fp32", "upstream_sm90")
#: The policy whose roundings are ranked.
RANKING_POLICY = "upstream_sm90"
#: Label of the golden upstream run.
UPSTREAM_LABEL = "upstream (H200, golden)"
#: Rows of the ranking heat map (the best-scoring roundings).
HEATMAP_ROWS = 20
#: Figure file names.
FIGURES = ("fig_output_errors.png", "fig_drift_chain.png", "fig_site_ranking.png")
_CASE_HINT = "--case takes a whole-op golden case name, small, or a cases.ORACLE_GRID case_id / oracle:<index>"


@dataclass
class OpReportCase:
    """A case of the whole op: its inputs, the golden upstream tensors when it is a golden case, a description."""

    name: str
    inputs: Dict[str, Any]
    upstream: Optional[Dict[str, Any]]
    description: str


def _sizes(x: dict) -> str:
    B, S, R, G, N = x["Q"].shape
    H, P = x["V"].shape[2], x["V"].shape[3]
    branches = [name for name, given in (("MIMO_Out", x["MIMO_Out"] is not None), ("Z", x["Z"] is not None),
                                         ("D", x["D"] is not None)) if given]
    return (f"B={B}, S={S}, H={H}, G={G}, N={N}, P={P}, R={R}, C={x['chunk_size']}; "
            f"{', '.join(branches) or 'no branch'}; {str(x['Q'].dtype).replace('torch.', '')}")


def _drawn(name: str):
    if name == "small":
        return _cases.small_case()
    grid = _cases.ORACLE_GRID
    if name.startswith("oracle:") and name[len("oracle:"):].isdigit():
        index = int(name[len("oracle:"):])
        if index >= len(grid):
            raise ReportError(f"--case {name}: cases.ORACLE_GRID has {len(grid)} cases", f"use oracle:0 .. "
                              f"oracle:{len(grid) - 1}")
        return grid[index]
    return next((spec for spec in grid if spec.case_id == name), None)


def resolve_case(name: Optional[str] = None) -> OpReportCase:
    """An :class:`OpReportCase` from a golden case name, ``small`` or a ``cases.ORACLE_GRID`` case (module
    docstring); default :data:`DEFAULT_CASE`."""
    name = DEFAULT_CASE if name is None else name
    data = _golden.load()
    if name in data:
        case = data[name]
        upstream = _runs.upstream_run(case) or None
        where = ("device = real upstream op on an NVIDIA H200 (golden data: `mimo_numerics.ops.mamba3_mimo.golden`)"
                 if upstream else "upstream refused this case: no device tensors")
        return OpReportCase(name, dict(case["inputs"]), upstream,
                            f"whole-op golden case `{name}` ({_sizes(case['inputs'])}); {where}")
    spec = _drawn(name)
    if spec is None:
        raise ReportError(f"--case {name}: unknown case of {OP_NAME}; golden cases are {', '.join(data)}",
                          _CASE_HINT)
    inputs = _cases.make_op_inputs(spec)
    return OpReportCase(spec.case_id, inputs, None,
                        f"drawn case `{spec.case_id}` (`mimo_numerics.ops.mamba3_mimo.cases`; {_sizes(inputs)}); "
                        "no device tensors")


def default_out_dir(case_name: str, root: Path = Path("reports")) -> Path:
    """``reports/<yyyymmdd>_mamba3_mimo_<case>`` (UTC date)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{OP_NAME}_{case_name}")
    return root / f"{stamp}_{safe}"


def _policies(names: Optional[Sequence[str]], lp: str) -> Dict[str, Any]:
    """``{label: policy}`` in the case's lp dtype; a policy the chain cannot run is a ``ReportError``."""
    from ..ops.mamba3_mimo import chain

    out: Dict[str, Any] = {}
    for i, name in enumerate(names or DEFAULT_POLICIES):
        label, policy = _drift.policy_at(name, lp)
        try:
            if chain.chain_kind(policy) == "fp64":
                raise NotImplementedError("it is the fp64 baseline itself")
        except (ValueError, NotImplementedError) as exc:
            raise ReportError(f"--policies {name}: the whole op cannot be compared under it ({exc})",
                              "mimo-numerics presets lists the presets; the op needs a float32 policy that defines "
                              "the forward, stage 1 and stage 2") from None
        out[f"custom{i}" if label == "custom" else label] = policy
    return out


def wide_axes(size=(16.0, 4.8)):
    """The axes of a figure for ``plots.plot_output_errors`` of 15 outputs (its own size grows with the outputs
    without bound)."""
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained").add_subplot(1, 1, 1)


def _chain_extremes(table, runs: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Per run and step of the chain: the stage with the largest error and the value."""
    pivot = table.pivot()
    out: Dict[str, Dict[str, Any]] = {}
    for label in runs:
        for stage, value in pivot.get(label, {}).items():
            group = _drift.stage_groups([stage], OP_NAME)[stage]
            best = out.setdefault(label, {}).get(group)
            if best is None or value > best["rel_rms"]:
                out[label][group] = {"stage": stage, "rel_rms": value}
    return out


# ---------------------------------------------------------------------------------------------------- the report
@single_threaded
def build_report(case: Optional[str] = None, out: Optional[Path] = None, policies: Optional[Sequence[str]] = None,
                 log=None, progress: bool = False) -> Path:
    """Write the whole-op report of one case (module docstring) and return its directory.

    Args:
        case (str, optional): see :func:`resolve_case` (default :data:`DEFAULT_CASE`).
        out (Path, optional): output directory (default :func:`default_out_dir`).
        policies (sequence of str, optional): float32 policies to compare (preset names or policy JSON paths), in
            the case's lp dtype; default :data:`DEFAULT_POLICIES`.
        log (callable, optional): progress messages. progress (bool): a tqdm bar over the ranking's runs.

    Raises:
        ReportError: a bad case or policy.
    """
    say = log or (lambda message: None)
    started = time.monotonic()
    rc = resolve_case(case)
    lp = str(rc.inputs["Q"].dtype).replace("torch.", "")
    chosen = _policies(policies, lp)
    out = Path(out) if out is not None else default_out_dir(rc.name)
    out.mkdir(parents=True, exist_ok=True)

    say("running the op under fp64 and each policy")
    try:
        runs = {"fp64": _runs.fp64_run(rc.inputs)}
        runs.update({label: _runs.policy_run(rc.inputs, policy) for label, policy in chosen.items()})
    except ValueError as exc:  # upstream's backward limits (S % C, G), named by mamba3_mimo
        raise ReportError(f"--case {rc.name}: {exc}", _CASE_HINT) from None
    if rc.upstream is not None:
        runs[UPSTREAM_LABEL] = rc.upstream
    compared = [label for label in runs if label != "fp64"]
    errors = {label: _sensitivity.run_errors(runs[label], runs["fp64"], OP_NAME) for label in compared}
    agreement = {}
    if rc.upstream is not None:
        want = _runs.op_outputs(rc.upstream)
        agreement = {label: {o: rel_rms(got, want[o]) for o, got in _runs.op_outputs(runs[label]).items()
                             if got is not None and want[o] is not None} for label in chosen}
    say("drift through the chain")
    table = _drift.stage_drift(runs, "fp64", lp, op=OP_NAME)

    say("one-site-off ranking")
    ranking_policy = _presets.get(RANKING_POLICY).replace(lp_dtype=lp)
    site_ranking = _sensitivity.rank_sites([rc.inputs], ranking_policy, [runs["fp64"]], op=OP_NAME,
                                           progress=progress, names=[rc.name])

    say("figures")
    figures: List[str] = []

    def save(fig, name):
        _plots.save_figure(fig, out / name)
        figures.append(name)

    save(_plots.plot_output_errors(errors, "fp64 (the op's fp64 run)", ax=wide_axes(),
                                   title=f"Out and the gradients: error vs fp64 ({rc.name}; hatched: 0)"),
         "fig_output_errors.png")
    save(_plots.plot_stage_drift(table, groups=_drift.stage_groups(table.stages(), OP_NAME), stage_width=0.17,
                                 title=f"{OP_NAME}: error of every stage of the chain vs the fp64 run ({rc.name})"),
         "fig_drift_chain.png")
    heat = {r.label: {o: site_ranking.fraction(r, o) for o in site_ranking.outputs}
            for r in site_ranking.ranked()[:HEATMAP_ROWS]}
    save(_plots.plot_score_matrix(heat, site_ranking.outputs, vmax=1.0, ylabel="rounding turned off",
                                  colorbar="share of the error removed",
                                  title=f"Share of each output's error that goes away with one rounding of "
                                        f"{site_ranking.policy.name} off (top {len(heat)} by score; {rc.name})"),
         "fig_site_ranking.png")

    metrics: Dict[str, Any] = {
        "operator": OP_NAME, "case": rc.name, "description": rc.description, "lp_dtype": lp, "baseline": "fp64",
        "policies": {label: policy.to_dict() for label, policy in chosen.items()},
        "upstream_label": UPSTREAM_LABEL if rc.upstream is not None else None,
        "outputs": [o for o in OUTPUT_KEYS if any(o in e for e in errors.values())],
        "output_errors": errors, "upstream_agreement": agreement,
        "stage_drift": table.to_dict(), "largest_stage_error": _chain_extremes(table, compared),
        "site_ranking": site_ranking.to_dict(), "figures": figures,
    }
    metrics["seconds"] = time.monotonic() - started
    command = " ".join(["mimo-numerics report --op", OP_NAME] + ([f"--case {case}"] if case else [])
                       + ([f"--policies {','.join(policies)}"] if policies else [])
                       + ([f"--out {out}"] if out is not None else []))
    metrics["provenance"] = _provenance.collect(command=command)
    (out / "metrics.json").write_text(json.dumps(_jsonable(metrics), indent=1), encoding="utf-8")
    (out / "summary.md").write_text(_summary(rc, metrics, table, site_ranking), encoding="utf-8")
    say(f"wrote {out} in {metrics['seconds']:.1f} s")
    return out


def _summary(rc: OpReportCase, metrics: Dict[str, Any], table, site_ranking) -> str:
    errors, outputs = metrics["output_errors"], metrics["outputs"]
    lines = [f"# Numerics report: {OP_NAME} on {rc.name}", "", f"{rc.description}.", "",
             _provenance.markdown_header(metrics["provenance"])
             + f" {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, {metrics['seconds']:.1f} s. "
             "The op runs from the raw inputs, forward then `backward(dout)` (`mn.mamba3_mimo`: preprocessing, "
             "`mamba_mimo_fwd`, `mamba_mimo_bwd_fwd`, `mamba_mimo_bwd_bwd`, FP32 epilogue), under "
             + ", ".join(f"`{p}`" for p in metrics["policies"]) + "; the baseline is its `fp64` run (FP64 oracles "
             "of every step, nothing rounded). Relative RMS = `||run − fp64|| / ||fp64||`.", ""]
    lines += ["## Out and the 14 gradients against FP64", "", "![output errors](fig_output_errors.png)", "",
              _table([[f"`{label}`"] + [_fmt(e.get(o)) for o in outputs] for label, e in errors.items()],
                     ["run", *[f"`{o}`" for o in outputs]]), ""]
    if metrics["upstream_agreement"]:
        agreement = metrics["upstream_agreement"]
        lines += [f"Each policy against `{UPSTREAM_LABEL}` (relative RMS; the gap the policy leaves to the real "
                  "kernels):", "",
                  _table([[f"`{label}`"] + [_fmt(a.get(o)) for o in outputs] for label, a in agreement.items()],
                         ["policy", *[f"`{o}`" for o in outputs]]), ""]
    lines += _drift_section(metrics, table)
    lines += _ranking_section(site_ranking)
    lines += ["## Files", "", "`metrics.json` (every number above), "
              + ", ".join(f"`{f}`" for f in metrics["figures"]), ""]
    return "\n".join(lines)


def _drift_section(metrics, table) -> List[str]:
    extremes = metrics["largest_stage_error"]
    groups = list(dict.fromkeys(_drift.stage_groups(table.stages(), OP_NAME).values()))
    rows = [[f"`{label}`"] + [f"{_fmt(per[g]['rel_rms'])} (`{per[g]['stage'].partition('.')[2]}`)" if g in per
                              else "–" for g in groups] for label, per in extremes.items()]
    return ["## Error through the chain, stage by stage", "", "![drift through the chain](fig_drift_chain.png)", "",
            "Every recorded stage of the chain in chain order, grouped by operator (the shaded bands): the "
            "preprocessing, each operator's recorded stages and its outputs (`outputs.*`), the epilogue's gradients. "
            "The fp64 run's internal stages come from each operator's reference under `fp64` on the fp64 chain's "
            "own float64 tensors (the FP64 oracles record outputs only; `runs.fp64_run`). The upstream run has "
            "the golden tensors only: each step's outputs.", "",
            "Largest stage error per step (and its stage):", "",
            _table(rows, ["run", *[f"`{g}`" for g in groups]]), "",
            "<details><summary>Every stage (rel RMS vs fp64)</summary>", "", table.to_markdown(), "", "</details>",
            ""]


def _ranking_section(site_ranking) -> List[str]:
    lines = [f"## Which roundings cause each gradient's error (one off at a time, from `{site_ranking.policy.name}`)",
             "", "![site ranking](fig_site_ranking.png)", "",
             "Each row is the op with one switch of one operator's section turned off (`<operator>.<site>`), or one "
             "knob at another value, run from the raw inputs and measured against the fp64 run "
             "(`sensitivity.rank_sites(..., op=\"mamba3_mimo\")`). A cell is the *quadrature share* of the "
             "output's error that the rounding accounts for, `sqrt(policy² − off²) / policy` (0 when the variant "
             "is not closer): independent errors add in quadrature, so a share of 0.2 is a drop of the error by "
             "only 1 − sqrt(1 − 0.2²) = 2 %. The score is the share's mean over the gradients; *mean drop* is "
             "what the error itself does, the mean over the gradients of `1 − off / policy`. Shares of different "
             "roundings do not add up: the roundings interact.", "",
             "Per output, the three roundings removing most of its error (quadrature share; drop of that output's "
             "error):", "", site_ranking.top_markdown(), "",
             "<details><summary>Every rounding, ranked by score</summary>", "", site_ranking.to_markdown(), "",
             "</details>", ""]
    quiet = site_ranking.without_effect()
    if quiet:
        lines += [f"Roundings that change no gradient ({len(quiet)}): " + ", ".join(f"`{q}`" for q in quiet)
                  + ". Forward sites move `Out` only: the backward recomputes what it needs in stage 1.", ""]
    if site_ranking.skipped:
        lines += ["Knob values not run (the chain cannot run them): "
                  + "; ".join(f"`{k}`: {why}" for k, why in site_ranking.skipped.items()), ""]
    return lines
