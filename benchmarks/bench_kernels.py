"""Benchmark the Triton ``mamba_mimo_bwd_fwd`` kernels on a CUDA GPU (one command, compact tables).

    python benchmarks/bench_kernels.py                 # shapes a-d, writes reports/bench/<date>_<sha>_kernels.{md,json}
    python benchmarks/bench_kernels.py --shapes a --variants default,emulated,rbk2,k3w4,bp3_32,k2w4s3,k2s8

For every shape it first checks correctness (kernel vs reference under the same policy, rel RMS <=
``tolerances.same_policy_rel_rms`` on every output, no NaN after a poisoned launch) and refuses to time a configuration whose gate is red. Then it reports the
median of ``triton.testing.do_bench`` for: the Triton kernels under ``upstream_sm90`` (each tuning variant) and
``seed_bf16``, the PyTorch reference on CUDA under ``upstream_sm90``, and the upstream TileLang kernel
(``mimo_numerics.upstream``, timed in the same run when TileLang and the mamba-ssm source are available, e.g. after
``. scripts/use_upstream_wheels.sh``; otherwise "not run" with its H200 figures of an earlier session (:data:`UPSTREAM_MS`);
its call includes allocating its outputs, which the performance notes measured at 0.1 %). Bandwidth is the bytes
the shape must move (every input read once, every output written once) over the median time, against ~4.3 TB/s.
A per-kernel breakdown (prep, state walk, out, reduce) is timed too.

Shapes (D, Z and reduced DOUT on; G=1, P=64, R=4, C=16): (a) B=1, S=8192, H=16, N=64 (target <= 0.33 ms under
upstream_sm90; upstream TileLang 6.63 ms); (b) B=4, S=2048, H=16, N=64; (c) B=1, S=8192, H=16, N=128; (d) B=8, S=4096,
H=32, N=64.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import mimo_numerics as mn
from mimo_numerics import kernels, provenance, tolerances
from mimo_numerics.ops.mamba_mimo_bwd_fwd import upstream
from mimo_numerics.metrics import rel_rms
from mimo_numerics.benchmark_cases import KERNEL_SHAPES, kernel_shape
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.kernels import mimo_bwd_fwd
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import OUTPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

PEAK_BW = 4.3e12
#: The gate before timing: kernels vs reference within the same-policy tolerance.
GATE_RTOL = tolerances.get("same_policy_rel_rms")
#: The shapes (``mimo_numerics.benchmark_cases.KERNEL_SHAPES``; "s" is the --smoke shape).
SHAPES = KERNEL_SHAPES
#: upstream TileLang on an H200, two runs of an earlier session (its notes are not in this repository); not run by
#: this script, printed as recorded
UPSTREAM_MS = {"a": "6.63, 6.72", "b": "1.75, 1.78", "c": "9.91, 10.07", "d": "3.85, 3.89"}
#: tuning variants of the upstream_sm90 kernels (the ``tuning=`` overrides of one call, keys
#: ``kernels.TUNING_KEYS``; none changes numerics)
VARIANTS = {
    "default": {},
    "emulated": {"native_lp": 0},
    # session 5 (reports/bench/history/20261130_02*, reports/bench/20261130_023552*); those runs also used the names
    # walk32w2 = st32x32w2, walk32x16w2 = st32x16w2, k3_r168 = pa_r168, k3_s2 = k3s2, walk_s8 = k2s8 (the same
    # settings, listed below)
    "walk32": {"BN": 32, "BP2": 32},
    "rbk2_w8": {"RBK": 2, "warps_k3": 8},
    "walk_psiv_ws": {"walk_psiv_from_v": 0},
    "prep_rb32w4": {"RB": 32, "warps_k1": 4},
    "prep_rb64w4": {"RB": 64, "warps_k1": 4},
    "prep_rb64w4_gemm": {"RB": 64, "warps_k1": 4, "qk_gemm": 1},
    "prep_rb64w8": {"RB": 64, "warps_k1": 8},
    "walk32x16w1": {"BN": 32, "BP2": 16, "warps_k2": 1},
    "k3w4_r128": {"warps_k3": 4, "maxnreg_k3": 128},
    "k3w4_r120": {"warps_k3": 4, "maxnreg_k3": 120},
    "k3w4_r112": {"warps_k3": 4, "maxnreg_k3": 112},
    "k3w8": {"warps_k3": 8},
    "k3w8_r80": {"warps_k3": 8, "maxnreg_k3": 80},
    "rbk4_w4": {"RBK": 4, "warps_k3": 4},
    "rbk2_w4": {"RBK": 2, "warps_k3": 4},
    "rbk2_w2": {"RBK": 2, "warps_k3": 2},
    "rbk1_w4": {"RBK": 1, "warps_k3": 4},
    "rbk1_w2": {"RBK": 1, "warps_k3": 2},
    "rbk1_w1": {"RBK": 1, "warps_k3": 1},
    "rbk1_w2_k1w4": {"RBK": 1, "warps_k3": 2, "warps_k1": 4},
    "rbk1_w2_k1w2": {"RBK": 1, "warps_k3": 2, "warps_k1": 2},
    "rbk1_w2_rb16w2": {"RBK": 1, "warps_k3": 2, "RB": 16, "warps_k1": 2},
    "rbk1_w2_rb32w4": {"RBK": 1, "warps_k3": 2, "RB": 32, "warps_k1": 4},
    "k2s8": {"stages_k2": 8},
    "no_kt_load": {"kt_load": 0},
    "bn32": {"BN": 32},
    "s1": {"stages_k2": 1},
    "cbr128": {"CBR": 128},
    "cbr256": {"CBR": 256},
    "cbr256_blkr16": {"CBR": 256, "BLKR": 16},
    # pa_*: measured when storing the dmimo partials after the rank loop was a switch (it is the only form now)
    "pa_k3w4": {"warps_k3": 4},
    "cb64": {"CB": 64},
    "cb512": {"CB": 512},
    "pa_r168": {"maxnreg_k3": 168},
    "pa_r128": {"maxnreg_k3": 128},
    "pa_k1w4": {"warps_k1": 4},
    "pa_k3w4_k1w4": {"warps_k3": 4, "warps_k1": 4},
    "da_cb64": {"CB": 64},
    "da_cb128": {"CB": 128},
    "da_cb64_s4": {"CB": 64, "stages_k2": 4},
    "da_cb64_s6": {"CB": 64, "stages_k2": 6},
    # output kernel: software-pipelined rank loop, P tile 32, 4 warps
    "k3s2": {"stages_k3": 2},
    "k3s3": {"stages_k3": 3},
    "bp3_32": {"BP3": 32},
    "bp3_32_k3s2": {"BP3": 32, "stages_k3": 2},
    "k3w4": {"warps_k3": 4},
    "rcp0": {"rcp_approx": 0},
    # state walk tiles (N × P per program, warps) and pipeline depth
    "st16x32": {"BN": 16, "BP2": 32, "warps_k2": 1},
    "st32x32w2": {"BN": 32, "BP2": 32, "warps_k2": 2},
    "st32x16w2": {"BN": 32, "BP2": 16, "warps_k2": 2},
    "st16x64w2": {"BN": 16, "BP2": 64, "warps_k2": 2},
    "st_s2": {"stages_k2": 2},
    "st_s6": {"stages_k2": 6},
    # measured at 76f4de7 (gate_split: the gradient branches in a kernel of their own; removed, slower in all)
    "pa_r168_now": {"maxnreg_k3": 168},
    "rbk4w4": {"RBK": 4, "warps_k3": 4},
    "rbk2w4": {"RBK": 2, "warps_k3": 4},
    "rbk2w2": {"RBK": 2, "warps_k3": 2},
    "one_dot0": {"state_one_dot": 0},
    "st_s4": {"stages_k2": 4},
    "st_s8": {"stages_k2": 8},
    "cb16": {"CB": 16},
}


spec_of = kernel_shape


def bytes_moved(x: dict, out) -> int:
    ins = sum(t.numel() * t.element_size() for t in as_args(x) if t is not None)
    outs = sum(t.numel() * t.element_size() for t in out if t is not None)
    return ins + outs


def gate(out, ref) -> dict:
    errs = {}
    for n in OUTPUT_NAMES:
        a, b = getattr(out, n), getattr(ref, n)
        if b is None:
            continue
        if torch.isnan(a.float()).any():
            errs[n] = float("nan")
        else:
            errs[n] = rel_rms(a.float(), b.float())
    return errs


def ok(errs: dict) -> bool:
    return all(v == v and v <= GATE_RTOL for v in errs.values())


def main(argv=None) -> int:
    import triton
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="a,b,c,d")
    ap.add_argument("--variants", default="default,emulated",
                    help=f"tuning variants of the upstream_sm90 kernels, from {list(VARIANTS)} (each compiles anew)")
    ap.add_argument("--no-reference-timing", action="store_true", help="skip timing the PyTorch reference")
    ap.add_argument("--commit", default=None, help="commit to record (machines without .git)")
    ap.add_argument("--no-upstream", action="store_true", help="do not time the upstream TileLang kernel")
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms) for the kernels")
    ap.add_argument("--out", default=os.path.join(ROOT, "reports", "bench"))
    ap.add_argument("--smoke", action="store_true",
                    help="exercise this script on CPU (Triton interpreter, one tiny shape, wall-clock timer)")
    args = ap.parse_args(argv)
    if args.smoke:
        import time

        def do_bench(fn, warmup=1, rep=1, return_mode="median"):  # noqa: F811 - CPU stand-in
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3

        UPSTREAM_MS["s"] = "-"
        for key in list(VARIANTS):
            VARIANTS[key] = {k: v for k, v in VARIANTS[key].items() if k in ("BP3",)}
        args.shapes, args.variants = "s", "default,emulated"
        args.out = os.path.join(args.out, "smoke")
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (or --smoke for a CPU dry run)", file=sys.stderr)
        return 2
    else:
        dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter, --smoke)"
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"unknown --variants {unknown}; known: {list(VARIANTS)}", file=sys.stderr)
        return 2
    up_ok, up_why = (False, "--no-upstream") if args.no_upstream or dev.type != "cuda" else upstream.availability()
    print(f"upstream TileLang: {'timed in this run' if up_ok else 'not run: ' + up_why}")
    rows, breakdown, failures = [], [], []
    prov = provenance.collect()
    if args.commit:  # a machine without .git
        prov.update(commit=args.commit, describe=args.commit)
    commit = prov["commit"]
    print(f"GPU {gpu} | torch {torch.__version__} | triton {triton.__version__} | commit {commit}")
    for shape in args.shapes.split(","):
        spec = spec_of(shape)
        x = make_inputs(spec, device=dev)
        row = {"shape": shape, "case": spec.case_id, "upstream_tilelang_ms": f"not run (H200: {UPSTREAM_MS[shape]})"}
        if up_ok:
            try:
                upstream.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), poison=False)  # compile and warm up
                torch.cuda.synchronize()
                ms = do_bench(lambda: upstream.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), poison=False),
                              rep=args.rep, return_mode="median")
                row["upstream_tilelang_ms"] = f"{ms:.3f}"
                row["upstream_tilelang_ms_value"] = ms
                print(f"[{shape}] upstream TileLang                  {ms:8.3f} ms")
            except Exception as exc:  # an upstream refusal or compile failure is reported, not fatal
                row["upstream_tilelang_ms"] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
                print(f"[{shape}] upstream TileLang failed: {exc}")
        refs = {p: stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=p)
                for p in ("upstream_sm90", "seed_bf16")}
        row["bytes"] = bytes_moved(x, refs["upstream_sm90"])
        runs = [("upstream_sm90", v, VARIANTS[v]) for v in variants] + [("seed_bf16", "default", {})]
        for preset, vname, tuning in runs:
            key = f"triton_{preset}" + ("" if vname == "default" else f"[{vname}]")
            out = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=preset, poison=True, tuning=tuning)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            errs = gate(out, refs[preset])
            row[key + "_gate"] = errs
            if not ok(errs):
                failures.append((shape, key, errs))
                row[key + "_ms"] = None
                print(f"[{shape}] {key}: GATE FAILED {errs} -> not timed")
                continue
            prep = mimo_bwd_fwd.build_launches(*as_args(x), **as_kwargs(x), policy=preset, tuning=tuning)

            def run_all(prep=prep):
                for launch in prep.launches:
                    launch.run()

            ms = do_bench(run_all, rep=args.rep, return_mode="median")
            row[key + "_ms"] = ms
            print(f"[{shape}] {key:34s} {ms:8.3f} ms  {row['bytes'] / ms / 1e6:7.0f} GB/s  "
                  f"max gate err {max(errs.values()):.1e}")
            if vname == "default" or preset == "upstream_sm90":
                for launch in prep.launches:
                    kms = do_bench(launch.run, rep=max(20, args.rep // 4), return_mode="median")
                    breakdown.append({"shape": shape, "config": key, "kernel": launch.name, "grid": launch.grid,
                                      "ms": kms})
        if not args.no_reference_timing:
            row["reference_upstream_sm90_ms"] = do_bench(
                lambda: stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy="upstream_sm90"),
                warmup=1, rep=1, return_mode="median")
            print(f"[{shape}] reference (torch, CUDA) upstream_sm90  {row['reference_upstream_sm90_ms']:8.1f} ms")
        rows.append(row)
        del x, refs
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    # ---- report
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    meta = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "commit": commit, "provenance": prov,
            "peak_bw_tb_s": PEAK_BW / 1e12, "gate_rtol": GATE_RTOL, "date": stamp, "variants": variants}
    ukeys = [k for k in rows[0] if k.startswith("triton_") and k.endswith("_ms")]
    lines = [f"# Triton mamba_mimo_bwd_fwd benchmark ({stamp})", "",
             provenance.markdown_header(prov), "",
             f"GPU: {gpu}; torch {torch.__version__}; triton {triton.__version__}; commit {meta['commit']}. "
             "Median of triton.testing.do_bench (ms), kernels only (outputs allocated once per call inside "
             f"build_launches is excluded). Gate: kernel vs reference rel RMS <= {GATE_RTOL:g} "
             "(`tolerances.same_policy_rel_rms`) before timing.", "",
             "| shape | MB moved | " + " | ".join(k[:-3] for k in ukeys) + " | reference (CUDA, upstream_sm90) | "
             "upstream TileLang | best BW (of ~4.3 TB/s) |",
             "|---|---|" + "---|" * len(ukeys) + "---|---|---|"]
    for row in rows:
        times = [row.get(k) for k in ukeys]
        best = min([t for t in times if t], default=None)
        cells = [f"{t:.3f}" if t else "gate failed" for t in times]
        ref = row.get("reference_upstream_sm90_ms")
        ref_cell = f"{ref:.1f}" if ref else "not timed"
        # bytes / (ms · 1e-3 s) = bytes/s; GB/s = bytes / ms / 1e6
        bw_cell = (f"{row['bytes'] / best / 1e6:.0f} GB/s ({row['bytes'] / best * 1e3 / PEAK_BW:.1%})"
                   if best else "-")
        lines.append(f"| {row['shape']} | {row['bytes'] / 1e6:.0f} | " + " | ".join(cells)
                     + f" | {ref_cell} | {row['upstream_tilelang_ms']} | {bw_cell} |")
    lines += ["", "Per-kernel breakdown (ms):", "", "| shape | config | kernel | grid | ms |", "|---|---|---|---|---|"]
    lines += [f"| {b['shape']} | {b['config']} | {b['kernel']} | {b['grid']} | {b['ms']:.3f} |" for b in breakdown]
    if failures:
        lines += ["", "GATE FAILURES (not timed):"] + [f"- {s} {k}: {e}" for s, k, e in failures]
    md = "\n".join(lines) + "\n"
    base = os.path.join(args.out, f"{stamp}_{meta['commit']}_kernels")
    with open(base + ".md", "w", encoding="utf-8") as fh:
        fh.write(md)
    with open(base + ".json", "w", encoding="utf-8") as fh:
        json.dump({"meta": meta, "rows": rows, "breakdown": breakdown,
                   "failures": [{"shape": s, "config": k, "errors": e} for s, k, e in failures]}, fh, indent=2)
    print()
    print(md)
    print(f"wrote {base}.md and {base}.json")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
