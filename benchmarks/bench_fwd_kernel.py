"""Benchmark the forward Triton kernel ``kernels.mamba_mimo_fwd`` on a CUDA GPU against upstream's TileLang forward
and the forward reference, side by side in one run.

    python benchmarks/bench_fwd_kernel.py                   # shapes a, d, t -> reports/bench/<date>_<sha>_fwd_kernel.*
    python benchmarks/bench_fwd_kernel.py --compile-time    # and the first-call time of a new policy, whole chain
    python benchmarks/bench_fwd_kernel.py --smoke           # CPU dry run of the script itself (not a benchmark)

Per shape it first gates (kernel vs the reference on the GPU under the same policy, rel RMS <=
``tolerances.same_policy_rel_rms`` and no NaN after a poisoned launch; a red gate is reported and not timed) and
compares with upstream's output (rel RMS, for information). Then the median of ``triton.testing.do_bench`` for: the
kernel under ``upstream_sm90`` and ``fp32``, each of its launches alone (angles, prep, state walk, output kernel),
upstream's ``mamba_mimo_forward`` (TileLang, kernel only: compiled by a first call that is not timed; its call
allocates the output), and the reference on the GPU. Bandwidth: the bytes the shape must move (every input read once,
the output written once) over the median time. ``--compile-time`` runs, in a fresh process with an empty Triton cache,
one forward + backward of ``mn.mamba3_mimo(backend="triton")`` under a policy no earlier call used, and reports the
first call's time minus a warm call's (the kernels' compile time for that policy, whole chain).

Shapes (Z, D, reduced output, G=1, P=64, R=4, C=16, realistic formula): (a) B=1, S=8192, H=16, N=64; (d) B=8,
S=4096, H=32, N=64; (t) upstream's tuned shape B=1, S=2048, H=32, N=128.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import mimo_numerics as mn  # noqa: E402
from mimo_numerics import kernels, provenance, tolerances  # noqa: E402
from mimo_numerics.benchmark_cases import kernel_shape  # noqa: E402
from mimo_numerics.kernels import mimo_fwd  # noqa: E402
from mimo_numerics.metrics import rel_rms  # noqa: E402
from mimo_numerics.ops.mamba3_mimo import upstream as op_upstream  # noqa: E402
from mimo_numerics.ops.mamba_mimo_fwd.cases import make_inputs  # noqa: E402
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd as forward_reference  # noqa: E402
from mimo_numerics.ops.mamba_mimo_fwd.spec import INPUT_NAMES  # noqa: E402

GATE_RTOL = tolerances.get("same_policy_rel_rms")
PEAK_BW = 4.3e12
POLICIES = ("upstream_sm90", "fp32")


def _args(x: dict) -> list:
    return [x[n] for n in INPUT_NAMES]


def _kw(x: dict) -> dict:
    return dict(chunk_size=x["chunk_size"], rotary_dim_divisor=x["rotary_dim_divisor"])


def bytes_moved(x: dict, out: torch.Tensor) -> int:
    """Every input tensor read once and the output written once."""
    return sum(t.numel() * t.element_size() for t in _args(x) if t is not None) + out.numel() * out.element_size()


def device_ms(fn, calls: int = 10) -> dict:
    """Device time per call of ``fn`` by ``torch.profiler`` (the summed durations of the GPU kernels it launches,
    copies included; host work excluded: for upstream's forward, whose every call goes through TileLang's kernel
    cache lookup on the host, this is its kernel-only time), and the kernels per call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"device_ms": sum(e.time_range.elapsed_us() for e in events) / 1e3 / calls,
            "kernels": len(events) / calls}


def bench_shape(shape: str, do_bench, rep: int, with_upstream: bool, with_reference: bool) -> dict:
    spec = kernel_shape(shape)
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    x = make_inputs(spec, dev)
    row = {"shape": shape, "case": spec.case_id}
    for policy in POLICIES:
        got = kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy=policy, poison=True).o
        ref = forward_reference(*_args(x), **_kw(x), policy=policy).o
        err = rel_rms(got.float(), ref.float())
        ok = err <= GATE_RTOL and not torch.isnan(got.float()).any().item()
        cell = {"gate_rel_rms": err, "gate_ok": ok, "bytes": bytes_moved(x, got)}
        if ok:
            pol = mn.presets.get(policy)
            cell["ms"] = do_bench(lambda: kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy=pol), rep=rep)
            prep = mimo_fwd.build_launches(*_args(x), **_kw(x), policy=pol)
            cell["launches_ms"] = do_bench(lambda: [la.run() for la in prep.launches], rep=rep)
            cell["gbps"] = cell["bytes"] / (cell["launches_ms"] * 1e-3) / 1e9
            cell["launch_ms"] = {la.name: do_bench(la.run, rep=rep) for la in prep.launches}
            if dev.type == "cuda":
                cell.update(device_ms(lambda: kernels.mamba_mimo_fwd(*_args(x), **_kw(x), policy=pol)))
                start = time.perf_counter()
                for _ in range(20):
                    mimo_fwd.build_launches(*_args(x), **_kw(x), policy=pol)
                cell["host_build_ms"] = (time.perf_counter() - start) / 20 * 1e3
        if with_reference and policy == "upstream_sm90":
            row["reference_ms"] = do_bench(lambda: forward_reference(*_args(x), **_kw(x), policy=policy), rep=rep)
        row[policy] = cell
        row.setdefault("outputs", {})[policy] = got
    if with_upstream:
        try:
            up = op_upstream.run_forward(*_args(x), **_kw(x)).o
            row["upstream_wall_ms"] = do_bench(lambda: op_upstream.run_forward(*_args(x), **_kw(x)), rep=rep)
            dm = device_ms(lambda: op_upstream.run_forward(*_args(x), **_kw(x)))
            row["upstream_ms"], row["upstream_kernels"] = dm["device_ms"], dm["kernels"]
            for policy in POLICIES:
                row[policy]["vs_upstream_rel_rms"] = rel_rms(row["outputs"][policy].float(), up.float())
        except Exception as exc:  # no TileLang / mamba-ssm source, or not on CUDA: reported, not fatal
            row["upstream_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    row.pop("outputs")
    return row


def compile_time_worker() -> None:
    """In this (fresh) process: the whole op on kernels under a policy no earlier call used; first call − warm."""
    import warnings

    from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs

    warnings.simplefilter("ignore")
    raw = make_op_inputs(OpCaseSpec(batch=1, seqlen=2048, heads=4, groups=1, state_dim=64, value_dim=64, rank=4,
                                    chunk_size=16))
    dev = torch.device("cuda")
    names = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out", "Angles", "D",
             "Z")
    # a variant no preset compiles: one forward and one stage-1 site off
    policy = (mn.presets.get("upstream_sm90").with_sites("mamba_mimo_fwd", out_accum=False)
              .with_sites("mamba_mimo_bwd_fwd", dz_accum=False))
    times = []
    for _ in range(2):
        leaves = [None if raw[n] is None else raw[n].to(dev).requires_grad_(True) for n in names]
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = mn.mamba3_mimo(*leaves, chunk_size=16, rotary_dim_divisor=4, policy=policy, backend="triton")
        out.backward(raw["dout"].to(dev))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    print("RESULT " + json.dumps({"first_s": times[0], "warm_s": times[1], "compile_s": times[0] - times[1]}))


def compile_time() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--compile-time-worker"], env=env,
                              capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def markdown(rows: list, meta: dict) -> str:
    lines = ["# Forward kernel `mamba_mimo_fwd`: Triton vs upstream TileLang vs the reference", "",
             provenance.markdown_header(meta["provenance"]) + f" {meta['date']}.", "",
             ("**Smoke run: checks that the script runs; not a benchmark.** " if meta["smoke"] else "")
             + "Each configuration gated first (kernel vs the reference on the GPU, same policy, rel RMS <= "
             f"{GATE_RTOL:g}, poisoned launch). `launches ms`: median of `triton.testing.do_bench` over the call's "
             "four launches, built once (kernel only); `call ms`: the same for the whole call "
             "`kernels.mamba_mimo_fwd(...)` (validation, buffers, launch configuration and launches: host work "
             "included); `device ms`: the summed GPU time of one call's kernels by `torch.profiler`. Upstream: "
             "`mamba_mimo_forward` of mamba-ssm 2.3.2.post1 (TileLang, compiled by an untimed first call), its "
             "kernel's GPU time by `torch.profiler` (kernel only; its every call also looks the kernel up in "
             "TileLang's cache on the host: `upstream call ms`). GB/s: bytes the shape must move (inputs once, "
             "output once) over `launches ms` (H200 copy rate ~4,300 GB/s). Speed-up: upstream's kernel ms over "
             "ours.", "",
             "| shape | Triton upstream_sm90 launches ms | call ms | device ms | GB/s | Triton fp32 launches ms | "
             "upstream kernel ms | upstream call ms | reference (GPU) ms | speed-up | gate rel RMS | "
             "vs upstream rel RMS (upstream_sm90 / fp32) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(v):
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        a, f = r["upstream_sm90"], r["fp32"]
        up = r.get("upstream_ms")
        speed = f"{up / a['launches_ms']:.1f}x" if up and a.get("launches_ms") else "-"
        vs = " / ".join(f"{r[p].get('vs_upstream_rel_rms', float('nan')):.1e}" for p in POLICIES)
        lines.append(f"| {r['shape']} `{r['case']}` | {ms(a.get('launches_ms'))} | {ms(a.get('ms'))} | "
                     f"{ms(a.get('device_ms'))} | {a.get('gbps', 0):.0f} | {ms(f.get('launches_ms'))} | "
                     f"{ms(up) if up else r.get('upstream_error', 'not run')[:60]} | {ms(r.get('upstream_wall_ms'))} | "
                     f"{ms(r.get('reference_ms'))} | {speed} | {a['gate_rel_rms']:.1e} | {vs} |")
    lines += ["", "Host time of `build_launches` (validation, buffers, configuration), ms: " + "; ".join(
        f"{r['shape']} {r['upstream_sm90'].get('host_build_ms', float('nan')):.2f}" for r in rows) + ".",
        "", "Per launch (upstream_sm90, ms): " + "; ".join(
        f"{r['shape']}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["upstream_sm90"].get("launch_ms", {}).items())
        for r in rows) + "."]
    if meta.get("compile_time"):
        ct = meta["compile_time"]
        lines += ["", "First call of a new policy, whole chain (`mn.mamba3_mimo(backend='triton')` forward + backward, "
                  "B=1, S=2048, H=4, N=P=64, R=4, C=16, empty Triton cache, fresh process): "
                  + (f"first {ct['first_s']:.1f} s, warm {ct['warm_s']:.2f} s, compile ~{ct['compile_s']:.1f} s."
                     if "first_s" in ct else f"failed: {ct['error']}")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="a,d,t")
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--no-reference-timing", action="store_true")
    ap.add_argument("--compile-time", action="store_true")
    ap.add_argument("--compile-time-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run on a tiny shape (not a benchmark)")
    ap.add_argument("--out", default=os.path.join(ROOT, "reports", "bench"))
    args = ap.parse_args(argv)
    if args.compile_time_worker:
        compile_time_worker()
        return 0
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
        print(json.dumps({k: v for k, v in rows[-1].items()}, default=str), flush=True)
    meta = {"provenance": provenance.collect(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "smoke": args.smoke,
            "rows": rows, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    if args.compile_time and not args.smoke:
        meta["compile_time"] = compile_time()
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    sha = meta["provenance"].get("commit", "nogit")[:7]
    stem = os.path.join(args.out, f"{stamp}_{sha}_fwd_kernel" + ("_smoke" if args.smoke else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w") as fh:
        json.dump(meta, fh, indent=1, default=str)
    with open(stem + ".md", "w") as fh:
        fh.write(markdown(rows, meta))
    print(f"wrote {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
