#!/usr/bin/env python
"""The whole op's policy reference, forward + backward: wall time, device kernels per call and peak memory.

    python benchmarks/bench_whole_op.py --device cuda                     # shape (a), upstream_sm90 and fp32
    python benchmarks/bench_whole_op.py --device cuda --baseline 284c9ec  # and that commit's package, same session
    python benchmarks/bench_whole_op.py --device cpu --shape cpu          # B=1, S=2048, H=8 on CPU

Shapes (``G=1, N=P=64, R=4, C=16``, reduced DOUT, Z, D, the ``whole_op`` formula): ``a`` B=1, S=8192, H=16;
``d`` B=8, S=4096, H=32; ``cpu`` B=1, S=2048, H=8; ``smoke`` B=1, S=64, H=2 (checks that the script runs). Each
(implementation, policy) runs in its own worker process: a first call whose ``Out`` and gradients are kept (with
``--baseline`` the two implementations' are compared bit for bit), ``repeats`` timed calls of ``mn.mamba3_mimo`` and
``Out.backward`` after ``warmup`` calls, then one call under ``torch.profiler`` counting the device kernels it
launches and summing their time (``busy``: that kernel time over the median wall time; CUDA only). Peak memory is
``torch.cuda.max_memory_allocated`` (CUDA). ``--upstream`` adds upstream's own ``mamba3_mimo`` (its TileLang kernels
and Triton helpers through :mod:`mimo_numerics.ops.mamba3_mimo.upstream`, e.g. after ``. scripts/use_upstream_wheels.sh``)
timed the same way in the same run: its peak memory side by side with the reference's (the first call compiles;
it is not timed). Writes ``reports/bench/whole_op_<cpu|cuda>[_<shape>].{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "a": dict(batch=1, seqlen=8192, heads=16),
    "d": dict(batch=8, seqlen=4096, heads=32),
    "t": dict(batch=1, seqlen=2048, heads=32, state_dim=128),  # upstream's tuned shape (its own benchmark's)
    "cpu": dict(batch=1, seqlen=2048, heads=8),
    "smoke": dict(batch=1, seqlen=64, heads=2),
}
FIXED = dict(groups=1, state_dim=64, value_dim=64, rank=4, chunk_size=16)
#: The ``--policy`` of a worker that runs upstream's own op instead of the package's.
UPSTREAM = "upstream-kernels"


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_call(sizes: dict, device, op_call):
    """``call()``: ``op_call(leaves, chunk_size)`` then ``Out.backward(dout)`` at ``sizes`` (B, S, H) and
    :data:`FIXED` on ``device``, from fresh leaves each time; returns ``(Out, leaves)``."""
    from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs
    from mimo_numerics.ops.mamba3_mimo.fp64_model import INPUT_NAMES

    spec = OpCaseSpec(**{**FIXED, **sizes})
    raw = make_op_inputs(spec)
    inputs = {n: None if raw[n] is None else raw[n].to(device) for n in INPUT_NAMES}
    dout = raw["dout"].to(device)

    def call():
        leaves = [None if t is None else t.detach().requires_grad_(True) for t in inputs.values()]
        out = op_call(leaves, spec.chunk_size)
        out.backward(dout.to(out.dtype))
        return out, leaves

    return call


def whole_op_call(sizes: dict, device, policy: str, backend: str = "reference"):
    """``call()``: one forward + backward of ``mn.mamba3_mimo`` at ``sizes`` (B, S, H) and :data:`FIXED` on
    ``device`` under ``policy`` and ``backend``, from fresh leaves each time; returns ``(Out, leaves)``. Only names
    every commit's package has (``--baseline`` runs it against an old one); also used by ``profile_whole_op.py``."""
    import warnings

    import mimo_numerics as mn

    def op(leaves, chunk_size):
        with warnings.catch_warnings():  # backend="triton" says which steps still run the reference, every call
            warnings.simplefilter("ignore", UserWarning)
            return mn.mamba3_mimo(*leaves, chunk_size=chunk_size, rotary_dim_divisor=4, policy=policy,
                                  backend=backend)

    return _timed_call(sizes, device, op)


def upstream_call(sizes: dict, device):
    """``call()``: one forward + backward of upstream's own ``mamba3_mimo`` (mamba-ssm 2.3.2.post1, its TileLang
    kernels) on the inputs of :func:`whole_op_call`; returns ``(Out, leaves)``."""
    from mimo_numerics.ops.mamba3_mimo import upstream

    op = upstream.load()[upstream.OP_MODULE]
    return _timed_call(sizes, device, lambda leaves, chunk_size: op.mamba3_mimo(
        *leaves, chunk_size, 4, leaves[0].dtype))


def worker(args) -> int:
    import torch

    import mimo_numerics as mn
    from mimo_numerics.ops.mamba3_mimo.fp64_model import INPUT_NAMES

    device = torch.device(args.device)
    if args.policy == UPSTREAM:
        call = upstream_call(SHAPES[args.shape], device)
    else:
        call = whole_op_call(SHAPES[args.shape], device, args.policy, args.backend)
    out, leaves = call()
    if args.save:  # Out and the gradients of the first call, to compare bits between implementations
        values = {"Out": out.detach().cpu()}
        values.update({f"d{n}": leaf.grad.cpu() for n, leaf in zip(INPUT_NAMES, leaves) if leaf is not None})
        torch.save(values, args.save)
    for _ in range(args.warmup - 1):
        call()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    wall = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        call()
        _sync(device)
        wall.append((time.perf_counter() - start) * 1e3)
    # where the package was imported from, relative to its checkout (no machine path in reports/)
    result = {"module": str(Path(mn.__file__).relative_to(Path(mn.__file__).parents[1])), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "wall_ms": wall}
    if device.type == "cuda":
        result["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        from torch.profiler import ProfilerActivity, profile

        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            _sync(device)
        profiled_ms = (time.perf_counter() - start) * 1e3
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        result["kernels"] = len(kernels)
        result["kernel_ms"] = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
        result["profiled_wall_ms"] = profiled_ms
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _run_worker(path: Path, args, policy: str, save: Path) -> dict:
    # the package under test first; the rest of PYTHONPATH kept (use_upstream_wheels.sh puts TileLang there)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--shape", args.shape, "--device", args.device,
           "--policy", policy, "--backend", args.backend if path == ROOT else "reference",
           "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--save", str(save)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(path))
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="a")
    parser.add_argument("--policies", default="upstream_sm90,fp32")
    parser.add_argument("--backend", default="reference", choices=("reference", "triton"),
                        help="mn.mamba3_mimo's backend for the current package (the baseline runs the reference)")
    parser.add_argument("--baseline", default=None, help="a commit whose package is timed too, in the same session")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--upstream", action="store_true",
                        help="time upstream's own mamba3_mimo too (needs TileLang and the mamba-ssm source)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    import torch

    from mimo_numerics import provenance
    from mimo_numerics.metrics import rel_rms

    prov = provenance.collect()
    impls = {"current": ROOT}
    tmp = tempfile.TemporaryDirectory()
    if args.baseline:
        impls["baseline"] = provenance.export_package(args.baseline, Path(tmp.name) / "baseline")
    rows = []
    for policy in args.policies.split(","):
        row = {"policy": policy}
        saved = {}
        for name, path in impls.items():
            saved[name] = Path(tmp.name) / f"{name}_{policy}.pt"
            row[name] = _run_worker(path, args, policy, saved[name])
            print(f"{policy} {name}: median {statistics.median(row[name].get('wall_ms', [float('nan')])):.1f} ms",
                  file=sys.stderr, flush=True)
        if args.baseline and all(p.exists() for p in saved.values()):
            a, b = torch.load(saved["current"]), torch.load(saved["baseline"])
            row["bit_identical"] = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
            row["differing"] = [k for k in a if k in b and not torch.equal(a[k], b[k])]
            row["rel_rms"] = {k: rel_rms(a[k], b[k]) for k in row["differing"]}
        rows.append(row)
    upstream_row = None
    if args.upstream:
        upstream_row = _run_worker(ROOT, args, UPSTREAM, Path(tmp.name) / "upstream.pt")
        print(f"upstream: median {statistics.median(upstream_row.get('wall_ms', [float('nan')])):.1f} ms",
              file=sys.stderr, flush=True)
    tmp.cleanup()

    device_type = torch.device(args.device).type
    meta = {"provenance": prov, "shape": {**FIXED, **SHAPES[args.shape], "name": args.shape},
            "baseline": args.baseline, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "warmup": args.warmup,
            "repeats": args.repeats, "rows": rows, "upstream": upstream_row}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = (f"whole_op_{device_type}" + ("" if args.shape in ("a", "cpu") else f"_{args.shape}")
            + ("" if args.backend == "reference" else f"_{args.backend}"))
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")

    def cells(r: dict) -> str:
        if "error" in r:
            return f"{r['error'][:50]} | - | - | - | - | -"
        median = statistics.median(r["wall_ms"])
        if "kernels" not in r:
            return f"{median:.1f} | {min(r['wall_ms']):.1f} | - | - | - | -"
        busy = r["kernel_ms"] / median
        return (f"{median:.1f} | {min(r['wall_ms']):.1f} | {r['kernels']} | {r['kernel_ms']:.2f} | "
                f"{100 * min(busy, 1.0):.0f} % | {r['peak_bytes'] / 2**30:.2f}")

    shape = {**FIXED, **SHAPES[args.shape]}
    what = "reference" if args.backend == "reference" else f"backend={args.backend!r}"
    lines = [f"# The whole op's {what}, forward + backward ({device_type}, shape {args.shape})", "",
             provenance.markdown_header(prov) + f" {meta['date']}.", "",
             ("**Smoke run (shape `smoke`): checks that the script runs; not a benchmark.** "
              if args.shape == "smoke" else "")
             + f"`mn.mamba3_mimo(..., policy=P, backend={args.backend!r})` and `Out.backward(dout)` from leaves that require grad, B={shape['batch']}, "
             f"S={shape['seqlen']}, H={shape['heads']}, G=1, N={shape['state_dim']}, P=64, R=4, C=16, reduced DOUT, Z, D. "
             f"Median and min of "
             f"{args.repeats} calls after {args.warmup} warm-up calls, one worker process per cell; `kernels`: device "
             "kernels launched by one profiled call (the kernels of replayed CUDA graphs included); `kernel ms`: their "
             "summed device time (copies included); `busy`: kernel ms over the median wall time (the kernels of the "
             "profiled call against the unprofiled calls' wall: an estimate, capped at 100 %); `peak`: "
             "`torch.cuda.max_memory_allocated` GiB. "
             + ("Upstream's row: its own `mamba3_mimo` forward + backward (TileLang kernels and Triton helpers, "
                "compiled by a first call that is not timed), on the same inputs. " if args.upstream else ""), ""]
    header = "| policy | impl | median ms | min ms | kernels | kernel ms | busy | peak GiB |"
    lines += [header, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for name in impls:
            label = name if name == "current" else f"baseline `{args.baseline}`"
            lines.append(f"| {row['policy']} | {label} | {cells(row[name])} |")
    if upstream_row is not None:
        lines.append(f"| - | upstream's `mamba3_mimo` (TileLang) | {cells(upstream_row)} |")
    if args.baseline:
        lines += ["", "Bits, current vs baseline (Out and every gradient of the first call, `torch.equal`): "
                  + "; ".join(f"{r['policy']}: " + ("identical" if r.get("bit_identical") else "DIFFER in " + ", ".join(
                      f"{k} (rel RMS {v:.1e})" for k, v in r.get("rel_rms", {}).items())) for r in rows) + "."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
