#!/usr/bin/env python
"""The FP64 truth at realistic lengths: time and peak memory of ``mn.mamba3_mimo(..., policy="fp64")`` forward +
backward (the chain of every FP64 oracle) and of torch autograd through the independent FP64 model
(``fp64_model.mamba3_mimo_fp64``), and how far apart their gradients are.

    python benchmarks/bench_fp64_chain.py                          # CPU: S=2048 H=8 and S=8192 H=16
    python benchmarks/bench_fp64_chain.py --device cuda            # the same on a GPU
    python benchmarks/bench_fp64_chain.py --sizes 512x2 --no-model # quick look, chain only

Shape: B=1, G=1, N=P=64, R=4, C=16, reduced DOUT, Z and D, the ``whole_op`` formula (``OpCaseSpec``), seed 0. Each
(size, implementation) runs in its own worker process, so a peak is that run's alone: on CPU the process's peak
resident set (``VmHWM``, including torch itself, ~0.3 GiB), on CUDA ``torch.cuda.max_memory_allocated``. The
two implementations' ``Out`` and 14 gradients are compared by relative RMS. Writes
``reports/bench/fp64_chain_<cpu|cuda>.{md,json}`` with the commit, machine and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = "2048x8,8192x16"
IMPLEMENTATIONS = ("chain", "model")


def case_fields(seqlen: int, heads: int) -> dict:
    return dict(batch=1, seqlen=seqlen, heads=heads, groups=1, state_dim=64, value_dim=64, rank=4, chunk_size=16)


def peak_rss_bytes() -> int:
    """This process's peak resident set: ``VmHWM`` of ``/proc/self/status`` (its own address space only), else
    ``ru_maxrss``, which Linux keeps across ``execve`` and so counts the parent's memory at the fork too."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(args) -> int:
    import torch

    from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec, make_op_inputs
    from mimo_numerics.ops.mamba3_mimo.fp64_model import INPUT_NAMES, mamba3_mimo_fp64

    import mimo_numerics as mn

    device = torch.device(args.device)
    spec = OpCaseSpec(**case_fields(args.seqlen, args.heads))
    raw = make_op_inputs(spec)
    model = args.worker == "model"
    leaves = {}
    for name in INPUT_NAMES:
        t = raw[name]
        # float64 leaves: under the fp64 chain their .grad is the float64 gradient itself (a bf16 leaf's is rounded)
        leaves[name] = None if t is None else t.to(device, torch.float64).requires_grad_(True)
    dout = raw["dout"].to(device, torch.float64)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    if model:
        out = mamba3_mimo_fp64(*leaves.values(), chunk_size=spec.chunk_size, rotary_dim_divisor=4)
    else:
        out = mn.mamba3_mimo(*leaves.values(), chunk_size=spec.chunk_size, rotary_dim_divisor=4, policy="fp64")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    forward_s = time.perf_counter() - start
    out.backward(dout)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = peak_rss_bytes()
    total_s = time.perf_counter() - start
    values = {"Out": out.detach().double().cpu()}
    values.update({f"d{n}": leaf.grad.double().cpu() for n, leaf in leaves.items() if leaf is not None})
    torch.save(values, args.save)
    print("RESULT " + json.dumps({"forward_s": forward_s, "total_s": total_s, "peak_bytes": peak,
                                  "threads": torch.get_num_threads()}), flush=True)
    return 0


def run_worker(impl: str, seqlen: int, heads: int, device: str, save: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, "--seqlen", str(seqlen), "--heads",
           str(heads), "--device", device, "--save", str(save)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated SxH (B=1)")
    parser.add_argument("--no-model", action="store_true", help="time the chain only (no comparison)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--seqlen", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--heads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    import torch
    from tqdm import tqdm

    from mimo_numerics import provenance
    from mimo_numerics.metrics import rel_rms

    try:
        sizes = [(int(s), int(h)) for s, h in (item.split("x") for item in args.sizes.split(","))]
    except ValueError:
        parser.error(f"--sizes must be comma-separated SxH with positive integers (e.g. 2048x8), got {args.sizes!r}")
    if any(s < 1 or h < 1 for s, h in sizes):
        parser.error(f"--sizes must be comma-separated SxH with positive integers (e.g. 2048x8), got {args.sizes!r}")
    impls = ("chain",) if args.no_model else IMPLEMENTATIONS
    prov = provenance.collect()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seqlen, heads in tqdm(sizes, desc="sizes"):
            row = {"seqlen": seqlen, "heads": heads}
            for impl in impls:
                save = Path(tmp) / f"{impl}_{seqlen}_{heads}.pt"
                row[impl] = run_worker(impl, seqlen, heads, args.device, save)
                print(f"S={seqlen} H={heads} {impl}: {row[impl]}", file=sys.stderr, flush=True)
            if all("error" not in row[i] for i in impls) and len(impls) == 2:
                chain = torch.load(Path(tmp) / f"chain_{seqlen}_{heads}.pt")
                model = torch.load(Path(tmp) / f"model_{seqlen}_{heads}.pt")
                row["rel_rms"] = {name: rel_rms(chain[name], model[name]) for name in model}
            rows.append(row)
    load_after = os.getloadavg()

    device_type = torch.device(args.device).type
    mach = prov["machine"]
    where = (f"{mach['cpu']} ({mach['cores']} cores)" if device_type == "cpu" else ", ".join(mach.get("gpus") or []))
    meta = {"provenance": prov, "device": args.device, "where": where, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load_average_before": load_before, "load_average_after": load_after, "rows": rows,
            "shape": case_fields(0, 0) | {"seqlen": "S", "heads": "H"}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"fp64_chain_{device_type}"
    (out / f"{stem}.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")

    peak_name = "peak RSS" if device_type == "cpu" else "peak allocated"
    lines = [f"# The FP64 chain at realistic lengths ({device_type})", "",
             provenance.markdown_header(prov) + f" {meta['date']}; load average {load_before[0]:.2f} before, "
             f"{load_after[0]:.2f} after (timings on a loaded machine are upper bounds).", "",
             "`chain`: `mn.mamba3_mimo(..., policy=\"fp64\")` forward + backward, every FP64 oracle in turn; `model`: "
             "torch autograd through `fp64_model.mamba3_mimo_fp64` (the independent chunked-recurrence model). B=1, "
             "G=1, N=P=64, R=4, C=16, reduced DOUT, Z, D; one worker process per cell. `rel RMS (worst)`: the largest "
             "relative RMS difference between the two over Out and the 14 gradients.", "",
             f"| S | H | chain fwd s | chain fwd+bwd s | chain {peak_name} GiB | model fwd+bwd s | model {peak_name} GiB "
             "| rel RMS (worst) | worst entry |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        def cell(impl, key, scale=1.0, fmt="{:.1f}"):
            r = row.get(impl)
            if r is None:
                return "-"
            return r["error"][:60] if "error" in r else fmt.format(r[key] / scale)
        rel = row.get("rel_rms")
        worst = max(rel.items(), key=lambda kv: kv[1]) if rel else None
        lines.append(f"| {row['seqlen']} | {row['heads']} | {cell('chain', 'forward_s')} | {cell('chain', 'total_s')} | "
                     f"{cell('chain', 'peak_bytes', 2**30, '{:.2f}')} | {cell('model', 'total_s')} | "
                     f"{cell('model', 'peak_bytes', 2**30, '{:.2f}')} | "
                     f"{'-' if worst is None else f'{worst[1]:.2e}'} | {'-' if worst is None else worst[0]} |")
    if any(row.get("rel_rms") for row in rows):
        names = list(next(row["rel_rms"] for row in rows if row.get("rel_rms")))
        lines += ["", "Relative RMS difference, chain vs model, per entry:", "",
                  "| S | H | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        lines += [f"| {row['seqlen']} | {row['heads']} | " + " | ".join(f"{row['rel_rms'][n]:.1e}" for n in names) + " |"
                  for row in rows if row.get("rel_rms")]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
