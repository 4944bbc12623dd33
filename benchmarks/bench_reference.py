#!/usr/bin/env python
"""Benchmark the policy reference at the seed PR's headline shape (not a test).

Shape (a): B=1, S=8192, H=16, G=1, N=P=64, R=4, C=16 with D, Z and reduced DOUT. Times the median of repeated calls
(after warm-up; CUDA timed with synchronisation) for the chosen policies and writes
``reports/bench/reference_<device>.md`` and ``.json`` with the commit, CPU model, core and thread counts, torch
version and the load average around the run (timings taken on a loaded machine are not comparable: with many small
torch calls, OpenMP threads that wait for a descheduled partner cost far more than the work).

``--baseline REV`` also times the implementation of commit REV (``git archive`` of its ``mimo_numerics`` into a
temporary directory) in the same session, in alternating worker processes, and puts both side by side.

    python benchmarks/bench_reference.py --device cpu --repeats 5 --baseline 97b53fc
    python benchmarks/bench_reference.py --device cuda --repeats 20
    python benchmarks/bench_reference.py --smoke --out /tmp/bench   # seconds: a tiny shape, fp32, one call

``--smoke`` checks that the script runs (:data:`SMOKE_FIELDS`, not the headline shape); its figures are not a
benchmark, and its report says so.
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
#: ``--smoke``: the headline fields with these replaced (a tiny shape).
SMOKE_FIELDS = dict(seqlen=32, heads=2, state_dim=16, value_dim=16)


def shape_fields(smoke: bool = False) -> dict:
    """The fields of the timed ``CaseSpec``: ``benchmark_cases.HEADLINE_FIELDS`` (``smoke``: with
    :data:`SMOKE_FIELDS`)."""
    from mimo_numerics.benchmark_cases import HEADLINE_FIELDS

    return {**HEADLINE_FIELDS, **(SMOKE_FIELDS if smoke else {})}


def _headline(fields_json: str):
    """The headline ``CaseSpec`` from its fields (``mimo_numerics.benchmark_cases.HEADLINE_FIELDS``, handed to the
    worker as JSON so that a worker running another commit's package builds the same shape)."""
    from mimo_numerics.cases import CaseSpec

    return CaseSpec(**json.loads(fields_json))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device, warmup: int, repeats: int):
    """Wall and process-CPU milliseconds of ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    return wall, cpu


def worker(args) -> int:
    """Time the ``mimo_numerics`` found first on sys.path; print one JSON line."""
    import torch

    import mimo_numerics as mn
    # the old public paths: a --baseline worker runs another commit's package, and every commit has these
    # (tests/test_layout.py ALIAS_ALLOWED)
    from mimo_numerics import reference as stage1_reference
    from mimo_numerics.cases import as_args, as_kwargs, make_inputs

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference's GEMMs must be IEEE fp32
    inputs = make_inputs(_headline(args.case), device=device)
    result = {"module": mn.__file__, "threads": torch.get_num_threads(), "torch": torch.__version__, "policies": {}}
    for name in args.policies.split(","):
        policy = mn.presets.get(name)
        wall, cpu = time_call(lambda: stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs),
                                                                      policy=policy),
                              device, args.warmup, args.repeats)
        result["policies"][name] = {"wall_ms": wall, "cpu_ms": cpu}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def _run_worker(path: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--case", json.dumps(shape_fields(args.smoke)),
           "--device", args.device,
           "--policies", args.policies, "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(path))
    if out.returncode:
        raise RuntimeError(f"benchmark worker for {path} failed:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def provenance(commit=None) -> dict:
    """``mimo_numerics.provenance.collect()`` of this checkout (commit, ``git describe --dirty``, clean or not, the
    command, versions, machine); ``commit`` (``--commit``, for a machine without ``.git``) replaces the commit."""
    from mimo_numerics import provenance as _provenance

    prov = _provenance.collect()
    if commit:
        prov.update(commit=commit, describe=commit)
    return prov


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, npu)")
    parser.add_argument("--policies", default="upstream_sm90,seed_bf16,fp32", help="comma-separated presets")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per policy and worker")
    parser.add_argument("--rounds", type=int, default=1,
                        help="worker processes per implementation, alternating current and baseline")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time the mimo_numerics of this commit, side by side")
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    parser.add_argument("--commit", default=None, help="commit to record (default: git rev-parse of the checkout)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny shape, fp32 only, one call without warm-up: checks that the script runs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # the worker's shape fields (JSON)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.smoke:
        args.policies, args.warmup, args.repeats, args.rounds = "fp32", 0, 1, 1

    load_before = os.getloadavg()
    impls = {"current": ROOT}
    tmp = None
    if args.baseline:
        tmp = tempfile.TemporaryDirectory(prefix="bench_baseline_")
        from mimo_numerics.provenance import export_package

        impls["baseline"] = export_package(args.baseline, Path(tmp.name))
    runs = {name: [] for name in impls}
    for _ in range(args.rounds):
        for name, path in impls.items():
            runs[name].append(_run_worker(path, args))
            print(f"{name}: " + ", ".join(f"{p} {statistics.median(v['wall_ms']):.0f} ms"
                                          for p, v in runs[name][-1]["policies"].items()), flush=True)
    load_after = os.getloadavg()
    if tmp is not None:
        tmp.cleanup()

    def summary(name, policy):
        wall = [t for r in runs[name] for t in r["policies"][policy]["wall_ms"]]
        cpu = [t for r in runs[name] for t in r["policies"][policy]["cpu_ms"]]
        return {"median_ms": statistics.median(wall), "min_ms": min(wall), "cpu_median_ms": statistics.median(cpu),
                "calls": len(wall)}

    first = runs["current"][0]
    prov = provenance(args.commit)
    device_name = (f"{prov['machine']['cpu']}, {os.cpu_count()} cores, {first['threads']} torch threads"
                   if args.device == "cpu" else _gpu_name(prov, args.device))
    rows = [{"policy": p, **{name: summary(name, p) for name in impls}} for p in args.policies.split(",")]
    meta = {"commit": prov["describe"], "provenance": prov, "baseline": args.baseline, "device": device_name,
            "torch": first["torch"], "python": sys.version.split()[0],
            "shape": shape_fields(args.smoke), "smoke": args.smoke, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load_average_before": load_before, "load_average_after": load_after,
            "warmup": args.warmup, "repeats": args.repeats, "rounds": args.rounds, "results": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"reference_{torch_device_type(args.device)}"
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    from mimo_numerics.provenance import markdown_header

    lines = [f"# Reference benchmark on {device_name}", "",
             markdown_header(prov) + f" {meta['date']}; load average {load_before[0]:.2f} before, "
             f"{load_after[0]:.2f} after (a timing on a loaded machine is not comparable with one on a quiet one).",
             "",
             (f"**Smoke run (S={SMOKE_FIELDS['seqlen']}, H={SMOKE_FIELDS['heads']}, N=P={SMOKE_FIELDS['state_dim']}, "
              "otherwise the headline fields): checks that the script runs; not a benchmark.** " if args.smoke else
              "Shape (a): B=1, S=8192, H=16, G=1, N=P=64, R=4, C=16, D, Z and reduced DOUT (realistic inputs). ")
             + f"Median of {args.rounds * args.repeats} calls ({args.rounds} worker process(es) x {args.repeats}, each "
             f"after {args.warmup} warm-up call(s)); `cpu` is the process CPU time (all threads).", ""]
    if args.baseline:
        lines += [f"`current` is this checkout; `baseline` is `mimo_numerics` of commit `{args.baseline}`, timed in "
                  "the same session, worker processes alternating. Their outputs are bit-identical "
                  "(`scripts/check_reference_bits.py`).", "",
                  "| policy | current median ms | current min ms | baseline median ms | baseline min ms | speed-up | "
                  "current cpu ms | baseline cpu ms |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['policy']} | {r['current']['median_ms']:.0f} | {r['current']['min_ms']:.0f} | "
                  f"{r['baseline']['median_ms']:.0f} | {r['baseline']['min_ms']:.0f} | "
                  f"{r['baseline']['median_ms'] / r['current']['median_ms']:.1f}x | "
                  f"{r['current']['cpu_median_ms']:.0f} | {r['baseline']['cpu_median_ms']:.0f} |" for r in rows]
    else:
        lines += ["| policy | median ms | min ms | cpu ms |", "|---|---|---|---|"]
        lines += [f"| {r['policy']} | {r['current']['median_ms']:.2f} | {r['current']['min_ms']:.2f} | "
                  f"{r['current']['cpu_median_ms']:.0f} |" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / stem}.md and .json")
    return 0


def _gpu_name(prov: dict, device: str) -> str:
    """The GPU's name from the provenance (``"NVIDIA H200 (sm_90)"`` -> ``"NVIDIA H200"``), else ``device``."""
    gpus = (prov.get("machine") or {}).get("gpus") or []
    return gpus[0].split(" (")[0] if gpus else device


def torch_device_type(device: str) -> str:
    return device.split(":")[0]


if __name__ == "__main__":
    raise SystemExit(main())
