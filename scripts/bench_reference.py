#!/usr/bin/env python
"""Benchmark the policy reference at the seed PR's headline shape (not a test).

Shape (a): B=1, S=8192, H=16, G=1, N=P=64, R=4, C=16 with D, Z and reduced DOUT. Times the median of repeated calls
(after warm-up; CUDA timed with synchronisation) for the chosen policies on each device and writes
``reports/bench/reference_<device>.md`` and ``.json`` with the commit, device name and versions.

    python scripts/bench_reference.py --device cpu --repeats 3
    python scripts/bench_reference.py --device cuda --repeats 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import mimo_numerics as mn
from mimo_numerics.cases import CaseSpec, as_args, as_kwargs, make_inputs

HEADLINE = CaseSpec(batch=1, seqlen=8192, heads=16, groups=1, state_dim=64, value_dim=64, rank=4, chunk_size=16,
                    reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=0)
ROOT = Path(__file__).resolve().parents[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, warmup: int, repeats: int) -> list:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, npu)")
    parser.add_argument("--policies", default="upstream_sm90,seed_bf16,fp32", help="comma-separated presets")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    parser.add_argument("--commit", default=None, help="commit to record (default: git rev-parse of the checkout)")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference's GEMMs must be IEEE fp32
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"CPU ({torch.get_num_threads()} threads)"
    inputs = make_inputs(HEADLINE, device=device)
    rows = []
    for name in args.policies.split(","):
        policy = mn.presets.get(name)
        times = time_call(lambda: mn.reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs),
                                                                  policy=policy),
                          device, args.warmup, args.repeats)
        rows.append({"policy": name, "median_ms": statistics.median(times), "min_ms": min(times),
                     "repeats": len(times)})
        print(f"{name:>16}: median {statistics.median(times):9.2f} ms  (min {min(times):.2f}, n={len(times)})",
              flush=True)
    meta = {"commit": args.commit or _commit(), "device": device_name, "torch": torch.__version__, "python": sys.version.split()[0],
            "shape": HEADLINE.to_dict() if hasattr(HEADLINE, "to_dict") else str(HEADLINE),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "results": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"reference_{device.type}"
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=2))
    lines = [f"# Reference benchmark on {device_name}", "",
             f"commit `{meta['commit']}`, torch {meta['torch']}, python {meta['python']}, {meta['date']}", "",
             "Shape (a): B=1, S=8192, H=16, G=1, N=P=64, R=4, C=16, D, Z and reduced DOUT (realistic inputs). "
             f"Median of {args.repeats} calls after {args.warmup} warm-up.", "",
             "| policy | median ms | min ms |", "|---|---|---|"]
    lines += [f"| {r['policy']} | {r['median_ms']:.2f} | {r['min_ms']:.2f} |" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
