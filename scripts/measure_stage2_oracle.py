#!/usr/bin/env python
"""Measure the stage-2 FP64 oracle and the epilogue against the golden whole-op H200 data; print markdown tables.

Tables (the figures of ``docs/stage2_oracle.md`` and of the stage-2 entries of ``mimo_numerics/tolerances.py``):

1. ``mamba_mimo_bwd_bwd_oracle`` (given upstream's bf16 ``states``/``qk_dot``, ``pre`` and the raw inputs) vs
   upstream's recorded ``bwd_bwd``: rel RMS per output and case; for ``dD``, ``ddA``, ``dangles`` also
   ``max |Δ| / Σ|terms|`` (``mamba_mimo_bwd_bwd_abs_terms``).
2. The FP32 epilogue reference (given upstream's ``bwd_bwd``, ``bwd_fwd``, ``pre`` and raw inputs) vs the golden
   ``post`` and ``autograd`` entries: max abs, rel RMS, bit-equal fraction (worst case over the cases), with
   ``fma=True`` (upstream) and ``fma=False``; and the FP64 epilogue oracle vs the same.
3. With ``--chain``: the whole FP64 chain (FP64 preprocessing -> stage-1 FP64 oracle -> stage-2 oracle -> FP64
   epilogue), from the raw inputs only, vs the golden ``autograd`` gradients (rel RMS per case).

Usage::

    python scripts/measure_stage2_oracle.py [--chain]

CPU, deterministic; about 20 s (40 s with ``--chain``) on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

from mimo_numerics import golden_data, provenance
from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.metrics import bit_equal_fraction, max_abs, rel_rms
from mimo_numerics.ops.mamba3_mimo_epilogue.oracle import mamba3_mimo_epilogue_oracle
from mimo_numerics.ops.mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference
from mimo_numerics.ops.mamba3_mimo_epilogue.spec import GRAD_NAMES, POST_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.oracle import (
    OUTPUT_NAMES, mamba_mimo_bwd_bwd_abs_terms, mamba_mimo_bwd_bwd_oracle)

CANCELLING = ("dD", "ddA", "dangles")


def _table(head, rows):
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def _short(name: str) -> str:
    return name[2:] if name.startswith("g_") else name


def stage2_table() -> str:
    data = golden_data.load("full_op")
    names = sorted(golden_data.load("full_op"))
    rel = {}
    scaled = {}
    for name in names:
        case = data[name]
        args = chain.stage2_args(case["inputs"], case["pre"], case["bwd_fwd"])
        kwargs = chain.stage2_kwargs(case["inputs"])
        got = mamba_mimo_bwd_bwd_oracle(*args, **kwargs)
        terms = mamba_mimo_bwd_bwd_abs_terms(*args, **kwargs)
        for out in OUTPUT_NAMES:
            want = case["bwd_bwd"][out]
            if want is None:
                continue
            rel[name, out] = rel_rms(want, got[out])
            if out in CANCELLING:
                diff, scale = (want.double() - got[out]).abs(), terms[out]
                # the last chunk's ddA has no terms (and is 0 in both)
                ratio = torch.where(scale > 0, diff / scale.clamp_min(1e-300), diff)
                scaled[name, out] = (ratio.max().item(),
                                     (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(scale)).item())
    rows = []
    for out in OUTPUT_NAMES:
        vals = [rel.get((n, out)) for n in names]
        rows.append([f"`{out}`"] + ["-" if v is None else f"{v:.2e}" for v in vals]
                    + [f"{max(v for v in vals if v is not None):.2e}"])
    lines = ["### rel RMS of upstream `bwd_bwd` against the oracle", "",
             _table(["output"] + [_short(n) for n in names] + ["max"], rows), "",
             "### Error against Σ|terms| of the cancelling sums: max over elements of |Δ| / Σ|terms|, and "
             "‖Δ‖₂ / ‖Σ|terms|‖₂", ""]
    rows = []
    for out in CANCELLING:
        for k, label in ((0, "max"), (1, "rms")):
            vals = [None if (n, out) not in scaled else scaled[n, out][k] for n in names]
            rows.append([f"`{out}` {label}"] + ["-" if v is None else f"{v:.2e}" for v in vals]
                        + [f"{max(v for v in vals if v is not None):.2e}"])
    lines.append(_table(["output"] + [_short(n) for n in names] + ["max"], rows))
    return "\n".join(lines)


def _golden_targets(case):
    targets = {POST_NAMES[k]: v for k, v in case["post"].items()}
    targets.update({k: v for k, v in case["autograd"].items() if k in GRAD_NAMES and v is not None})
    return targets


def epilogue_table() -> str:
    data = golden_data.load("full_op")
    names = sorted(golden_data.load("full_op"))
    stats = {}
    for name in names:
        case = data[name]
        args = chain.epilogue_args(case["inputs"], case["pre"], case["bwd_fwd"], case["bwd_bwd"])
        kwargs = chain.epilogue_kwargs(case["inputs"])
        runs = {"fma": mamba3_mimo_epilogue_reference(*args, **kwargs, fma=True),
                "no_fma": mamba3_mimo_epilogue_reference(*args, **kwargs, fma=False),
                "fp64": mamba3_mimo_epilogue_oracle(*args, **kwargs)}
        for out, want in _golden_targets(case).items():
            for run, got in runs.items():
                g = got[out]
                bits = bit_equal_fraction(g.to(want.dtype), want) if run != "fp64" else float("nan")
                stats.setdefault((run, out), []).append((max_abs(g, want), rel_rms(g, want), bits))
    rows = []
    outs = list(dict.fromkeys(list(POST_NAMES.values()) + list(GRAD_NAMES)))
    for out in outs:
        if ("fma", out) not in stats:
            continue
        row = [f"`{out}`"]
        for run in ("fma", "no_fma"):
            s = stats[run, out]
            row += [f"{max(x[0] for x in s):.2e}", f"{max(x[1] for x in s):.2e}", f"{min(x[2] for x in s):.4f}"]
        row.append(f"{max(x[1] for x in stats['fp64', out]):.2e}")
        rows.append(row)
    head = ["output", "max abs", "rel RMS", "bit-equal (min)", "max abs (no fma)", "rel RMS (no fma)",
            "bit-equal (no fma)", "FP64 oracle rel RMS"]
    return ("### FP32 epilogue reference vs golden `post`/`autograd` (worst over the 7 cases)\n\n"
            + _table(head, rows))


def chain_table() -> str:

    data = golden_data.load("full_op")
    names = sorted(golden_data.load("full_op"))
    rel = {}
    for name in names:
        case = data[name]
        got = chain.fp64_chain(case["inputs"])
        for out in GRAD_NAMES:
            want = case["autograd"][out]
            if want is not None:
                rel[name, out] = rel_rms(want, got[out])
    rows = []
    for out in GRAD_NAMES:
        vals = [rel.get((n, out)) for n in names]
        if all(v is None for v in vals):
            continue
        rows.append([f"`{out}`"] + ["-" if v is None else f"{v:.2e}" for v in vals]
                    + [f"{max(v for v in vals if v is not None):.2e}"])
    return ("### rel RMS of the golden `autograd` gradients against the whole FP64 chain\n\n"
            + _table(["gradient"] + [_short(n) for n in names] + ["max"], rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chain", action="store_true", help="also measure the whole FP64 chain")
    parser.add_argument("--record-dir", type=Path, default=provenance.MEASUREMENTS,
                        help="write the printed tables with the provenance header to DIR/measure_stage2_oracle.md and .json "
                             "(default: reports/measurements)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    with provenance.record_measurement("measure_stage2_oracle", "Stage-2 FP64 oracle and the epilogue against the "
                                       "golden H200 data (docs/stage2_oracle.md)",
                                       None if args.no_record else args.record_dir):
        print(stage2_table())
        print()
        print(epilogue_table())
        if args.chain:
            print()
            print(chain_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
