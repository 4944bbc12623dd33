"""Measure the forward reference (``mimo_numerics.ops.mamba_mimo_fwd``) against the real H200 forward output.

For each case of the whole-op golden file (``fwd.o``, given the raw inputs and upstream's recorded preprocessing
``pre``) it prints, as Markdown:

1. rel RMS to upstream under the stand-in presets upstream_sm90, fp32, fp64, the bit-equal fraction under
   upstream_sm90, rel RMS with ``diag_mode="mul_then_add"`` (the unfused diagonal), and with upstream's own stage-1
   ``states`` substituted for the reference's FP32 state (a diagnostic: how much of the residual is the FP32 state
   recurrence; it assumes the forward's state equals the one stage 1 recomputes, which the numbers support);
2. per site: the golden cases where switching that site off alone changes the output, and the smallest and
   largest ratio rel RMS(site off) / rel RMS(all on) over them.

Usage: ``python scripts/measure_fwd_golden.py [--sites]`` (CPU, under a minute; ``--sites`` adds table 2).
The numbers in docs/forward.md and in the ``fwd_golden_*`` entries of mimo_numerics/tolerances.py come from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from mimo_numerics import golden_data, presets, provenance
from mimo_numerics.ops.mamba_mimo_fwd.golden import golden_args, golden_table
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_fwd import reference as fwd_reference
from mimo_numerics.ops.mamba_mimo_fwd.sites import SITES


def fwd_policy(preset: str, sites=None, **knobs):
    """``preset`` with ``knobs`` and the forward's ``sites`` ({site: bool}) changed."""
    policy = presets.get(preset).replace(**knobs) if knobs else presets.get(preset)
    return policy.with_sites("mamba_mimo_fwd", **sites) if sites else policy


def run_forward(args: dict, policy):
    return fwd_reference.mamba_mimo_fwd(**args, policy=policy)


def load_golden() -> dict:
    """The 7 shared whole-op golden cases (``golden_data`` file ``full_op``: bf16, each with upstream's stage-1
    record, which the "upstream states" column substitutes), by name: the cases of docs/forward.md's tables (the
    extra H200 cases include an fp16 one, which these bf16 presets refuse)."""
    return {name: case for name, case in golden_data.load("full_op").items() if case.get("fwd") is not None}


def _with_upstream_states(case: dict) -> torch.Tensor:
    """The upstream_sm90 output with h replaced by upstream's stage-1 STATES (bf16 values, so state_operand keeps
    them as they are)."""
    states = case["bwd_fwd"]["states"]
    original = fwd_reference.state_recurrence

    def upstream_states(k_state, psiv, decay, policy, final=False):  # state_recurrence's signature
        if final:
            raise ValueError("upstream's stage-1 STATES hold no final state (return_state is not measured here)")
        return states.to(k_state.dtype)

    fwd_reference.state_recurrence = upstream_states
    try:
        return run_forward(golden_args(case), fwd_policy("upstream_sm90")).o
    finally:
        fwd_reference.state_recurrence = original


def case_table(golden: dict) -> str:
    lines = ["| case | upstream_sm90 | bit-equal | fp32 | fp64 | fp32 / sm90 | unfused diagonal | upstream states |",
             "|---|---|---|---|---|---|---|---|"]
    unfused = fwd_policy("upstream_sm90", diag_mode="mul_then_add")
    for row in golden_table(golden):
        case = golden[row["case"]]
        want = case["fwd"]["o"]
        mta = rel_rms(run_forward(golden_args(case), unfused).o, want)
        injected = f"{rel_rms(_with_upstream_states(case), want):.2e}"
        lines.append(f"| {row['case']} | {row['upstream_sm90']:.2e} | {row['bit_equal']:.4f} | {row['fp32']:.2e} | "
                     f"{row['fp64']:.2e} | {row['fp32'] / row['upstream_sm90']:.1f} | {mta:.2e} | {injected} |")
    return "\n".join(lines)


def site_table(golden: dict) -> str:
    names = sorted(golden)
    base = {n: run_forward(golden_args(golden[n]), fwd_policy("upstream_sm90")).o for n in names}
    lines = ["| site | cases changed | min ratio off/on | max ratio off/on |", "|---|---|---|---|"]
    for site in SITES:
        ratios = []
        for name in names:
            want = golden[name]["fwd"]["o"]
            off = run_forward(golden_args(golden[name]), fwd_policy("upstream_sm90", sites={site: False})).o
            if not torch.equal(off, base[name]):
                ratios.append(rel_rms(off, want) / rel_rms(base[name], want))
        low = f"{min(ratios):.2f}" if ratios else "-"
        high = f"{max(ratios):.1f}" if ratios else "-"
        lines.append(f"| {site} | {len(ratios)}/{len(names)} | {low} | {high} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", action="store_true", help="also print the one-site-off sensitivity table")
    parser.add_argument("--record-dir", type=Path, default=provenance.MEASUREMENTS,
                        help="write the printed tables with the provenance header to DIR/measure_fwd_golden.md and .json "
                             "(default: reports/measurements)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    golden = load_golden()
    with provenance.record_measurement("measure_fwd_golden", "Forward reference against the H200 forward output "
                                       "(docs/forward.md)", None if args.no_record else args.record_dir):
        print(case_table(golden))
        if args.sites:
            print()
            print(site_table(golden))
    return 0


if __name__ == "__main__":
    sys.exit(main())
