"""Print the figures of docs/fp64_model.md: the FP64 side of the whole Mamba-3 MIMO op against the golden H200 data.

Tables (markdown): upstream's preprocessing as modelled by ``preprocess.py`` (float32 and float64 forms) against the
golden ``pre`` tensors; the forward oracle given the golden ``pre`` against ``fwd.o``; the FP64 model's ``Out`` and
its 14 autograd gradients against ``autograd``; ``dD``'s error relative to the sum of its terms' magnitudes; the
forward oracle against the FP64 model on the drawn grid ``cases.ORACLE_GRID``. Every error is
``metric(upstream, fp64)``. CPU, a few seconds a case.

Usage: ``python scripts/measure_fp64_vs_golden.py [--golden PATH]`` (default: the path of
``mimo_numerics.golden_data``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from mimo_numerics import golden_data, provenance
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba3_mimo import cases
from mimo_numerics.studies import measure
from mimo_numerics.ops.mamba3_mimo.fp64_model import INPUT_NAMES

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_FULL_OP = golden_data.path("full_op")


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else ("0" if value == 0 else f"{value:.2e}")


def _preprocess_table(golden: dict) -> None:
    print("### Preprocessing vs golden `pre` (max abs / rel RMS / bit-equal fraction)\n")
    print("| case | form | " + " | ".join(measure.PRE_TENSORS) + " |")
    print("|---|---|" + "---|" * len(measure.PRE_TENSORS))
    for name, case in golden.items():
        for dtype in (torch.float32, torch.float64):
            figures = measure.preprocess_figures(case, dtype)
            cells = []
            for tensor in measure.PRE_TENSORS:
                row = figures[tensor]
                cell = f"{_fmt(row['max_abs'])} / {_fmt(row['rel_rms'])}"
                if dtype == torch.float32:
                    cell += f" / {row['bit_equal']:.4f}"
                if tensor == "angles_cumsum" and row["wrapped_max_abs"] != row["max_abs"]:
                    cell += f" (wrapped {_fmt(row['wrapped_max_abs'])})"
                cells.append(cell)
            print(f"| {name} | {str(dtype).replace('torch.', '')} | " + " | ".join(cells) + " |")
    print()


def _tanh_table(golden: dict) -> None:
    print("### Upstream's tanh.approx.f32 vs torch's fp32 tanh, inferred at t = 0 (signed fp32 ulps)\n")
    print("| case | elements | min | median abs | max | within 2 ulp |\n|---|---|---|---|---|---|")
    every = []
    for name, case in golden.items():
        offsets = measure.tanh_ulp_offsets_at_first_token(case).flatten()
        every.append(offsets)
        print(f"| {name} | {offsets.numel()} | {offsets.min().item()} | {offsets.abs().median().item()} | "
              f"{offsets.max().item()} | {(offsets.abs() <= 2).sum().item()} |")
    offsets = torch.cat(every)
    print(f"\nall: {offsets.numel()} elements, none beyond the 300-ulp search: {bool((offsets.abs() <= 300).all())}, "
          f"mean {offsets.double().mean().item():.2f} ulp\n")


def _golden_tables(golden: dict) -> None:
    grad_names = ["d" + n for n in INPUT_NAMES]
    print("### rel RMS against the golden data\n")
    print("`fwd oracle` = mamba_mimo_fwd_oracle given the golden `pre`, against `fwd.o`; the rest: mamba3_mimo_fp64 "
          "and its autograd gradients against `autograd`; `dD/Σ|t|` = max over heads of |ΔdD| / Σ |terms|.\n")
    print("| case | fwd oracle | Out | " + " | ".join(grad_names) + " | dD/Σ\\|t\\| |")
    print("|---|---|---|" + "---|" * len(grad_names) + "---|")
    worst = {}
    for name, case in golden.items():
        cells = {"fwd oracle": rel_rms(case["fwd"]["o"], measure.fwd_oracle_on_golden_pre(case))}
        out, grads = measure.model_output_and_grads(case)
        cells["Out"] = rel_rms(case["autograd"]["Out"], out)
        for grad_name in grad_names:
            if grad_name in grads:
                cells[grad_name] = rel_rms(case["autograd"][grad_name], grads[grad_name])
        if "dD" in grads:
            cells["dD/terms"] = measure.dd_error_over_abs_terms(case, grads["dD"])
        for key, value in cells.items():
            worst[key] = max(worst.get(key, 0.0), value)
        row = [cells.get(key, math.nan) for key in ["fwd oracle", "Out"] + grad_names + ["dD/terms"]]
        print(f"| {name} | " + " | ".join(_fmt(v) for v in row) + " |")
    print("\nworst per column: " + ", ".join(f"{key} {_fmt(value)}" for key, value in worst.items()))
    others = [v for k, v in worst.items() if k.startswith("d") and k not in ("dAngles", "dD", "dD/terms")]
    print(f"worst gradient other than dAngles, dD: {_fmt(max(others))}\n")


def _grid_table() -> None:
    print("### Forward oracle vs FP64 model on the drawn grid (rel RMS)\n")
    print("| case | rel RMS |\n|---|---|")
    worst = 0.0
    for spec in cases.ORACLE_GRID:
        value = measure.fwd_oracle_vs_model(cases.make_op_inputs(spec), spec.chunk_size, spec.rotary_dim_divisor)
        worst = max(worst, value)
        print(f"| {cases.case_id(spec)} | {_fmt(value)} |")
    print(f"\nworst: {_fmt(worst)}\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, default=GOLDEN_FULL_OP, help="upstream_h200_full_op_cases.pt")
    parser.add_argument("--record-dir", type=Path, default=provenance.MEASUREMENTS,
                        help="write the printed tables with the provenance header to DIR/measure_fp64_vs_golden.md and .json "
                             "(default: reports/measurements)")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    golden = torch.load(args.golden, weights_only=True)
    shown = args.golden.resolve()
    shown = shown.relative_to(provenance.ROOT) if shown.is_relative_to(provenance.ROOT) else shown.name
    with provenance.record_measurement("measure_fp64_vs_golden", "FP64 side of the whole op against the golden H200 "
                                       "data (docs/fp64_model.md)", None if args.no_record else args.record_dir):
        print(f"torch {torch.__version__}, golden `{shown}`\n")
        _preprocess_table(golden)
        _tanh_table(golden)
        _golden_tables(golden)
        _grid_table()


if __name__ == "__main__":
    main()
