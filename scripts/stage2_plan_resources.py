#!/usr/bin/env python
"""Registers, spills, SASS size and compile time of stage 2's kernels for sm_90 under several tile plans, on a CPU.

Triton ships ``ptxas`` and ``cuobjdump`` with its NVIDIA backend, so every stage-2 launch that
``kernels.mimo_bwd_bwd.build_launches(..., backend="cuda")`` plans can be compiled for sm_90 without a GPU
(``kernels._devtools``: the JIT's own argument binder, so the specialization is a real launch's). The plans are
``Stage2Tiles(rows, tokens, num_warps)``: BR fused rows per program of the rows, k-side and q-side kernels, BT tokens
per program of the token kernel, warps per program. A kernel that needs more than 255 registers a thread spills to
local memory (``stack``): the H100 profile of the k-side and rows kernels at shape (d) names their registers as the
limiter (``reports/bench/ncu_whole_op_triton.md``). This is a static estimate for choosing the plans that a GPU run
then times (``scripts/device_kernel_bench.sh bench``), not a timing; compile times are wall-clock on this machine.

Usage::

    python scripts/stage2_plan_resources.py --out reports/stage2_plan_resources_sm90.md
    python scripts/stage2_plan_resources.py --smoke --out /tmp/plans.md       # one small plan (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from mimo_numerics import operator as _operator
from mimo_numerics import provenance
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_bwd.cases import make_inputs

#: The benchmark shapes' class (N = P = 64, R = 4, C = 16) with every branch (Z, D, reduced DOUT); S and H small:
#: a compile depends on the constexprs and the argument specialization, not on S, H or B.
CASE = CaseSpec(seqlen=32, heads=2, state_dim=64, value_dim=64, rank=4, chunk_size=16, has_z=True, has_d=True)
SMOKE_CASE = CaseSpec(seqlen=16, heads=1, state_dim=16, value_dim=16, rank=1, chunk_size=8)
#: rows x warps (tokens: whole chunks, as the CUDA default), then the k-side kernel on rows and warps of its own.
PLANS = ("64x4", "64x8", "32x4", "32x8", "16x4", "32x4k16", "32x4k8", "32x4k64x8", "32x4k32x8", "32x4k16x2")


def run(plans, case: CaseSpec, policy: str) -> dict:
    from mimo_numerics.kernels import _devtools, mimo_bwd_bwd

    if not _devtools.nvidia_toolchain_available():
        raise SystemExit("this Triton has no NVIDIA backend with ptxas: install triton (not triton-ascend)")
    x = make_inputs(case)
    op = _operator.get("mamba_mimo_bwd_bwd")
    rows = []
    for plan in tqdm(plans, desc="stage-2 plans", unit="plan"):
        # cold compiles: a fresh Triton cache per plan (its disk cache would return a kernel that an earlier plan
        # compiled with the same constexprs, e.g. 32x4k16's k-side is 16x4's, in ms)
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="stage2_plans_triton_cache_")
        prep = mimo_bwd_bwd.build_launches(*op.args(x), **op.kwargs(x), policy=policy, backend="cuda", sm_count=132,
                                           tiles=mimo_bwd_bwd.parse_stage2_plan(plan, 16))
        for launch in prep.launches:
            start = time.perf_counter()
            usage = _devtools.resource_usage(_devtools.compile_launch(launch, arch=90))
            rows.append(dict(plan=plan, kernel=launch.name, compile_s=round(time.perf_counter() - start, 2),
                             **usage))
    label = (f"N = {case.state_dim}, P = {case.value_dim}, R = {case.rank}, C = {case.chunk_size}, {case.dtype}"
             f"{', Z' if case.has_z else ''}{', D' if case.has_d else ''}{', reduced DOUT' if case.reduce_o else ''}")
    return {"case": label, "policy": policy, "rows": rows}


def render(result: dict, prov: dict, smoke: bool) -> str:
    lines = ["# Stage 2's kernels for sm_90 under tile plans: registers, spills, size, compile time (static, CPU)", "",
             provenance.markdown_header(prov), ""]
    if smoke:
        lines += ["**Smoke run (one small plan): checks that the script runs; not the report's figures.**", ""]
    lines += [f"Policy `{result['policy']}`; case {result['case']}. `plan`: rows per program x warps (tokens: whole "
              "chunks). `regs`: registers a thread (255 is the cap); `stack`: bytes of local memory a thread "
              "(spills); `sass`: static SASS instructions; `compile s`: wall-clock of a cold compile (an empty Triton "
              "cache) on this machine, the Python front end through ptxas. A static "
              "estimate for choosing the plans a GPU run times, not a timing.", "",
              "| plan | kernel | regs | stack | sass | shared | compile s |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['plan']} | {r['kernel']} | {r['regs']} | {r['stack']} | {r['sass']} | {r['shared']} | "
              f"{r['compile_s']:.2f} |" for r in result["rows"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", default=",".join(PLANS), help="comma-separated ROWSxWARPS[kR[xW]][wN][sM] "
                        "(kernels.mimo_bwd_bwd.parse_stage2_plan; default: %(default)s)")
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--smoke", action="store_true", help="one small plan on a small case (a smoke run)")
    parser.add_argument("--out", type=Path, required=True, help="the report (.md); its JSON twin beside it")
    args = parser.parse_args(argv)
    plans = ["16x4"] if args.smoke else [p.strip() for p in args.plans.split(",") if p.strip()]
    from mimo_numerics.kernels import mimo_bwd_bwd

    for plan in plans:
        try:
            mimo_bwd_bwd.parse_stage2_plan(plan, 16)
        except ValueError as err:
            parser.error(f"--plans: {err}")
    result = run(plans, SMOKE_CASE if args.smoke else CASE, args.policy)
    prov = provenance.collect()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(result, prov, args.smoke))
    args.out.with_suffix(".json").write_text(json.dumps(dict(result, provenance=prov), indent=1, default=str))
    spills = [f"{r['plan']} {r['kernel']} ({r['stack']} B)" for r in result["rows"] if r["stack"] > 0]
    print(f"wrote {args.out}; spilling: {', '.join(spills) or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
