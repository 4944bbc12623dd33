#!/usr/bin/env python
"""The whole op on kernels, step by step, beside upstream's kernels in the same run (issue 43).

    python benchmarks/bench_steps.py --shapes a,d --upstream --out $OUT      # on a CUDA GPU
    python benchmarks/bench_steps.py --smoke --out /tmp/steps                 # CPU dry run of the script (no timing)

Per shape (``bench_whole_op.SHAPES``: G=1, N=P=64, R=4, C=16, reduced DOUT, Z, D; inputs of ``make_op_inputs``):

* ``mn.mamba3_mimo(..., backend="triton")`` forward + backward from fresh leaves: median and min wall time of
  ``--repeats`` calls after ``--warmup``; one profiled call's device kernels (count, summed time); peak memory
  (``torch.cuda.max_memory_allocated`` over one call after a reset);
* each step of the chain alone on its own inputs (made once by the chain itself), median of
  ``triton.testing.do_bench`` (CUDA events, warm-up and repeats in ms): the preprocessing
  (``kernels.chain_steps.preprocess``), the forward, stage 1, stage 2, the epilogue; with ``--stage2-plans`` stage 2
  also under each plan ``rows x warps`` [``w`` the walk's warps] [``s`` its pipeline stages]
  (``kernels.mimo_bwd_bwd.Stage2Tiles``);
* with ``--upstream``: upstream's own ``mamba3_mimo`` forward + backward (TileLang 0.1.8 kernels and its Triton
  helpers, ``ops.mamba3_mimo.upstream``; compiled by an untimed first call), one profiled call: its kernels by
  name, their device time, and the same per-step split (upstream's TileLang kernels by name; its Triton helpers and
  torch operators before the forward kernel as the preprocessing, after stage 2 as the epilogue).

Writes ``steps_<shapes>.json`` and ``.md`` under ``--out`` with the provenance header (commit, GPU, versions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from bench_whole_op import FIXED, SHAPES  # noqa: E402  (benchmarks/ is on sys.path)

import mimo_numerics as mn  # noqa: E402
from mimo_numerics import provenance  # noqa: E402
from mimo_numerics.ops.mamba3_mimo import chain  # noqa: E402
from mimo_numerics.ops.mamba3_mimo.autograd import BackendFallbackWarning  # noqa: E402
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs  # noqa: E402

STEPS = ("pre", "forward", "stage 1", "stage 2", "epilogue")
POLICY = "upstream_sm90"


def _inputs(shape: str, device) -> dict:
    spec = OpCaseSpec(**{**FIXED, **SHAPES[shape]})
    raw = make_op_inputs(spec)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in raw.items()}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bench(fn, device, rep_ms: float) -> float:
    """Median ms of ``fn`` (``triton.testing.do_bench`` on CUDA; one timed call elsewhere)."""
    if device.type == "cuda":
        import triton

        return float(triton.testing.do_bench(fn, warmup=max(5.0, rep_ms / 4), rep=rep_ms, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _profile(call, device) -> dict:
    """Device kernels of one ``call()``: ``{"kernels": n, "kernel_ms": summed, "by_name": {name: [count, ms]}}``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        _sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict = {}
    for e in kernels:
        entry = by_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us() / 1e3
    return {"kernels": len(kernels), "kernel_ms": sum(v[1] for v in by_name.values()), "by_name": by_name,
            "order": [e.name for e in sorted(kernels, key=lambda e: e.time_range.start)]}


def whole_op(x: dict, device, warmup: int, repeats: int, backend: str = "triton") -> dict:
    """Forward + backward of ``mn.mamba3_mimo`` from fresh leaves: wall times, a profile, the peak memory."""
    def call():
        leaves = [None if x[n] is None else x[n].detach().requires_grad_(True) for n in OP_INPUT_NAMES]
        out = mn.mamba3_mimo(*leaves, chunk_size=x["chunk_size"], rotary_dim_divisor=x["rotary_dim_divisor"],
                             policy=POLICY, backend=backend)
        out.backward(x["dout"])

    first = time.perf_counter()
    call()
    _sync(device)
    first_s = time.perf_counter() - first
    for _ in range(max(0, warmup - 1)):
        call()
    _sync(device)
    wall, host = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        host.append((time.perf_counter() - start) * 1e3)  # until backward() returned: the host's issue time
        _sync(device)
        wall.append((time.perf_counter() - start) * 1e3)
    result = {"first_call_s": first_s, "wall_ms": wall, "median_ms": statistics.median(wall), "min_ms": min(wall),
              "host_ms": statistics.median(host)}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        call()
        _sync(device)
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
        result["peak_above_inputs_gib"] = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 30
        prof = _profile(call, device)
        result.update(kernels=prof["kernels"], kernel_ms=prof["kernel_ms"], by_name=prof["by_name"])
    return result


def step_times(x: dict, device, rep_ms: float, plans) -> dict:
    """Each step of the chain alone on inputs the chain made, median ms; stage 2 under each plan."""
    from mimo_numerics import kernels
    from mimo_numerics.kernels import chain_steps, mimo_bwd_bwd

    pre = chain.run_preprocess(x, POLICY, backend="triton")
    s1 = chain.run_stage1(x, pre, POLICY, backend="triton")
    s2 = chain.run_stage2(x, pre, s1, POLICY, backend="triton")
    kw = chain.stage2_kwargs(x)
    calls = {
        "pre": lambda: chain_steps.preprocess(x["ADT"], x["Angles"], x["DT"], x["chunk_size"], policy=POLICY),
        "forward": lambda: kernels.mamba_mimo_fwd(*chain.forward_args(x, pre), **kw, policy=POLICY),
        "stage 1": lambda: kernels.mamba_mimo_bwd_fwd(*chain.stage1_args(x, pre), **kw, policy=POLICY),
        "stage 2": lambda: kernels.mamba_mimo_bwd_bwd(*chain.stage2_args(x, pre, s1), **kw, policy=POLICY),
        "epilogue": lambda: chain_steps.epilogue(*chain.epilogue_args(x, pre, s1, s2), **chain.epilogue_kwargs(x),
                                                 policy=POLICY),
    }
    out = {name: _bench(fn, device, rep_ms) for name, fn in calls.items()}
    out["sum"] = sum(out[s] for s in STEPS)
    for label in plans:
        tiles = mimo_bwd_bwd.parse_stage2_plan(label, max(16, x["chunk_size"]))

        def plan_call(tiles=tiles):
            return mimo_bwd_bwd.build_launches(*chain.stage2_args(x, pre, s1), **kw, policy=POLICY,
                                               tiles=tiles).run()

        out[f"stage 2 [{label}]"] = _bench(plan_call, device, rep_ms)
    return out


def _upstream_step(name: str, seen_forward: bool, seen_stage2: bool) -> str:
    """The step of one of upstream's kernels, by its name and where it ran in the call."""
    low = name.lower()
    if "mamba_mimo_bwd_bwd" in low or "bwd_bwd" in low:
        return "stage 2"
    if "mamba_mimo_bwd_fwd" in low or "bwd_fwd" in low:
        return "stage 1"
    if "mamba_mimo_fwd" in low:
        return "forward"
    if seen_stage2:
        return "epilogue"
    return "pre" if not seen_forward else "between"


def upstream_profile(x: dict, device) -> dict:
    """Upstream's ``mamba3_mimo`` forward + backward: a compiling first call, then one profiled call."""
    from mimo_numerics.ops.mamba3_mimo import upstream

    op = upstream.load()[upstream.OP_MODULE]

    def call():
        leaves = [None if x[n] is None else x[n].detach().requires_grad_(True) for n in OP_INPUT_NAMES]
        out = op.mamba3_mimo(*leaves, x["chunk_size"], x["rotary_dim_divisor"], leaves[0].dtype)
        out.backward(x["dout"])

    start = time.perf_counter()
    call()
    _sync(device)
    first_s = time.perf_counter() - start
    torch.cuda.reset_peak_memory_stats(device)
    call()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30
    prof = _profile(call, device)
    steps = {s: 0.0 for s in STEPS + ("between",)}
    seen_forward = seen_stage2 = False
    counts: dict = {}
    for name in prof["order"]:
        counts[name] = counts.get(name, 0) + 1
    per_launch = {n: prof["by_name"][n][1] / prof["by_name"][n][0] for n in prof["by_name"]}
    for name in prof["order"]:
        step = _upstream_step(name, seen_forward, seen_stage2)
        seen_forward |= step == "forward"
        seen_stage2 |= step == "stage 2"
        steps[step] += per_launch[name]
    return {"first_call_s": first_s, "peak_gib": peak, "kernels": prof["kernels"], "kernel_ms": prof["kernel_ms"],
            "steps": steps, "by_name": prof["by_name"]}


def _table(rows, header) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def render(results: dict, command: str, note: str = "") -> str:
    prov = provenance.markdown_header(command=command)
    lines = [f"# The whole op on kernels, step by step, beside upstream ({', '.join(results['shapes'])})", "",
             prov, ""] + (["**Smoke run (shape `smoke`, CPU): checks that the script runs; not a benchmark.**", ""]
                          if results["shapes"] == ["smoke"] else []) + (
             [f"**Source:** {note}", ""] if note else []) + [
             f"Policy `{POLICY}`, `backend=\"triton\"`; shapes G=1, N=P=64, R=4, C=16, reduced DOUT, Z, D. `median ms`: "
             "wall time of forward + backward from fresh leaves (CUDA synchronised); `host ms`: the median time until "
             "`backward()` returned, before the synchronisation (the host's issue time: near `median ms`, the call "
             "is bound by the host); `kernel ms`: the device kernels "
             "of one profiled call; steps alone: `triton.testing.do_bench` medians of each step on its own inputs "
             "(the launches' host time included). Upstream: one profiled call of its own `mamba3_mimo` after a "
             "compiling first call; its kernels split by name (TileLang) and by position (its Triton helpers and "
             "torch operators before the forward kernel: pre; after stage 2: epilogue).", ""]
    for shape, r in results["per_shape"].items():
        w = r["ours"]
        lines += [f"## Shape ({shape}) {SHAPES[shape]}", ""]
        head = ["impl", "median ms", "min ms", "host ms", "kernels", "kernel ms", "peak GiB", "first call s"]
        rows = [["ours (`backend=\"triton\"`)", f"{w['median_ms']:.2f}", f"{w['min_ms']:.2f}",
                 f"{w.get('host_ms', float('nan')):.2f}", w.get("kernels", "-"),
                 f"{w.get('kernel_ms', float('nan')):.2f}", f"{w.get('peak_gib', float('nan')):.2f}",
                 f"{w['first_call_s']:.1f}"]]
        up = r.get("upstream")
        if up and "error" not in up:
            rows.append(["upstream `mamba3_mimo` (TileLang 0.1.8)", "-", "-", "-", up["kernels"],
                         f"{up['kernel_ms']:.2f}", f"{up['peak_gib']:.2f}", f"{up['first_call_s']:.1f}"])
        lines += _table(rows, head) + [""]
        st = r["steps"]
        head = ["step", "ours, alone (ms)"] + (["upstream kernels (ms)"] if up and "error" not in up else [])
        rows = []
        for s in STEPS:
            row = [s, f"{st[s]:.3f}"]
            if up and "error" not in up:
                row.append(f"{up['steps'][s]:.3f}")
            rows.append(row)
        total = ["sum", f"{st['sum']:.3f}"] + ([f"{sum(up['steps'].values()):.3f}"] if up and "error" not in up else [])
        rows.append(total)
        lines += _table(rows, head) + [""]
        plans = [(k, v) for k, v in st.items() if k.startswith("stage 2 [")]
        if plans:
            lines += ["Stage 2 under other plans (rows per program x warps):", ""]
            lines += _table([[k, f"{v:.3f}"] for k, v in plans], ["plan", "ms"]) + [""]
        if up and "error" in up:
            lines += [f"Upstream did not run: {up['error']}", ""]
        top = sorted(w.get("by_name", {}).items(), key=lambda kv: -kv[1][1])[:12]
        if top:
            lines += ["Our kernels in the profiled call, by device time:", ""]
            lines += _table([[f"`{n[:70]}`", c, f"{ms:.3f}"] for n, (c, ms) in top], ["kernel", "launches", "ms"])
            lines += [""]
        if up and "error" not in up:
            top = sorted(up["by_name"].items(), key=lambda kv: -kv[1][1])[:12]
            lines += ["Upstream's kernels in its profiled call, by device time:", ""]
            lines += _table([[f"`{n[:70]}`", c, f"{ms:.3f}"] for n, (c, ms) in top], ["kernel", "launches", "ms"])
            lines += [""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="a,d")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rep-ms", type=float, default=200.0, help="do_bench repetition time per step (ms)")
    ap.add_argument("--stage2-plans", default="", help="e.g. 64x4,32x4,64x4w1s6: stage 2 also under these plans "
                    "(ROWSxWARPS, optionally the walk's warps wN and pipeline stages sM)")
    ap.add_argument("--upstream", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU dry run on shape 'smoke' (nothing is timed)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    ap.add_argument("--note", default="", help="a sentence on the source measured, printed under the header (e.g. "
                    "the commit when the machine's copy has no git history)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.device, a.shapes, a.repeats, a.warmup, a.upstream = "cpu", "smoke", 1, 1, False
    device = torch.device(a.device)
    plans = [p.strip() for p in a.stage2_plans.split(",") if p.strip()]
    from mimo_numerics.kernels import mimo_bwd_bwd

    for p in plans:  # refuse a malformed plan before anything runs
        try:
            mimo_bwd_bwd.parse_stage2_plan(p, 16)
        except ValueError as err:
            ap.error(f"--stage2-plans: {err}")
    shapes = [s for s in a.shapes.split(",") if s]
    results = {"shapes": shapes, "per_shape": {}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"steps_{'_'.join(shapes)}"
    command = "python benchmarks/bench_steps.py " + " ".join(argv if argv is not None else sys.argv[1:])

    def write():  # after every part, so that a run stopped by a time limit keeps what it measured
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
        (out / f"{stem}.md").write_text(render(results, command, a.note))

    inputs = {}
    for shape in shapes:  # ours first at every shape, then upstream's (its compile is the long part)
        x = inputs[shape] = _inputs(shape, device)
        with warnings.catch_warnings():
            warnings.simplefilter("error", BackendFallbackWarning)
            r = {"ours": whole_op(x, device, a.warmup, a.repeats), "steps": step_times(x, device, a.rep_ms, plans)}
        results["per_shape"][shape] = r
        print(shape, json.dumps({k: v for k, v in r["ours"].items() if k not in ("by_name", "wall_ms")}),
              json.dumps(r["steps"]), flush=True)
        write()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for shape in shapes if a.upstream else ():
        r = results["per_shape"][shape]
        try:
            r["upstream"] = upstream_profile(inputs[shape], device)
        except Exception as exc:  # report, not hide: the table says upstream did not run and why
            r["upstream"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(shape, "upstream", json.dumps({k: v for k, v in r["upstream"].items() if k != "by_name"}), flush=True)
        write()
    print(f"wrote {out / stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
