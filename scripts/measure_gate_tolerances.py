"""Measure the accuracy gates' tolerances (``mimo_numerics.testing``) for one operator.

Prints, as Markdown, for ``--op`` (default: the forward and stage 2) on the ``--grid`` (default ``gate``):

1. **CPU noise**: :func:`mimo_numerics.testing.measure_gate_noise` under ``upstream_sm90`` and ``fp32``, per output:
   the largest ``same`` (rel RMS of an FP32-level perturbation to ref[P]) and ``ratio`` (its error against FP64 over
   ref[P]'s), and the rows above the noise-floor bound of the op's settings;
2. **H200**: the real upstream outputs of the whole-op golden cases (``tests/data/upstream_h200_full_op_*.pt``)
   replayed through :func:`mimo_numerics.testing.check` under ``upstream_sm90``: per output the largest rel RMS to
   ref[P] and ratio against FP64, and the verdict under the operator's tolerances and under the generic entries;
3. **FP32-level variants** (``--reorder``): several state-dimension permutation seeds, the other ``state_update``
   and FP64 math, on the smoke and gate grids: per preset and output the largest error against FP64 above
   ``alpha`` x ref[P]'s (what the noise-floor gate's ``floor`` must cover);
4. **wrong policies** (``--wrong``): the reference with one site off, ``diag_mode="mul_then_add"``, and the other
   presets, gated as ``upstream_sm90`` (``--wrong-policy upstream_sm90_fp16`` for the float16 cases): per policy
   the smallest, median and largest distance (max over outputs) to ref[P] and how many cases its gate fails.

Usage: ``python scripts/measure_gate_tolerances.py [--op NAME ...] [--grid gate] [--reorder] [--wrong]`` (CPU; a
few minutes with ``--reorder`` or ``--wrong``). The ``<operator>.*`` gate entries of ``mimo_numerics/tolerances.py``
and the generic gate entries' figures for the forward and stage 2 come from it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
from collections import defaultdict
from pathlib import Path

import torch

from mimo_numerics import operator as _operator
from mimo_numerics import policy as _policy
from mimo_numerics import presets, provenance, testing, tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops import registry

OPERATORS = ("mamba_mimo_fwd", "mamba_mimo_bwd_bwd")


def _section(title: str) -> None:
    print(f"\n### {title}\n")


def cpu_noise(op, grid: str) -> None:
    _section(f"{op.name}: CPU noise, grid {grid}")
    print("| preset | output | max same | (case, variant) | max ratio | noise-floor violations |")
    print("|---|---|---|---|---|---|")
    for preset in ("upstream_sm90", "fp32"):
        rows = testing.measure_gate_noise(preset, grid, op=op)
        by_output = defaultdict(list)
        for row in rows:
            by_output[row["output"]].append(row)
        for output, out_rows in by_output.items():
            settings = testing.GateSettings.from_table(op=op, output=output)
            worst = max(out_rows, key=lambda r: r["same"])
            ratio = max((r["ratio"] for r in out_rows if not math.isnan(r["ratio"])), default=math.nan)
            violations = sum(r["ref_err_oracle"] + r["excess"] > settings.alpha * r["ref_err_oracle"] + settings.floor
                             for r in out_rows)
            print(f"| {preset} | {output} | {worst['same']:.2e} | {worst['case_id']}, {worst['variant']} | "
                  f"{ratio:.4f} | {violations} |")


def reorder_excess(op, grids=("smoke", "gate"), seeds=range(5)) -> None:
    """The largest excess of FP32-level variants (several permutation seeds, the other state_update, FP64 math
    with a permutation) over the noise-floor bound, per preset and output."""
    reference = op.load("reference")
    worst = {}
    for preset in ("fp32", "upstream_sm90"):
        for case in [c for grid in grids for c in op.cases(grid)]:
            policy = presets.get(preset)
            if case.lp_dtype != policy.lp_torch_dtype:
                policy = policy.replace(lp_dtype=case.dtype)
            inputs = testing.case_inputs(case, op)
            ref = testing.as_output_dict(testing.reference_outputs(case, policy, op), op)
            oracle = testing.as_output_dict(testing.oracle_outputs(case, op), op)
            other = "separate" if policy.state_update == "accumulate_into" else "accumulate_into"
            variants = {f"state_dim_order seed {s}": testing.permute_state_dim(
                functools.partial(reference, policy=policy), seed=s, op=op) for s in seeds}
            variants["state_update"] = functools.partial(reference, policy=policy.replace(state_update=other))
            variants["fp64_math + state_dim_order"] = testing.permute_state_dim(
                functools.partial(reference, policy=_policy.with_float64_math(policy)), seed=7, op=op)
            for label, fn in variants.items():
                out = testing.as_output_dict(fn(*op.args(inputs), **op.kwargs(inputs)), op)
                for name, expected in ref.items():
                    if expected is None:
                        continue
                    settings = testing.GateSettings.from_table(op=op, output=name, fmt=policy.lp_dtype)
                    ref_err, var_err = rel_rms(expected, oracle[name]), rel_rms(out[name], oracle[name])
                    excess = var_err - settings.alpha * ref_err
                    if (preset, name) not in worst or excess > worst[(preset, name)][0]:
                        worst[(preset, name)] = (excess, case.case_id, label, ref_err, var_err, settings.floor)
    _section(f"{op.name}: FP32-level variants, error vs fp64 above alpha x ref[P]'s (grids {', '.join(grids)})")
    print("| preset | output | excess | floor | case | variant | ref[P] vs fp64 | variant vs fp64 |")
    print("|---|---|---|---|---|---|---|---|")
    for (preset, name), (excess, case_id, label, ref_err, var_err, floor) in sorted(worst.items()):
        print(f"| {preset} | {name} | {excess:.2e} | {floor:.0e} | {case_id} | {label} | {ref_err:.2e} | "
              f"{var_err:.2e} |")


def _replay(op, specs):
    golden = importlib.import_module(f"mimo_numerics.ops.{op.name}.golden")
    table = [(spec, golden.upstream_outputs(spec.case_id)) for spec in specs]

    def same(a, b):
        return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                             and torch.equal(a, b.cpu()))

    def replay(*tensors, **kwargs):
        for spec, upstream in table:
            if all(same(spec.inputs[n], t) for n, t in zip(op.input_names, tensors)):
                return {n: upstream.get(n) for n in op.output_names}
        raise KeyError("not a golden input")

    return replay


def h200(op) -> None:
    specs = op.load("golden")()
    replay = _replay(op, specs)
    report = testing.check(replay, op=op, policy="upstream_sm90", cases=specs, dtype_mismatch="adapt")
    generic = {setting: tolerances.get(name) for setting, name in tolerances.GATE_ENTRIES.items()}
    generic_report = testing.check(replay, op=op, policy="upstream_sm90", cases=specs, dtype_mismatch="adapt",
                                   **generic)
    _section(f"{op.name}: real H200 outputs of {len(specs)} golden cases vs ref[upstream_sm90]")
    print("| output | max vs ref[P] | case | max ratio vs fp64 | case |")
    print("|---|---|---|---|---|")
    for output in op.output_names:
        checks = [(c.case_id, o) for c in report.checked for o in c.outputs if o.output == output
                  and o.status != "absent"]
        if not checks:
            continue
        same = max(checks, key=lambda t: t[1].err_same)
        ratio = max(checks, key=lambda t: -1 if math.isnan(t[1].oracle_ratio) else t[1].oracle_ratio)
        print(f"| {output} | {same[1].err_same:.2e} | {same[0]} | {ratio[1].oracle_ratio:.4f} | {ratio[0]} |")
    print(f"\nwith the operator's entries: {report.summary()}")
    print(f"with the generic entries {generic}: {generic_report.summary()}")
    for case in generic_report.failed_cases:
        print(f"  {case.case_id}: " + ", ".join(f"{o.output} {o.err_same:.2e}" for o in case.outputs if not o.passed))


def wrong_policies(op, grid: str, base_name: str) -> None:
    base = presets.get(base_name)
    wrong = {f"{site}=False": _policy.write_fields(base, op.name, **{site: False})
             for site in registry.site_table(op.name)}
    wrong["diag_mode=mul_then_add"] = base.replace(diag_mode="mul_then_add")
    wrong["silu_form=sigmoid"] = base.replace(silu_form="sigmoid")
    for name in presets.names():
        preset = presets.get(name)
        if preset.defines(op.name) and name != base_name:
            wrong[name] = preset.replace(lp_dtype=base.lp_dtype)
    cases = [c for c in op.cases(grid) if c.lp_dtype == base.lp_torch_dtype]
    report_of = functools.partial(testing.check, op=op, policy=base, cases=cases)
    _section(f"{op.name}: wrong policies gated as {base_name}, {len(cases)} cases of grid {grid}")
    print("| policy | min | median | max | cases failed | cases changed |")
    print("|---|---|---|---|---|---|")
    for label, policy in wrong.items():
        if policy.section(op.name) == base.section(op.name) and not policy.diff(base, operator=op.name):
            continue
        reference = op.load("reference")
        report = report_of(functools.partial(reference, policy=policy))
        distances = sorted(max((o.err_same for o in c.outputs if o.status != "absent"), default=0.0)
                           for c in report.checked)
        changed = sum(d > 0 for d in distances)
        print(f"| {label} | {distances[0]:.2e} | {distances[len(distances) // 2]:.2e} | {distances[-1]:.2e} | "
              f"{len(report.failed_cases)} | {changed} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", nargs="+", default=list(OPERATORS), choices=OPERATORS,
                        help="operators with whole-op golden data (stage 1 has tests/test_testing.py)")
    parser.add_argument("--grid", default="gate")
    parser.add_argument("--wrong", action="store_true", help="also gate the wrong policies (slower)")
    parser.add_argument("--wrong-policy", default="upstream_sm90", help="the claimed policy of --wrong")
    parser.add_argument("--reorder", action="store_true",
                        help="also the FP32-level variants over several permutation seeds (smoke + gate grids)")
    parser.add_argument("--record-dir", type=Path, default=provenance.MEASUREMENTS,
                        help="write the printed tables with the provenance header to DIR/measure_gate_tolerances.md and .json "
                             "(default: reports/measurements)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    with provenance.record_measurement("measure_gate_tolerances", "The accuracy gates' tolerances of the forward "
                                       "and stage 2 (docs/gating.md)", None if args.no_record else args.record_dir):
        for name in args.op:
            op = _operator.get(name)
            cpu_noise(op, args.grid)
            h200(op)
            if args.reorder:
                reorder_excess(op)
            if args.wrong:
                wrong_policies(op, args.grid, args.wrong_policy)


if __name__ == "__main__":
    main()
