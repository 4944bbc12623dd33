#!/usr/bin/env python
"""Stage 2's launches timed one by one under several tile plans (and register caps), on one GPU, in one run.

    python benchmarks/bench_stage2_launches.py --shape d --runs 32x4,32x4k64q64,32x4k64q64/kside=168
    python benchmarks/bench_stage2_launches.py --smoke       # CPU dry run of the script itself (nothing is timed)

Inputs: stage 2's tensors at ``benchmark_cases.kernel_shape(shape)`` (stage 1's outputs from its reference under
``upstream_sm90``, on the GPU: ``bench_bwd_bwd_kernel.stage2_inputs``). A run is a plan in
``kernels.mimo_bwd_bwd.parse_stage2_plan``'s text, optionally followed by ``/KERNEL=N`` register caps (Triton's
``maxnreg`` launch option for that stage-2 kernel, e.g. ``/kside=168``; CUDA only). Each run builds its launches once,
runs them (compiling), compares every output with the first run's (``same bits`` or the outputs that differ: the FP32
orders a plan may change, ``Stage2Tiles``), then times each launch of the first batch slice alone with
``triton.testing.do_bench`` (every slice runs the same launches on the same sizes). The table gives the slice's sum
and each launch; stage 2 at the shape takes about the slice's sum times the number of slices. A benchmark for
choosing plans, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench_bwd_bwd_kernel import _args, _kw, stage2_inputs  # benchmarks/ is on sys.path (run as a script)
from mimo_numerics import provenance
from mimo_numerics.benchmark_cases import kernel_shape
from mimo_numerics.kernels import mimo_bwd_bwd
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import OUTPUT_NAMES

ROOT = Path(__file__).resolve().parent.parent
POLICY = "upstream_sm90"


def parse_run(text: str):
    """``PLAN[/KERNEL=N...]`` -> (plan text, {kernel: maxnreg}); ValueError naming the form."""
    plan, *caps = text.strip().split("/")
    mimo_bwd_bwd.parse_stage2_plan(plan, 16)
    regs = {}
    for cap in caps:
        name, _, value = cap.partition("=")
        if not name or not value.isdigit() or int(value) < 24:
            raise ValueError(f"a register cap must be KERNEL=N with N >= 24 (e.g. kside=168), got {cap!r}")
        regs[name] = int(value)
    return plan, regs


def run_plan(x, plan: str, regs: dict, device) -> tuple:
    prep = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy=POLICY,
                                       tiles=mimo_bwd_bwd.parse_stage2_plan(plan, 16))
    names = {la.name.split("[")[0] for la in prep.launches}
    unknown = sorted(set(regs) - names)
    if unknown:
        raise ValueError(f"register caps for unknown kernels {unknown}; the stage-2 launches are {sorted(names)}")
    for la in prep.launches:
        cap = regs.get(la.name.split("[")[0])
        if cap:
            la.options = dict(la.options, maxnreg=cap)
    start = time.perf_counter()
    for la in prep.launches:
        la.run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    out = prep.finish()
    values = {n: getattr(out, n).clone() for n in OUTPUT_NAMES if getattr(out, n) is not None}
    return prep, values, first_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="d")
    ap.add_argument("--runs", default="32x4,32x4k64q64", help="comma-separated PLAN[/KERNEL=N...] (module docstring)")
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run on shape 's' (nothing is timed)")
    ap.add_argument("--note", default="", help="a sentence on the source measured (e.g. its commit)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    a = ap.parse_args(argv)
    runs = [r for r in a.runs.split(",") if r.strip()]
    try:
        parsed = [parse_run(r) for r in runs]
    except ValueError as err:
        ap.error(f"--runs: {err}")
    device = torch.device("cpu" if a.smoke else "cuda")
    shape = "s" if a.smoke else a.shape
    x = stage2_inputs(kernel_shape(shape), device)
    rows, base = [], None
    for text, (plan, regs) in zip(runs, parsed):
        prep, values, first_s = run_plan(x, plan, regs, device)
        if base is None:
            base, bits = values, "reference run"
        else:
            differ = [n for n in values if not torch.equal(values[n], base[n])]
            bits = "same bits" if not differ else "differ: " + ", ".join(differ)
        first = [la for la in prep.launches if "[" not in la.name or la.name.split("[")[1].startswith("0:")]
        if device.type == "cuda":
            import triton.testing

            times = {la.name.split("[")[0]: triton.testing.do_bench(la.run, rep=a.rep_ms) for la in first}
        else:
            times = {la.name.split("[")[0]: float("nan") for la in first}
        rows.append(dict(run=text, slice_ms=sum(times.values()), launch_ms=times, first_call_s=first_s, bits=bits,
                         slices=len(prep.launches) // max(1, len(first))))
        print(json.dumps(rows[-1]), flush=True)
    prov = provenance.collect(argv)
    names = list(dict.fromkeys(n for r in rows for n in r["launch_ms"]))  # every run's launches (kside_parts=2: two k-side launches)
    lines = [f"# Stage 2's launches under tile plans, one by one (shape {shape})", "", provenance.markdown_header(prov),
             ""] + (["**Smoke run (CPU): checks that the script runs; not a benchmark.**", ""] if a.smoke else []) + (
             [f"**Source:** {a.note}", ""] if a.note else []) + [
             f"Policy `{POLICY}`. `slice ms`: the launches of one batch slice, each timed alone "
             f"(`triton.testing.do_bench`, rep {a.rep_ms:g} ms; {rows[0]['slices']} slices at this shape); `bits`: "
             "every output against the first run's. Runs: a plan (`parse_stage2_plan`), `/KERNEL=N` a register cap.",
             "", "| run | slice ms | " + " | ".join(names) + " | bits |", "|---|---:|" + "---:|" * len(names) + "---|"]
    lines += [f"| `{r['run']}` | {r['slice_ms']:.3f} | " + " | ".join(
        f"{r['launch_ms'][n]:.3f}" if n in r["launch_ms"] else "-" for n in names) + f" | {r['bits']} |" for r in rows]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"stage2_launches_{shape}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(dict(rows=rows, shape=shape, provenance=prov), indent=1,
                                                    default=str))
    print(f"wrote {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
