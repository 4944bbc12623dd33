#!/usr/bin/env python
"""The references under each FP32-level model against the real upstream kernels (golden H200 data): per kernel.

Three tables, each output's rel RMS to upstream and its bit-equal fraction, under ``upstream_sm90`` (or its fp16
twin) with the FP32-level knobs of each variant (:data:`VARIANTS`; default ``gemm_model`` = ``fp32``,
``sm90_wgmma`` and ``sm80_mma``; ``--variants fp32 sm90_wgmma fast_sm90 wgmma_fast fp32_level --out
reports/fp32_level_golden.md`` adds the MUFU models of ``special_functions`` and, in ``fp32_level``, every model
with ``fp32_fma``):

1. stage 1 on the seed golden cases (``tests/data/upstream_h200_seed_cases.pt``);
2. stage 1 on the long realistic cases (S up to 2048; ``upstream_h200_realistic_outputs.pt``, inputs regenerated);
3. the forward and stage 2 on upstream's recorded inputs of each kernel of the whole-op golden cases (the rows
   ``fwd|upstream pre`` and ``stage2|upstream stage 1`` of ``golden_figures.cascade_figures``).

Writes ``reports/gemm_model_golden.md`` and a JSON twin. ``--smoke``: one case per table, ``fp32`` and
``sm90_wgmma`` only (the code paths in seconds, not the report's figures).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Dict, List

import torch

import mimo_numerics as mn
from mimo_numerics import golden_data, provenance
from mimo_numerics.cases import CaseSpec
from mimo_numerics.metrics import bit_equal_fraction, rel_rms
from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden as stage1_golden
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.reference import mamba_mimo_bwd_fwd
from mimo_numerics.policy import FP32_LEVEL_SM90
from mimo_numerics.studies.golden_figures import STAGE1_OUTPUTS, STAGE2_OUTPUTS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "reports" / "gemm_model_golden.md"
MODELS = ("fp32", "sm90_wgmma", "sm80_mma")
#: Variant name -> the FP32-level knobs it sets on ``upstream_sm90`` (``fp32``: none, the baseline of the ratios).
VARIANTS = {"fp32": {}, "sm90_wgmma": {"gemm_model": "sm90_wgmma"}, "sm80_mma": {"gemm_model": "sm80_mma"},
            "fast_sm90": {"special_functions": "fast_sm90"},
            "wgmma_fast": {"gemm_model": "sm90_wgmma", "special_functions": "fast_sm90"},
            "fp32_level": dict(FP32_LEVEL_SM90)}


def _policy(lp: torch.dtype, model: str):
    return mn.presets.get("upstream_sm90" if lp == torch.bfloat16 else "upstream_sm90_fp16").replace(**VARIANTS[model])


def to_device(obj, device):
    """``obj`` (a tensor, or a dict/list/tuple of them, other values kept) with every tensor on ``device``."""
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def _row(case: str, kernel: str, output: str, got: Dict[str, torch.Tensor], want: torch.Tensor) -> dict:
    got = {m: t.cpu() for m, t in got.items()}
    return {"case": case, "kernel": kernel, "output": output,
            "rel_rms": {m: rel_rms(t, want) for m, t in got.items()},
            "bit_equal": {m: bit_equal_fraction(t, want) for m, t in got.items() if t.dtype == want.dtype}}


def stage1_rows(models, smoke: bool, device="cpu") -> List[dict]:
    rows = []
    cases = stage1_golden.load_golden()
    for name in (["seed_gqa"] if smoke else cases):
        inputs, upstream = cases[name]
        inputs = to_device(inputs, device)
        runs = {m: mamba_mimo_bwd_fwd(**inputs, policy=_policy(inputs["q"].dtype, m)) for m in models}
        rows += [_row(name, "stage 1 (seed)", o, {m: getattr(r, o) for m, r in runs.items()}, upstream[o])
                 for o in STAGE1_OUTPUTS if upstream[o] is not None]
    realistic = golden_data.load("realistic_outputs")["cases"]
    shortest = min(realistic, key=lambda n: realistic[n]["spec"]["seqlen"] * realistic[n]["spec"]["batch"])
    for name in ([shortest] if smoke else sorted(realistic)):
        case = realistic[name]
        x = to_device(make_inputs(CaseSpec.from_dict(case["spec"])), device)
        runs = {m: mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=_policy(x["q"].dtype, m)) for m in models}
        rows += [_row(name, "stage 1 (realistic)", o, {m: getattr(r, o) for m, r in runs.items()}, want)
                 for o, want in case["upstream"].items() if want is not None]
    return rows


def whole_op_rows(models, smoke: bool, device="cpu") -> List[dict]:
    rows = []
    data = {**golden_data.load("full_op"), **golden_data.load("full_op_extra")}
    names = sorted(n for n, c in data.items() if all(k in c for k in ("pre", "fwd", "bwd_fwd", "bwd_bwd")))
    for name in (names[:1] if smoke else names):
        case = data[name]
        x = to_device(dict(case["inputs"]), device)
        pre, bwd_fwd = to_device(case["pre"], device), to_device(case["bwd_fwd"], device)
        fwd, s2 = {}, {}
        for m in models:
            policy = _policy(x["Q"].dtype, m)
            fwd[m] = chain.run_forward(x, pre, policy)
            s2[m] = chain.run_stage2(x, pre, bwd_fwd, policy)
        rows.append(_row(name, "forward", "o", fwd, case["fwd"]["o"]))
        rows += [_row(name, "stage 2", o, {m: s2[m][o] for m in models}, case["bwd_bwd"][o])
                 for o in STAGE2_OUTPUTS if case["bwd_bwd"].get(o) is not None and s2["fp32"].get(o) is not None]
    return rows


def summary(rows: List[dict], models) -> List[str]:
    """Per kernel: the geometric-mean ratio of each model's rel RMS to fp32's (over outputs neither makes exact),
    the worst ratio, the mean bit-equal fraction, and how many outputs are equal in value to upstream's."""
    out = ["| kernel | outputs | model | geo-mean ratio to fp32 | worst ratio | mean bit-equal | equal to upstream |",
           "|---|---|---|---|---|---|---|"]
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        sel = [r for r in rows if r["kernel"] == kernel]
        for m in models:
            ratios = [r["rel_rms"][m] / r["rel_rms"]["fp32"] for r in sel if r["rel_rms"]["fp32"] > 0]
            both = [q for q in ratios if q > 0]  # outputs the model makes exact are counted in the last column
            geo = math.exp(sum(math.log(q) for q in both) / len(both)) if both else float("nan")
            be = [r["bit_equal"][m] for r in sel if m in r["bit_equal"]]
            exact = sum(1 for r in sel if r["rel_rms"][m] == 0)
            geo_text = f"{geo:.3f}" if both else "- (every output exact)" if ratios else "-"
            out.append(f"| {kernel} | {len(sel)} | `{m}` | {geo_text} | {max(ratios, default=float('nan')):.3f} | "
                       f"{sum(be) / max(len(be), 1):.4f} | {exact} |")
    return out


def detail(rows: List[dict], models) -> List[str]:
    head = "| kernel | case | output | " + " | ".join(f"`{m}` rel RMS (bit-equal)" for m in models) + " |"
    out = [head, "|---|---|---|" + "---|" * len(models)]
    for r in rows:
        cells = [f"{r['rel_rms'][m]:.2e}" + (f" ({r['bit_equal'][m]:.4f})" if m in r["bit_equal"] else "")
                 for m in models]
        out.append(f"| {r['kernel']} | {r['case']} | {r['output']} | " + " | ".join(cells) + " |")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--smoke", action="store_true", help="one case per table, the first two variants only")
    parser.add_argument("--variants", nargs="+", default=list(MODELS), choices=list(VARIANTS),
                        help="the first must be fp32 (the baseline)")
    parser.add_argument("--device", default="cpu", help="where the references run (cpu, cuda, ...); the "
                        "comparisons are made on the CPU")
    args = parser.parse_args(argv)
    if args.variants[0] != "fp32":
        parser.error("--variants must start with fp32 (the baseline of the ratios)")
    models = tuple(args.variants[:2] if args.smoke else args.variants)
    prov = provenance.collect()
    rows = stage1_rows(models, args.smoke, args.device) + whole_op_rows(models, args.smoke, args.device)
    lines = [
        "# The references under each FP32-level model against the H200 golden data"
        + ("" if args.device == "cpu" else f" (the references on `{args.device}`)"),
        "",
        provenance.markdown_header(prov) + (" **Smoke run: not the report's figures.**" if args.smoke else ""),
        "",
        "Policy `upstream_sm90` (fp16 cases: `upstream_sm90_fp16`) with the FP32-level knobs of each variant ("
        + ", ".join(f"`{m}`: {VARIANTS[m] or 'none'}" for m in models) + "); rel RMS to "
        "upstream's output and, for outputs of the same dtype, the fraction of bit-equal elements. Stage 1 runs "
        "from the golden inputs; the forward and stage 2 from upstream's recorded inputs of that kernel (its "
        "preprocessing outputs, and stage 1's for stage 2), so each kernel's own distance shows. Ratios are "
        "`rel RMS(model) / rel RMS(fp32)` over outputs where fp32's is not 0 (below 1: the model is closer).",
        "",
        "## Summary",
        "",
        *summary(rows, models),
        "",
        "## Every output",
        "",
        *detail(rows, models),
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
