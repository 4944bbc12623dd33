#!/usr/bin/env python
"""The whole op from its raw inputs, stage by stage, with and without the FP32-level models, against upstream on
the H200 (issue 24, acceptance 2).

For every whole-op golden case (``tests/data/upstream_h200_full_op_cases.pt`` and ``..._extra_cases.pt``: whole
tensors) and every long case (``tests/data/upstream_h200_full_op_long_cases.pt``: S = 2048 and 8192, sampled
records, inputs regenerated from the spec) the reference chain runs from the raw inputs (preprocessing -> forward
-> stage 1 -> stage 2 -> epilogue) under three policies:

* ``fp32``: the ``fp32`` preset (no rounding site; fp16 cases: with ``lp_dtype="float16"``);
* ``upstream_sm90``: the bf16/fp16 rounding sites, FP32-level knobs at their defaults;
* ``upstream_sm90 + fp32-level``: with every FP32-level model of the H200 (``policy.FP32_LEVEL_SM90``:
  ``gemm_model="sm90_wgmma"``, ``special_functions="fast_sm90"``, ``fp32_fma=True``).

Each stage's outputs are compared with upstream's recorded outputs of that stage (rel RMS; on the long cases over
the record's 4096 sampled positions, ``golden_samples.sampled_rel_rms``). The preprocessing models the recording
run's autotuner pick of ``dacs_segsum_kernel`` (``golden.SEGSUM_NUM_WARPS_OF_RUN``); the other helpers run at their
defaults. Writes ``reports/fp32_level_whole_op.md``
and a JSON twin. ``--smoke``: the first stored case only.

``--kernels`` (issue 43, acceptance 3) adds the chain on the package's Triton kernels (``backend="triton"``) under
``upstream_sm90`` and ``fp32``: the kernels honour the rounding sites and the FP32-level knobs at their defaults
only (their GEMMs are ``tl.dot`` and their ``exp`` Triton's, whatever the hardware does with them), so there is no
kernel column with the FP32-level models. On a CUDA device (the interpreter on the CPU takes minutes per stage at
S = 2048: only with ``--smoke``). Its report is ``reports/fp32_level_whole_op_kernels_<device>.md`` by default.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import mimo_numerics as mn
from mimo_numerics import golden_data, provenance
from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs
from mimo_numerics.ops.mamba3_mimo.golden import SEGSUM_NUM_WARPS_OF_RUN
from mimo_numerics.policy import FP32_LEVEL_SM90
from mimo_numerics.studies import golden_figures

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "reports" / "fp32_level_whole_op.md"
LONG = golden_data.path("full_op_long", must_exist=False)
VARIANTS = ("fp32", "upstream_sm90", "upstream_sm90 + fp32-level")
#: The variants ``--kernels`` adds: the chain on the Triton kernels under a policy of :func:`policies`.
KERNEL_VARIANTS = {"kernels: upstream_sm90": "upstream_sm90", "kernels: fp32": "fp32"}
SECTIONS = ("pre", "fwd", "bwd_fwd", "bwd_bwd", "post", "autograd")  # golden_figures.chain_stages' sections


def policies(lp: torch.dtype) -> dict:
    fp16 = lp == torch.float16
    base = mn.presets.get("upstream_sm90_fp16" if fp16 else "upstream_sm90")
    plain = mn.presets.get("fp32")
    return {"fp32": plain.replace(lp_dtype="float16") if fp16 else plain, "upstream_sm90": base,
            "upstream_sm90 + fp32-level": base.replace(**FP32_LEVEL_SM90)}


def cases(smoke: bool):
    stored = {**golden_data.load("full_op"), **golden_data.load("full_op_extra")}
    names = [n for n, c in stored.items() if all(k in c for k in ("pre", "fwd", "bwd_fwd", "bwd_bwd"))]
    for name in names[:1] if smoke else names:
        yield name, dict(stored[name]["inputs"]), stored[name]
    if smoke or not LONG.exists():
        return
    for name, record in torch.load(LONG, weights_only=True).items():
        yield name, make_op_inputs(OpCaseSpec.from_dict(record["spec"])), record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--device", default="cpu", help="where the chain runs (cpu, cuda, ...); the comparisons "
                        "are made on the CPU")
    parser.add_argument("--kernels", action="store_true", help="also the chain on the Triton kernels (module "
                        "docstring; a CUDA device, or the CPU with --smoke)")
    parser.add_argument("--render", type=Path, metavar="JSON", help="no run: rewrite the report from its JSON twin")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        write(saved["rows"], saved["provenance"], args.out, saved.get("smoke", False), saved.get("device", "cpu"))
        return 0
    if args.kernels and torch.device(args.device).type == "cpu" and not args.smoke:
        parser.error("--kernels on the CPU runs Triton's interpreter (minutes per stage at S = 2048): pass --device "
                     "cuda, or --smoke")
    if args.kernels and args.out == DEFAULT_OUT:
        args.out = DEFAULT_OUT.with_name(f"fp32_level_whole_op_kernels_{torch.device(args.device).type}.md")
    prov = provenance.collect()
    rows = {}
    for name, inputs, case in cases(args.smoke):
        t0 = time.time()
        on_device = {k: v.to(args.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        pick = SEGSUM_NUM_WARPS_OF_RUN.get(name)
        by_policy = policies(inputs["Q"].dtype)
        rows[name] = {v: golden_figures.stage_errors(on_device, case, p, pick) for v, p in by_policy.items()}
        if args.kernels:
            for label, base in KERNEL_VARIANTS.items():
                rows[name][label] = golden_figures.stage_errors(on_device, case, by_policy[base], backend="triton")
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
    write(rows, prov, args.out, args.smoke, args.device)
    return 0


def render(rows: dict, prov: dict, smoke: bool, device: str = "cpu") -> list:
    variants = list(next(iter(rows.values()))) if rows else list(VARIANTS)
    where = "" if device == "cpu" else f" (the chain on `{device}`)"
    lines = ["# The whole op from raw inputs, stage by stage, with the FP32-level models" + where, "",
             provenance.markdown_header(prov) + (" **Smoke run: not the report's figures.**" if smoke else ""),
             "", "Rel RMS to upstream's recorded output of each stage (the chain runs from the raw inputs, so each "
             "stage also carries the difference of the stages before it). `fp32-level`: `gemm_model=\"sm90_wgmma\"`, "
             "`special_functions=\"fast_sm90\"`, `fp32_fma=True`. Long cases (S >= 2048): over 4096 sampled positions per tensor. "
             "`gain`: rel RMS under `fp32` / under `upstream_sm90 + fp32-level`. The preprocessing takes each "
             "recording run's autotuner pick of `dacs_segsum_kernel` (`golden.SEGSUM_NUM_WARPS_OF_RUN`)."
             + (" `kernels: <policy>`: every step on the package's Triton kernels (`backend=\"triton\"`; their "
                "preprocessing has its own summation order, not the autotuner pick's)." if len(variants) > 3 else ""),
             ""]
    lines += ["## The op's outputs (`Out` and the 14 gradients), worst per case", "",
              "Gain over the outputs the policy changes (fp32 and upstream_sm90 differ); an output made exact counts "
              "as unbounded.", "",
              "| case | " + " | ".join(f"`{v}` worst" for v in variants) + " | worst output (fp32-level) | "
              "smallest gain |", "|---|" + "---|" * (len(variants) + 2)]
    for name, by_variant in rows.items():
        sel = {v: {k: e for k, e in by_variant[v].items() if k.startswith("autograd.")} for v in variants}
        last = sel[VARIANTS[-1]]
        worst = max(last, key=last.get)
        gains = {k: sel["fp32"][k] / last[k] for k in last
                 if last[k] > 0 and sel["fp32"][k] != sel["upstream_sm90"][k]}
        low = min(gains, key=gains.get) if gains else "-"
        cells = [f"{max(sel[v].values()):.2e}" for v in variants]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {worst} | "
                     + (f"{gains[low]:.1f} ({low})" if gains else "-") + " |")
    lines += ["", "## Per stage, worst output (fp32-level on; in brackets off)", "",
              "| case | " + " | ".join(SECTIONS) + " |", "|---|" + "---|" * len(SECTIONS)]
    for name, by_variant in rows.items():
        cells = []
        for section in SECTIONS:
            on = [e for k, e in by_variant[VARIANTS[-1]].items() if k.startswith(section + ".")]
            off = [e for k, e in by_variant["upstream_sm90"].items() if k.startswith(section + ".")]
            cells.append(f"{max(on):.1e} ({max(off):.1e})" if on else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Every output", "", "| case | output | " + " | ".join(f"`{v}`" for v in variants) + " |",
              "|---|---|" + "---|" * len(variants)]
    for name, by_variant in rows.items():
        for key in by_variant[variants[0]]:
            lines.append(f"| {name} | {key} | " + " | ".join(
                f"{by_variant[v][key]:.2e}" if key in by_variant[v] else "-" for v in variants) + " |")
    return lines


def write(rows: dict, prov: dict, out: Path, smoke: bool, device: str = "cpu") -> None:
    lines = render(rows, prov, smoke, device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"provenance": prov, "rows": rows, "smoke": smoke,
                                                    "device": device}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
