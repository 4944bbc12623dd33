#!/usr/bin/env python
"""Write a sensitivity report of one operator on its golden H200 cases: which rounding sites make its outputs wrong
(one-on/one-off against ``fp64`` and against the real upstream outputs), what separates two policies, and the policy
inferred from upstream's outputs.

Usage::

    python scripts/make_sensitivity_report.py                          # stage 1
    python scripts/make_sensitivity_report.py --op mamba_mimo_fwd      # the forward
    python scripts/make_sensitivity_report.py --op mamba_mimo_bwd_bwd  # stage 2
    python scripts/make_sensitivity_report.py --op mamba_mimo_fwd --cases NAME[,NAME...] --limit K --out FILE
    python scripts/make_sensitivity_report.py --op OP --smoke --out FILE    # seconds: a check, not the figures

Default outputs: ``reports/sensitivity_upstream_sm90_golden.md`` (stage 1), ``reports/sensitivity_<op>_golden.md``.

Stage 1 (``mamba_mimo_bwd_fwd``, the default) keeps its report on the 15 seed-PR cases
(``tests/data/upstream_h200_seed_cases.pt``, ``mimo_numerics.golden``), with ``seed_bf16`` as the policy compared
and searched from; deterministic (no timestamps), about 1 minute on 2 loaded cores. Every other operator gets the
report on
``op.load("golden")()`` (the whole-op H200 cases, upstream's outputs from ``mimo_numerics.ops.<op>.golden``): the
rank_sites table of ``upstream_sm90`` against ``fp64`` and against upstream, the presets' distance to upstream,
``attribute_gap`` from ``fp32`` to ``upstream_sm90`` on upstream's outputs and ``infer_policy`` from ``fp32``, per lp
dtype (fp16 cases are studied under the ``*_fp16`` presets); its header carries the commit, versions, case list and
the measured run time (so two runs differ there; fp32-level digits can differ across machines, fp32 GEMMs go through
BLAS). Measured on 2 loaded cores: the forward about 2 minutes, stage 2 about 8 (of which inference 6).
``--cases``/``--limit`` restrict the cases (every section), ``--inference-limit`` only the inference's.
``--smoke`` (what the test suite runs): the smallest case only (or the ``--cases`` given) and no inference search (the
two policies compared and their single-field neighbours are ranked); the header says it is a smoke run.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

import mimo_numerics
from mimo_numerics import provenance
from mimo_numerics import inference, presets, sensitivity
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden
from mimo_numerics import operator as _operator
from mimo_numerics.ops import registry
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import OUTPUT_NAMES

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "reports" / "sensitivity_upstream_sm90_golden.md"
#: The policy studied, the policy the gap is measured from and the inference starts at (every operator but stage 1).
STUDIED, FROM = "upstream_sm90", "fp32"
#: Reports of one operator that measure things this one does not (shown in the header).
SEE_ALSO = {
    "mamba_mimo_bwd_bwd": (
        "`reports/stage2_site_sensitivity.md` (`scripts/stage2_site_sensitivity.py`) covers stage 2 differently: "
        "the whole-op golden cases with a stage-2 output (its header says how many); a per-case golden table (rel RMS under "
        "`upstream_sm90`, `fp32`, `fp64`, bit-equal fractions, the error over Σ|terms| of dD, ddA, dangles: the "
        "figures behind the tolerance `stage2_golden_fp32_over_sm90_ratio_min`); knob variants and one site at a "
        "time for dq, dk, dv with the mean AND the max over the cases; one-on from the `fp32` preset (its knobs: "
        "`dv_accum` alone is then rounded with `mul_then_add`, here with `upstream_sm90`'s `fma`); and the "
        "diagnosis of the seed-formula case's one flipped dΦO rounding. This report treats the fp16 case "
        "separately and adds every output, the rankings, the attribution from `fp32` and the inferred policy. "
        "Cross-checked on 2026-12-01 with `--cases` set to those 7: every one-off mean against upstream and every "
        "one-on mean against fp64 of dq, dk, dv agreed with that report to the 3 digits shown, except the one-on of "
        "`dv_accum`, which differs by construction (`fma` there, `mul_then_add` here): its two figures are the "
        "`dv_accum` rows of section 3 of each report."),
}
#: Presets compared with upstream's outputs (section 3), in their bfloat16 form.
COMPARED = ("fp64", "fp32", "upstream_sm80", "upstream_sm90")
TOP = 5
#: ``--smoke``: no inference search; ``infer_policy`` ranks the start and the studied policy and their single-field
#: neighbours (its ``candidates`` mode).
SMOKE_NOTE = (" **Smoke run (the smallest case; the inference ranks two candidates and their neighbours, no search): "
              "not the report's figures.**")


def default_out(op_name: str) -> Path:
    """Where the report of ``op_name`` goes by default."""
    if op_name == registry.DEFAULT_OPERATOR:
        return DEFAULT_OUT
    return ROOT / "reports" / f"sensitivity_{op_name}_golden.md"


def _table(head, rows):
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def select_names(available: Sequence[str], names: Optional[Sequence[str]], limit: Optional[int]) -> List[str]:
    """``available`` restricted to ``names`` (in their order) and then to the first ``limit``."""
    if names:
        unknown = [n for n in names if n not in available]
        if unknown:
            raise SystemExit(f"--cases: unknown case(s) {unknown}; golden cases: {list(available)}")
        chosen = list(dict.fromkeys(names))
    else:
        chosen = list(available)
    if limit is not None:
        if limit < 1:
            raise SystemExit(f"--limit must be >= 1, got {limit}")
        chosen = chosen[:limit]
    return chosen


# ============================================================================================== stage 1
def build_stage1(names: Optional[Sequence[str]] = None, limit: Optional[int] = None, smoke: bool = False,
                 command: Optional[str] = None) -> str:
    """The stage-1 report on the seed-PR golden cases (content unchanged from before ``--op`` existed);
    ``command``: the command line for the header (default: this process's)."""
    started = time.perf_counter()
    data = golden.load_golden()
    if smoke and not names:
        names = [min(data, key=lambda n: sum(t.numel() for t in data[n][0].values() if isinstance(t, torch.Tensor)))]
    names = select_names(list(data), names, limit)
    inputs = [data[n][0] for n in names]
    device = [data[n][1] for n in names]
    counts = {o: sum(1 for d in device if d.get(o) is not None) for o in OUTPUT_NAMES}
    table = sensitivity.rank_sites(inputs, "upstream_sm90", "fp64")
    gap_policy = sensitivity.attribute_gap(inputs, "seed_bf16", "upstream_sm90")
    gap_device = sensitivity.attribute_gap(inputs, "seed_bf16", "upstream_sm90", target=device)
    agreement = sensitivity.output_errors(inputs, ["fp32", "seed_bf16", "upstream_sm80", "upstream_sm90"], device)
    result = inference.infer_policy(inputs, device, start="seed_bf16",
                                    **({"candidates": ("seed_bf16", "upstream_sm90")} if smoke else {}))
    seed_distance = result.start_distance
    elapsed = time.perf_counter() - started
    ratio = seed_distance / result.distance if result.distance > 0 else float("inf")

    lines = [
        "# Sensitivity of `upstream_sm90` on the golden H200 cases",
        "",
        provenance.markdown_header(provenance.collect(command=command)) + (SMOKE_NOTE if smoke else "")
        + f" Run time {elapsed:.0f} s wall (the machine may be shared: an upper bound); the inference evaluated "
        f"{result.evaluations} policies.",
        "",
        f"Over the {len(names)} cases of "
        "`tests/data/upstream_h200_seed_cases.pt` (real upstream TileLang kernel on an NVIDIA H200, see "
        "`tests/data/README.md`). Every number is a mean over the cases that have the output: "
        + ", ".join(f"`{o}` in {counts[o]}" for o in OUTPUT_NAMES) + ".",
        "",
        "## 1. One-on / one-off sensitivity against `fp64`",
        "",
        "Relative RMS error of each output against the reference under `fp64` (nothing rounded, float64). "
        "**one_on**: only this site rounded (every switch off, `upstream_sm90`'s knobs, output stores still "
        "rounded); **one_off**: `upstream_sm90` with this site off. For a knob value, one_on is the all-off policy "
        "with that value (`diag_mode` also turns `diag_accum` on) and one_off is `upstream_sm90` with it. "
        "**score**: fraction of the policy's error the site adds on its own, mean over outputs, with "
        "`added = sqrt(one_on² − floor²)` (`mimo_numerics.sensitivity.rank_sites`).",
        "",
        table.to_markdown(),
        "",
        "Largest single-site contributions per output (`added`, relative RMS):",
        "",
    ]
    rows = []
    for o in table.outputs:
        top = table.ranked(o)[:5]
        rows.append([o, f"{table.floor_error[o]:.3g}", f"{table.policy_error[o]:.3g}",
                     ", ".join(f"`{r.label}` {r.added[o]:.2g}" for r in top)])
    lines += [_table(["output", "all off", "all on", "top 5 sites (added)"], rows), ""]

    lines += [
        "## 2. Agreement of the presets with the H200 outputs",
        "",
        "Relative RMS error of each preset's outputs against the device outputs (0: bit-exact in every case).",
        "",
        _table(["preset", *[o for o in OUTPUT_NAMES]],
               [[f"`{p}`"] + [f"{e.get(o, float('nan')):.3g}" for o in OUTPUT_NAMES] for p, e in agreement.items()]),
        "",
        "## 3. What separates `seed_bf16` from `upstream_sm90`",
        "",
        "Each differing field moved alone from `seed_bf16` to its `upstream_sm90` value; forward = distance closed "
        "(backward: distance opened by moving `upstream_sm90`'s field back), relative RMS "
        "(`mimo_numerics.sensitivity.attribute_gap`).",
        "",
        "### 3a. Distance to `upstream_sm90`'s own outputs",
        "",
        gap_policy.to_markdown(),
        "",
        "### 3b. Distance to the H200 outputs",
        "",
        gap_device.to_markdown(),
        "",
        "First field per output (to the H200): " + ", ".join(
            f"{o}: `{gap_device.top(o)}`" for o in gap_device.outputs if gap_device.gap[o] > 0) + ".",
        "",
        "## 4. Policy inferred from the H200 outputs",
        "",
        "Search from `seed_bf16` over the 19 switches and `diag_mode`, `state_update`, `silu_form` "
        f"(`mimo_numerics.inference.infer_policy`, all {len(names)} cases at once).",
        "",
        result.to_markdown(),
        "",
        f"Distance of `seed_bf16`: {seed_distance:.4g}; of the recovered policy: {result.distance:.4g} "
        f"(ratio {ratio:.3g}). Recovered `diag_mode`: `{result.best.diag_mode}`; switches on: "
        f"{len(result.best.switches_on(registry.DEFAULT_OPERATOR))} of 19.",
        "",
    ]
    return "\n".join(lines)


# ============================================================================================== any operator
def _preset_in(name: str, lp_dtype: str):
    """Preset ``name`` in ``lp_dtype`` (``upstream_sm90`` in float16 is ``upstream_sm90_fp16``)."""
    return presets.resolve(name).replace(lp_dtype=lp_dtype)


def _label(policy, op) -> str:
    return presets.label(policy, operator=op.name)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _restored(row, table, output: str) -> float:
    """Distance to upstream that dropping the site brings back, ``sqrt(one_off² − policy²)`` (0 when below)."""
    off, full = row.one_off[output], table.policy_error[output]
    return math.sqrt(max(off * off - full * full, 0.0))


def _restored_score(row, table) -> float:
    """Mean over outputs of the restored distance as a fraction of the all-off distance to upstream."""
    ratios = [(_restored(row, table, o) / table.floor_error[o]) if table.floor_error[o] > 0 else 0.0
              for o in table.outputs]
    return sum(ratios) / len(ratios) if ratios else 0.0


def _site_table(table, outputs: Sequence[str], columns: Sequence[str], order: List,
                score: Callable, score_name: str) -> str:
    """The rank_sites rows in ``order``: ``columns`` (one_on, one_off) per output of ``outputs``, then the score."""
    head = ["rank", "site"] + [f"{c} {o}" for o in outputs for c in columns] + [score_name]
    rows = [["", "**all off**"] + [_fmt(table.floor_error[o]) for o in outputs for _ in columns] + [""],
            ["", f"**all of `{table.policy.label(table.operator)}`**"]
            + [_fmt(table.policy_error[o]) for o in outputs for _ in columns] + [""]]
    for i, r in enumerate(order, 1):
        rows.append([str(i), f"`{r.label}`"] + [_fmt(getattr(r, c)[o]) for o in outputs for c in columns]
                    + [_fmt(score(r))])
    return _table(head, rows)


def _details(summary: str, body: str) -> List[str]:
    return ["<details><summary>" + summary + "</summary>", "", body, "", "</details>", ""]


def _rank_vs_fp64(table, focus: Sequence[str]) -> List[str]:
    order = table.ranked()
    lines = [_site_table(table, focus, ("one_on", "one_off"), order, lambda r: r.score, "score"), ""]
    if tuple(focus) != tuple(table.outputs):
        lines += _details(f"Every output ({len(table.outputs)}): the full `rank_sites` table",
                          table.to_markdown())
    rows = [[f"`{o}`", _fmt(table.floor_error[o]), _fmt(table.policy_error[o]),
             ", ".join(f"`{r.label}` {r.added[o]:.2g}" for r in table.ranked(o)[:TOP])] for o in table.outputs]
    lines += ["Largest single-site contributions per output (`added`, relative RMS against `fp64`):", "",
              _table(["output", "all off", "all on", f"top {TOP} sites (added)"], rows), ""]
    return lines


def _rank_vs_upstream(table, focus: Sequence[str]) -> List[str]:
    order = sorted(table.rows, key=lambda r: (-_restored_score(r, table), r.label))
    lines = [_site_table(table, focus, ("one_off", "one_on"), order, lambda r: _restored_score(r, table),
                         "restored"), ""]
    if tuple(focus) != tuple(table.outputs):
        lines += _details(f"Every output ({len(table.outputs)}): the full `rank_sites` table (ranked by the "
                          "fp64-style score, which is not meaningful against upstream)", table.to_markdown())
    rows = [[f"`{o}`", _fmt(table.floor_error[o]), _fmt(table.policy_error[o]),
             ", ".join(f"`{r.label}` {r.one_off[o]:.2g}" for r in table.ranked(o, by="one_off")[:TOP])]
            for o in table.outputs]
    lines += ["Sites whose removal hurts most per output (`one_off`, relative RMS against upstream):", "",
              _table(["output", "all off", f"all of `{table.policy.label(table.operator)}`",
                      f"top {TOP} sites (one_off)"], rows), ""]
    return lines


def _group_report(op, names: List[str], inputs: List[dict], targets: List[dict], lp_dtype: str,
                  focus: Sequence[str], inference_limit: Optional[int], timings: Dict[str, float],
                  level: str, smoke: bool = False) -> List[str]:
    studied, start = _preset_in(STUDIED, lp_dtype), _preset_in(FROM, lp_dtype)
    s_name, f_name = _label(studied, op), _label(start, op)
    n_switches = len(registry.site_table(op.name))

    def timed(key, fn):
        t0 = time.perf_counter()
        value = fn()
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        return value

    table_fp64 = timed("rank_sites vs fp64", lambda: sensitivity.rank_sites(inputs, studied, "fp64", op=op.name))
    table_up = timed("rank_sites vs upstream",
                     lambda: sensitivity.rank_sites(inputs, studied, targets, op=op.name))
    compared = {_label(_preset_in(p, lp_dtype), op): _preset_in(p, lp_dtype) for p in COMPARED}
    agreement = timed("output_errors", lambda: sensitivity.output_errors(inputs, compared, targets, op=op.name))
    gap = timed("attribute_gap", lambda: sensitivity.attribute_gap(inputs, start, studied, target=targets,
                                                                   op=op.name))
    n_inf = len(inputs) if inference_limit is None else min(inference_limit, len(inputs))
    result = timed("infer_policy", lambda: inference.infer_policy(inputs[:n_inf], targets[:n_inf], start=start,
                                                                  op=op.name,
                                                                  **({"candidates": (start, studied)} if smoke
                                                                     else {})))
    outputs = table_fp64.outputs
    knob_through = "; ".join(f"`{k}` also turns {', '.join(f'`{s}`' for s in v)} on"
                             for k, v in op.knob_sites.items())
    inf_cases = (f"all {n_inf} case(s) at once" if n_inf == len(inputs) else
                 f"the first {n_inf} of the {len(inputs)} cases only (`--inference-limit {inference_limit}`): "
                 + ", ".join(f"`{n}`" for n in names[:n_inf]))
    diff_to_studied = result.best.diff(studied, operator=op.name)
    ratio = result.start_distance / result.distance if result.distance > 0 else float("inf")
    h = level
    lines = [
        f"{h} 1. One-on / one-off sensitivity against `fp64`",
        "",
        "Relative RMS error of each output against the reference under `fp64` (nothing rounded, float64). "
        f"**one_on**: only this site rounded (every switch off, `{s_name}`'s knobs, output stores still rounded); "
        f"**one_off**: `{s_name}` with this site off. For a knob value, one_on is the all-off policy with that "
        f"value ({knob_through or 'no knob acts through particular sites'}) and one_off is `{s_name}` with it. "
        "**score**: fraction of the policy's error the site adds on its own, mean over all outputs, with "
        "`added = sqrt(one_on² − floor²)` (`mimo_numerics.sensitivity.rank_sites`). Columns: "
        + ", ".join(f"`{o}`" for o in focus)
        + (" (the outputs stored in lp); the score counts every output" if tuple(focus) != outputs else "") + ".",
        "",
        *_rank_vs_fp64(table_fp64, focus),
        f"{h} 2. One-on / one-off against upstream's outputs",
        "",
        f"The same policies, relative RMS against the real upstream outputs (baseline = the given outputs). "
        f"**one_off**: how far from upstream `{s_name}` gets without this site (the distance of `{s_name}` "
        "itself is the 'all of' row); **one_on**: the all-off policy with only this site, against upstream. "
        "**restored**: mean over all outputs of `sqrt(one_off² − policy²) / all_off`, the fraction of the all-off "
        "distance to upstream that dropping this one site brings back (the rows are ranked by it; computed by "
        "this script from the `rank_sites` table, whose own score is defined against an exact baseline).",
        "",
        *_rank_vs_upstream(table_up, focus),
        f"{h} 3. Agreement of the presets with upstream's outputs",
        "",
        "Relative RMS error of each preset's outputs against upstream's outputs (0: bit-exact in every case; "
        "`mimo_numerics.sensitivity.output_errors`).",
        "",
        _table(["preset", *[f"`{o}`" for o in outputs]],
               [[f"`{p}`"] + [_fmt(e.get(o, float("nan"))) for o in outputs] for p, e in agreement.items()]),
        "",
        f"{h} 4. What separates `{f_name}` from `{s_name}`, measured on upstream's outputs",
        "",
        f"Each differing field moved alone from `{f_name}` to its `{s_name}` value; forward = distance to upstream "
        f"closed (backward: distance opened by moving `{s_name}`'s field back), relative RMS "
        "(`mimo_numerics.sensitivity.attribute_gap`, target = upstream's outputs).",
        "",
        _gap_markdown(gap, f_name, s_name),
        "",
        "First field per output: " + (", ".join(f"`{o}`: `{gap.top(o)}`" for o in gap.outputs if gap.gap[o] > 0)
                                      or "none (no gap)") + ".",
        "",
        *_interaction_note(gap, f_name, s_name),
        f"{h} 5. Policy inferred from upstream's outputs",
        "",
        f"Search from `{f_name}` over the {n_switches} switches and "
        + ", ".join(f"`{k}`" for k in inference.SEARCHED_KNOBS)
        + f" (`mimo_numerics.inference.infer_policy`, {inf_cases}).",
        "",
        result.to_markdown(),
        "",
        f"Distance of `{f_name}`: {result.start_distance:.4g}; of the recovered policy: {result.distance:.4g} "
        f"(ratio {ratio:.3g}). Recovered `diag_mode`: `{result.best.diag_mode}`; switches on: "
        f"{len(result.best.switches_on(op.name))} of {n_switches}. Recovered vs `{s_name}`: "
        + ("; ".join(f"`{k}` {a} (`{s_name}`: {b})" for k, (a, b) in diff_to_studied.items())
           or "identical") + ".",
        "",
    ]
    return lines


def _gap_markdown(gap, a_name: str, b_name: str) -> str:
    """``gap.to_markdown()`` with its title line naming the policies by their labels (``GapAttribution`` names them
    by ``RoundingPolicy.name``, which is ``custom`` for a preset with another lp dtype)."""
    lines = gap.to_markdown().split("\n")
    if lines and lines[0].startswith("Gap `"):
        lines[0] = (f"Gap `{a_name}` → `{b_name}` ({gap.metric} to upstream's outputs, {gap.n_cases} case(s)); "
                    "contributions: forward (backward)")
    return "\n".join(lines)


def _interaction_note(gap, a_name: str, b_name: str) -> List[str]:
    """A sentence when one-field-at-a-time moves explain less than half of the gap on most outputs."""
    shares = [gap.interaction[o] / gap.gap[o] for o in gap.outputs if gap.gap[o] > 0]
    mostly = sum(1 for x in shares if x > 0.5)
    if not shares or mostly * 2 <= len(shares):
        return []
    return [f"On {mostly} of {len(shares)} outputs the interactions are more than half of d(A): one rounding "
            f"added to `{a_name}` alone closes little (the roundings' errors add roughly in quadrature, and the "
            "others are still missing), so the forward column is small; the backward column (the distance to "
            f"upstream that removing the field from `{b_name}` opens) is the one that ranks the fields.", ""]


def _case_rows(op, cases, targets) -> List[List[str]]:
    rows = []
    for c, t in zip(cases, targets):
        branches = ("ro" if c.reduce_o else "fo") + ("Z" if c.has_z else "-") + ("D" if c.has_d else "-")
        present = [o for o in op.output_names if t.get(o) is not None]
        missing = [o for o in op.output_names if t.get(o) is None]
        rows.append([f"`{c.source}`", c.dtype, f"B{c.batch} S{c.seqlen} H{c.heads} G{c.groups} N{c.state_dim} "
                     f"P{c.value_dim} R{c.rank} C{c.chunk_size}", branches,
                     "all" if not missing else f"{len(present)} (no {', '.join(f'`{m}`' for m in missing)})"])
    return rows


def build_operator(op_name: str, names: Optional[Sequence[str]] = None, limit: Optional[int] = None,
                   inference_limit: Optional[int] = None, out: Path = None, argv_text: str = "",
                   smoke: bool = False) -> str:
    """The report of ``op_name`` (not stage 1) on its golden cases."""
    started = time.perf_counter()
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    op = _operator.get(op_name)
    upstream_of = importlib.import_module(f"mimo_numerics.ops.{op.name}.golden").upstream_outputs
    stored = {c.source: c for c in op.load("golden")()}
    if smoke and not names:  # the smallest case
        names = [min(stored, key=lambda n: math.prod(getattr(stored[n], f) for f in (
            "batch", "seqlen", "heads", "state_dim", "value_dim", "rank")))]
    chosen = select_names(list(stored), names, limit)
    cases, targets, refused = [], [], []
    for name in chosen:
        target = upstream_of(name)
        if target is None:
            refused.append(name)
            continue
        cases.append(stored[name])
        targets.append({o: target.get(o) for o in op.output_names})
    if not cases:
        raise SystemExit(f"no golden case of {op.name} left with upstream outputs (chosen: {chosen})")
    focus = tuple(o for o in op.lp_outputs if any(t.get(o) is not None for t in targets)) or op.output_names
    groups: Dict[str, List[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(c.dtype, []).append(i)
    timings: Dict[str, float] = {}
    body: List[str] = []
    several = len(groups) > 1
    for dtype, idx in groups.items():
        inputs = [op.draw(cases[i]) for i in idx]
        if several:
            listed = f": {', '.join(f'`{cases[i].source}`' for i in idx)}" if len(idx) <= 3 else ""
            body += [f"## {dtype} cases ({len(idx)} of {len(cases)}{listed})", ""]
        body += _group_report(op, [cases[i].source for i in idx], inputs, [targets[i] for i in idx], dtype, focus,
                              inference_limit, timings, "###" if several else "##", smoke)
    elapsed = time.perf_counter() - started

    counts = {o: sum(1 for t in targets if t.get(o) is not None) for o in op.output_names}
    files = ", ".join(f"`{Path(f).relative_to(ROOT) if Path(f).is_relative_to(ROOT) else f}`"
                      for f in importlib.import_module("mimo_numerics.ops.mamba3_mimo.golden").FILES)
    studied_per_dtype = "; ".join(
        f"{d}: `{_label(_preset_in(STUDIED, d), op)}` from `{_label(_preset_in(FROM, d), op)}`" for d in groups)
    command = f"python scripts/make_sensitivity_report.py {argv_text}".strip()
    header = [
        f"# Sensitivity of `{STUDIED}` on the golden H200 cases: `{op.name}`",
        "",
        f"{op.title[0].upper() + op.title[1:]}. "
        + provenance.markdown_header(provenance.collect(command=command)) + (SMOKE_NOTE if smoke else "")
        + f" Run time {elapsed:.0f} s wall (load average {load_at_start:.1f} at the "
        "start: the machine is shared, so the time is an upper bound): "
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ".",
        "",
        f"Golden data: {files} (real upstream TileLang kernels, mamba-ssm 2.3.2.post1, TileLang 0.1.8, on an NVIDIA "
        "H200; `tests/data/README.md`), read through `op.load(\"golden\")()` with the recorded preprocessing "
        + ("and the recorded stage-1 `states`, `qk_dot` as inputs" if "qk_dot" in op.input_names else "as inputs")
        + f", against `mimo_numerics.ops.{op.name}.golden.upstream_outputs`. One upstream run is one sample: its "
        "FP32 Triton helpers are autotuned and a rerun can differ by about 4e-4 rel RMS on these small cases "
        "(`docs/golden_data.md`), so distances to upstream below that are not meaningful beyond one run. "
        f"Policies per lp dtype: {studied_per_dtype}. Every number is a mean over the cases that have the "
        "output: " + ", ".join(f"`{o}` in {counts[o]}" for o in op.output_names) + ".",
        "",
        _table(["case", "dtype", "sizes", "branches", "outputs"], _case_rows(op, cases, targets)),
        "",
    ]
    if op.name in SEE_ALSO:
        header += [SEE_ALSO[op.name], ""]
    if refused:
        header += ["Left out (upstream refused them, no outputs): " + ", ".join(f"`{n}`" for n in refused) + ".",
                   ""]
    if names or limit is not None:
        header += [f"Cases restricted by the command line: {len(cases)} of the {len(stored)} golden cases.", ""]
    return "\n".join(header + body)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default=registry.DEFAULT_OPERATOR, choices=registry.OPERATORS,
                        help="the operator (default: %(default)s, the stage-1 report on the seed-PR cases)")
    parser.add_argument("--out", type=Path, default=None, help="output file (default: reports/, by operator)")
    parser.add_argument("--cases", action="append", default=None, metavar="NAME[,NAME...]",
                        help="only these golden cases (repeatable or comma-separated)")
    parser.add_argument("--limit", type=int, default=None, help="only the first K (selected) golden cases")
    parser.add_argument("--inference-limit", type=int, default=None,
                        help="infer the policy from the first K cases of each lp dtype only (not for stage 1)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest case only (unless --cases), no inference search: checks that the report runs")
    args = parser.parse_args(argv)
    names = [n for part in args.cases for n in part.split(",") if n] if args.cases else None
    if args.smoke and args.limit is None:
        args.limit = 1
    out = args.out or default_out(args.op)
    if args.op == registry.DEFAULT_OPERATOR:
        if args.inference_limit is not None:
            raise SystemExit("--inference-limit is not supported for stage 1's report (use --cases / --limit)")
        text = build_stage1(names, args.limit, smoke=args.smoke)
    else:
        if args.inference_limit is not None and args.inference_limit < 1:
            raise SystemExit(f"--inference-limit must be >= 1, got {args.inference_limit}")
        shown = [f"--op {args.op}"] + ([f"--cases {','.join(names)}"] if names else []) \
            + ([f"--limit {args.limit}"] if args.limit is not None else []) \
            + ([f"--inference-limit {args.inference_limit}"] if args.inference_limit is not None else []) \
            + (["--smoke"] if args.smoke else []) + ([f"--out {args.out}"] if args.out else [])
        text = build_operator(args.op, names, args.limit, args.inference_limit, out, " ".join(shown), args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
