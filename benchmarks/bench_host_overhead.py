#!/usr/bin/env python
"""The host time of the whole op on kernels, without a GPU: what ``backend="triton"`` costs the CPU per call.

    python benchmarks/bench_host_overhead.py                          # shapes a and d, this checkout
    python benchmarks/bench_host_overhead.py --baseline c4120f9       # and that commit's package, same run
    python benchmarks/bench_host_overhead.py --smoke --out /tmp/host     # checks that it runs (2 calls, shape smoke)

On a GPU the whole op's forward + backward is host-bound where its kernels are short: at shape (a) the H100 spent
5.6 ms issuing 4.4 ms of kernels (``reports/bench/steps_a_d_h100_chunk64.md``). That host time has three parts:
this package's Python (validation, policy constexprs, launch plans, buffers), Triton's launch path (binding the
arguments of each launch, its C launcher, the driver) and torch's (autograd, the allocator). This benchmark measures
the first on any machine, and the part of the second that is Python (the argument binder and cache key), so that
changes to the launch path can be measured without a GPU; the GPU's own figure stays ``bench_steps.py``'s ``host
ms``.

How: ``mn.mamba3_mimo(..., policy="upstream_sm90", backend="triton")`` and ``Out.backward`` on CPU tensors of the
benchmark shape, planned as on CUDA (``kernels._backend.backend_of`` answers ``"cuda"`` and the device has
``--sm-count`` SMs, so the launches, their arguments, the stage-2 batch slices and the buffers are the H100's),
with every kernel launch skipped (``kernels._compile_ahead.launch`` replaced: nothing runs, the outputs are
uninitialised memory, so the figures are host time only and no value is looked at). The torch operators between
the launches still run on CPU tensors (a few per call; at (d) the sign check's reductions over 1 M elements are
part of the figure). ``--bind``: each skipped launch also goes through Triton's NVIDIA argument binder
(``create_function_from_signature`` and ``compute_cache_key``, as ``JITFunction.run`` does before it calls the
launcher), timed apart. Each implementation runs in its own worker process. Writes
``reports/bench/host_overhead_cpu.{md,json}``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_whole_op import FIXED, SHAPES  # the benchmark shapes, one place (benchmarks/ is the script's folder)

ROOT = Path(__file__).resolve().parents[1]

#: The chain's steps, timed by wrapping these functions of ``mimo_numerics.ops.mamba3_mimo.chain``.
STEPS = ("run_preprocess", "run_forward", "run_stage1", "run_stage2", "run_epilogue")


class _Props:
    def __init__(self, sms: int):
        self.multi_processor_count = sms


def _skip_launches(bind: bool, bind_us: list, launches: list):
    """Replace the package's one launch function by a counter (and the binder when ``bind``)."""
    from mimo_numerics.kernels import _compile_ahead

    binders = {}
    backend = None
    if bind:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        backend = make_backend(GPUTarget("cuda", 90, 32))

    def skipped(kernel, grid, args, kwargs):
        launches.append(getattr(kernel, "__name__", "?"))
        if not bind:
            return
        from triton.runtime.jit import compute_cache_key, create_function_from_signature

        binder = binders.get(kernel)
        if binder is None:
            binder = binders[kernel] = (create_function_from_signature(kernel.signature, kernel.params, backend),
                                        {})
        start = time.perf_counter()
        _, specialization, options = binder[0](*args, **kwargs)
        compute_cache_key(binder[1], specialization, options)
        bind_us.append((time.perf_counter() - start) * 1e6)

    _compile_ahead.launch = skipped


def _plan_as_cuda(sms: int) -> None:
    """CPU tensors planned as CUDA ones: the launch plan, slices and buffers of a GPU with ``sms`` SMs."""
    import torch

    from mimo_numerics.kernels import _backend

    _backend.backend_of = lambda device: "cuda"
    torch.cuda.get_device_properties = lambda device=None: _Props(sms)


def worker(args) -> int:
    import warnings

    import torch

    _plan_as_cuda(args.sm_count)
    bind_us, launches = [], []
    _skip_launches(args.bind, bind_us, launches)
    from bench_whole_op import whole_op_call

    from mimo_numerics.ops.mamba3_mimo import chain

    step_s = collections.defaultdict(float)
    for name in STEPS:
        def timed(*a, _f=getattr(chain, name), _n=name, **k):
            start = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                step_s[_n] += time.perf_counter() - start
        setattr(chain, name, functools.wraps(getattr(chain, name))(timed))
    call = whole_op_call(SHAPES[args.shape], torch.device("cpu"), "upstream_sm90", "triton")
    warnings.simplefilter("ignore")
    for _ in range(args.warmup):
        call()
    wall, steps = [], collections.defaultdict(list)
    n_launch, n_bind = [], []
    for _ in range(args.repeats):
        step_s.clear()
        del launches[:]
        del bind_us[:]
        start = time.perf_counter()
        call()
        wall.append((time.perf_counter() - start) * 1e3)
        for name in STEPS:
            steps[name].append(step_s[name] * 1e3)
        n_launch.append(len(launches))
        n_bind.append(sum(bind_us) / 1e3)
    result = {"wall_ms": wall, "steps_ms": dict(steps), "launches": n_launch[-1],
              "bind_ms": n_bind if args.bind else None, "torch": torch.__version__,
              "threads": torch.get_num_threads()}
    print("RESULT " + json.dumps(result))
    return 0


def _run_worker(path: Path, args, shape: str, bind: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(path), TRITON_INTERPRET="0")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--shape", shape, "--warmup", str(args.warmup),
           "--repeats", str(args.repeats), "--sm-count", str(args.sm_count)] + (["--bind"] if bind else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(ROOT))
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="a,d", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--baseline", default=None, help="a commit whose package is measured too, in the same run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sm-count", type=int, default=132, help="SMs of the CUDA device planned for (H100: 132)")
    parser.add_argument("--no-bind", action="store_true", help="skip the pass through Triton's argument binder")
    parser.add_argument("--smoke", action="store_true",
                        help="shape smoke, one warm-up and two timed calls, no binder pass: checks that it runs")
    parser.add_argument("--out", default=str(ROOT / "reports" / "bench"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--bind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.smoke:
        args.shapes, args.warmup, args.repeats, args.no_bind = "smoke", 1, 2, True
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; choose from {', '.join(SHAPES)}")

    from tqdm import tqdm

    from mimo_numerics import provenance

    prov = provenance.collect()
    tmp = tempfile.TemporaryDirectory()
    impls = {"current": ROOT}
    if args.baseline:
        try:
            impls[f"baseline {args.baseline}"] = provenance.export_package(args.baseline, Path(tmp.name) / "baseline")
        except ValueError as exc:
            raise SystemExit(f"--baseline: {exc}") from None
    cells = [(shape, name, bind) for shape in shapes for name in impls
             for bind in ((False,) if args.no_bind else (False, True))]
    results = collections.defaultdict(dict)
    for shape, name, bind in tqdm(cells, desc="host-overhead workers", unit="worker"):
        results[shape][name + (" +bind" if bind else "")] = _run_worker(impls[name], args, shape, bind)
    tmp.cleanup()

    meta = {"provenance": prov, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "warmup": args.warmup,
            "repeats": args.repeats, "sm_count": args.sm_count, "baseline": args.baseline, "fixed": FIXED,
            "shapes": {s: SHAPES[s] for s in shapes}, "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead_cpu.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")

    def med(xs):
        return statistics.median(xs) if xs else float("nan")

    lines = ["# The whole op's host time on kernels, launches skipped (CPU)", "",
             provenance.markdown_header(prov) + f" {meta['date']}.", "",
             ("**Smoke run: checks that the script runs; not a measurement.** " if args.smoke else "")
             + "`mn.mamba3_mimo(..., policy=\"upstream_sm90\", backend=\"triton\")` + `Out.backward` on CPU tensors, "
             f"planned as on a CUDA device with {args.sm_count} SMs, every kernel launch skipped "
             "(`benchmarks/bench_host_overhead.py` says how): the package's own host time per forward + backward, "
             f"median of {args.repeats} calls after {args.warmup} warm-up calls, one worker process each. `+bind`: "
             "the same with each launch passed through Triton's NVIDIA argument binder and cache key (the Python "
             "part of `JITFunction.run` before its C launcher), `bind ms` its share. Not a GPU figure: the GPU's "
             "host time adds Triton's C launcher, the driver and the allocator (`bench_steps.py`'s `host ms`).", ""]
    for shape in shapes:
        sizes = {**FIXED, **SHAPES[shape]}
        lines += [f"## Shape ({shape}) B={sizes['batch']}, S={sizes['seqlen']}, H={sizes['heads']}", "",
                  "| impl | host ms | min | launches | bind ms | " + " | ".join(s[4:] for s in STEPS)
                  + " | outside the steps |", "|---|" + "---|" * (5 + len(STEPS))]
        for name, r in results[shape].items():
            if "error" in r:
                lines.append(f"| {name} | {r['error'][:80]} |" + " - |" * (4 + len(STEPS)))
                continue
            steps = [med(r["steps_ms"][s]) for s in STEPS]
            bind = "-" if r.get("bind_ms") is None else f"{med(r['bind_ms']):.3f}"
            lines.append(f"| {name} | {med(r['wall_ms']):.3f} | {min(r['wall_ms']):.3f} | {r['launches']} | {bind} | "
                         + " | ".join(f"{x:.3f}" for x in steps) + f" | {med(r['wall_ms']) - sum(steps):.3f} |")
        base = [n for n in results[shape] if n.startswith("baseline") and "bind" not in n]
        if base and "error" not in results[shape]["current"] and "error" not in results[shape][base[0]]:
            ratio = med(results[shape][base[0]]["wall_ms"]) / med(results[shape]["current"]["wall_ms"])
            lines += ["", f"Host time, baseline over current: {ratio:.2f}x."]
        lines.append("")
    (out / "host_overhead_cpu.md").write_text("\n".join(lines))
    print(f"wrote {out / 'host_overhead_cpu.md'} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
