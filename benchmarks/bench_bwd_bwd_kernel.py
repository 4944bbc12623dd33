"""Benchmark the stage-2 Triton kernels ``kernels.mamba_mimo_bwd_bwd`` on a CUDA GPU against upstream's TileLang
stage 2 and the stage-2 reference, side by side in one run.

    python benchmarks/bench_bwd_bwd_kernel.py            # shapes a, d, t -> reports/bench/<date>_<sha>_bwd_bwd_kernel.*
    python benchmarks/bench_bwd_bwd_kernel.py --smoke    # CPU dry run of the script itself (not a benchmark)

Inputs per shape: stage 1's inputs of ``benchmark_cases.kernel_shape`` and its ``states``/``qk_dot`` from the
stage-1 reference under ``upstream_sm90``, computed on the GPU. Per shape it first gates (kernels vs the stage-2
reference on the GPU under the same policy, every output within ``tolerances.same_policy_rel_rms``, no NaN after a
poisoned launch; a red gate is reported and not timed) and compares dq, dk, dv with upstream's (rel RMS, for
information). Then: the median of ``triton.testing.do_bench`` over the launches built once (kernel only) and over the
whole call; each launch alone; the device time of one call by ``torch.profiler``; upstream's ``mamba_mimo_bwd_bwd``
kernel (TileLang 0.1.8, compiled by an untimed first call; device time by ``torch.profiler``, its zero-filled
buffers excluded); the reference on the GPU. Bandwidth: the bytes the shape must move (every input read once, every
output written once) over the launches' time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import mimo_numerics as mn  # noqa: E402
from bench_fwd_kernel import device_ms  # noqa: E402  (benchmarks/ is on sys.path)
from mimo_numerics import kernels, provenance, tolerances  # noqa: E402
from mimo_numerics.benchmark_cases import kernel_shape  # noqa: E402
from mimo_numerics.kernels import mimo_bwd_bwd  # noqa: E402
from mimo_numerics.metrics import rel_rms  # noqa: E402
from mimo_numerics.ops.mamba3_mimo import upstream as op_upstream  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd as stage2_reference  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES, OUTPUT_NAMES  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference  # noqa: E402
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES as STAGE1_INPUT_NAMES  # noqa: E402

GATE_RTOL = tolerances.get("same_policy_rel_rms")
POLICIES = ("upstream_sm90", "fp32")


def stage2_inputs(spec, dev) -> dict:
    """Stage 2's 19 tensors for ``spec`` on ``dev``: stage 1's inputs, and its states and qk_dot computed there."""
    raw = stage1_cases.make_inputs(spec)
    x = {n: (v.to(dev) if isinstance(v, torch.Tensor) else v) for n, v in raw.items()}
    s1 = stage1_reference.mamba_mimo_bwd_fwd(*[x[n] for n in STAGE1_INPUT_NAMES], chunk_size=x["chunk_size"],
                                             rotary_dim_divisor=x["rotary_dim_divisor"], policy="upstream_sm90")
    x["states"], x["qk_dot"] = s1.states, s1.qk_dot
    return x


def _args(x: dict) -> list:
    return [x[n] for n in INPUT_NAMES]


def _kw(x: dict) -> dict:
    return dict(chunk_size=x["chunk_size"], rotary_dim_divisor=x["rotary_dim_divisor"])


def bytes_moved(x: dict, out) -> int:
    """Every input tensor read once and every output written once."""
    tensors = [t for t in _args(x) if t is not None] + [getattr(out, n) for n in OUTPUT_NAMES
                                                         if getattr(out, n) is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_shape(shape: str, do_bench, rep: int, with_upstream: bool, with_reference: bool) -> dict:
    spec = kernel_shape(shape)
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    x = stage2_inputs(spec, dev)
    row = {"shape": shape, "case": spec.case_id}
    outputs = {}
    for policy in POLICIES:
        pol = mn.presets.get(policy)
        got = kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy=pol, poison=True,
                                         allow_slow_interpreter=True)
        ref = stage2_reference(*_args(x), **_kw(x), policy=pol)
        errs = {n: rel_rms(getattr(got, n).float(), getattr(ref, n).float()) for n in OUTPUT_NAMES
                if getattr(ref, n) is not None}
        nan = any(torch.isnan(getattr(got, n).float()).any().item() for n in errs)
        ok = max(errs.values()) <= GATE_RTOL and not nan
        cell = {"gate_rel_rms": max(errs.values()), "gate_worst": max(errs, key=errs.get), "gate_ok": ok,
                "bytes": bytes_moved(x, got)}
        if ok:
            def call():
                return kernels.mamba_mimo_bwd_bwd(*_args(x), **_kw(x), policy=pol, allow_slow_interpreter=True)

            cell["ms"] = do_bench(call, rep=rep)
            prep = mimo_bwd_bwd.build_launches(*_args(x), **_kw(x), policy=pol)
            cell["launches_ms"] = do_bench(lambda: [la.run() for la in prep.launches], rep=rep)
            cell["gbps"] = cell["bytes"] / (cell["launches_ms"] * 1e-3) / 1e9
            cell["launch_ms"] = {la.name: do_bench(la.run, rep=rep) for la in prep.launches}
            if dev.type == "cuda":
                cell.update(device_ms(call))
        if with_reference and policy == "upstream_sm90":
            row["reference_ms"] = do_bench(lambda: stage2_reference(*_args(x), **_kw(x), policy=pol), rep=rep)
        row[policy] = cell
        outputs[policy] = got
    if with_upstream:
        try:
            up = op_upstream.run_stage2(*_args(x), **_kw(x), poison=False)
            run = lambda: op_upstream.run_stage2(*_args(x), **_kw(x), poison=False)  # noqa: E731
            row["upstream_wall_ms"] = do_bench(run, rep=rep)
            # device time of the kernel alone: the profiler's events minus the zero fills of its buffers
            from torch.profiler import ProfilerActivity, profile

            run()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    run()
                torch.cuda.synchronize()
            ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and "Fill" not in e.name]
            row["upstream_kernel_names"] = sorted({e.name[:80] for e in ev})
            row["upstream_ms"] = sum(e.time_range.elapsed_us() for e in ev) / 1e3 / 10
            for policy in POLICIES:
                row[policy]["vs_upstream_rel_rms"] = {
                    n: rel_rms(getattr(outputs[policy], n).float(), getattr(up, n).float()) for n in ("dq", "dk", "dv")}
        except Exception as exc:  # no TileLang / mamba-ssm source, or not on CUDA: reported, not fatal
            row["upstream_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return row


def markdown(rows: list, meta: dict) -> str:
    lines = ["# Stage-2 kernels `mamba_mimo_bwd_bwd`: Triton vs upstream TileLang vs the reference", "",
             provenance.markdown_header(meta["provenance"]) + f" {meta['date']}.", "",
             ("**Smoke run: checks that the script runs; not a benchmark.** " if meta["smoke"] else "")
             + "Each configuration gated first (kernels vs the stage-2 reference on the GPU, same policy, every output "
             f"rel RMS <= {GATE_RTOL:g}, poisoned launch). `launches ms`: median of `triton.testing.do_bench` over the "
             "call's launches, built once (kernel only); `call ms`: the whole call `kernels.mamba_mimo_bwd_bwd(...)` "
             "(validation, buffers, launches); `device ms`: the summed GPU time of one call by `torch.profiler`. "
             "Upstream: `mamba_mimo_bwd_bwd` of mamba-ssm 2.3.2.post1 (TileLang 0.1.8, compiled by an untimed first "
             "call), its kernel's GPU time by `torch.profiler` (the zero fills of its buffers excluded). GB/s: bytes "
             "the shape must move (inputs once, outputs once) over `launches ms` (H200 copy rate ~4,300 GB/s). "
             "Speed-up: upstream's kernel ms over our launches ms.", "",
             "| shape | Triton upstream_sm90 launches ms | call ms | device ms | GB/s | Triton fp32 launches ms | "
             "upstream kernel ms | reference (GPU) ms | speed-up | gate rel RMS (worst output) | "
             "vs upstream rel RMS dq / dk / dv (upstream_sm90) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(v):
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        a, f = r["upstream_sm90"], r["fp32"]
        up = r.get("upstream_ms")
        speed = f"{up / a['launches_ms']:.2f}x" if up and a.get("launches_ms") else "-"
        vs = a.get("vs_upstream_rel_rms")
        vs = " / ".join(f"{vs[n]:.1e}" for n in ("dq", "dk", "dv")) if vs else "-"
        lines.append(f"| {r['shape']} `{r['case']}` | {ms(a.get('launches_ms'))} | {ms(a.get('ms'))} | "
                     f"{ms(a.get('device_ms'))} | {a.get('gbps', 0):.0f} | {ms(f.get('launches_ms'))} | "
                     f"{ms(up) if up else r.get('upstream_error', 'not run')[:60]} | {ms(r.get('reference_ms'))} | "
                     f"{speed} | {a['gate_rel_rms']:.1e} ({a['gate_worst']}) | {vs} |")
    lines += ["", "Per launch (upstream_sm90, ms): " + "; ".join(
        f"{r['shape']}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["upstream_sm90"].get("launch_ms", {}).items())
        for r in rows) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="a,d,t")
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--no-reference-timing", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU dry run on a tiny shape (not a benchmark)")
    ap.add_argument("--out", default=os.path.join(ROOT, "reports", "bench"))
    args = ap.parse_args(argv)
    if args.smoke:
        shapes = ["s"]

        def do_bench(fn, rep=1):  # CPU stand-in: one timed call
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
    else:
        from triton.testing import do_bench

        shapes = args.shapes.split(",")
    rows = []
    for shape in shapes:
        rows.append(bench_shape(shape, do_bench, args.rep, with_upstream=not (args.no_upstream or args.smoke),
                                with_reference=not args.no_reference_timing))
        print(json.dumps(rows[-1], default=str), flush=True)
    meta = {"provenance": provenance.collect(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "smoke": args.smoke,
            "rows": rows, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    sha = meta["provenance"].get("commit", "nogit")[:7]
    stem = os.path.join(args.out, f"{stamp}_{sha}_bwd_bwd_kernel" + ("_smoke" if args.smoke else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w") as fh:
        json.dump(meta, fh, indent=1, default=str)
    with open(stem + ".md", "w") as fh:
        fh.write(markdown(rows, meta))
    print(f"wrote {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
