"""One warm call of the Triton kernels on a benchmark shape, bracketed for a profiler (Nsight Compute).

    ncu --clock-control none --profile-from-start off --set full -o prof python benchmarks/profile_kernels.py --shape a
    ncu --import prof.ncu-rep --page details          # per-kernel summary; --page source --print-source sass per line

The call is made once to compile and warm up, then once more between ``cudaProfilerStart`` / ``cudaProfilerStop``
(``torch.cuda.profiler``), so ``--profile-from-start off`` captures exactly one call's launches. ``--tuning`` takes a
JSON dict of the call's ``tuning=`` overrides (keys ``kernels.TUNING_KEYS``; no numerics change). Times under a
profiler are not benchmark figures: use ``benchmarks/bench_kernels.py`` for those.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from mimo_numerics.benchmark_cases import kernel_shape
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.kernels import mimo_bwd_fwd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="a", help="a benchmark shape of benchmarks/bench_kernels.py (a, b, c, d)")
    ap.add_argument("--policy", default="upstream_sm90")
    ap.add_argument("--tuning", default="{}", help="JSON dict of tuning overrides (keys: kernels.TUNING_KEYS)")
    args = ap.parse_args(argv)
    tuning = mimo_bwd_fwd.check_tuning(json.loads(args.tuning))  # a bad key fails before the GPU is touched
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    x = make_inputs(kernel_shape(args.shape), device=torch.device("cuda"))
    prep = mimo_bwd_fwd.build_launches(*as_args(x), **as_kwargs(x), policy=args.policy, tuning=tuning)
    for launch in prep.launches:  # compile and warm up
        launch.run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for launch in prep.launches:
        launch.run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(f"{launch.name} grid {launch.grid}" for launch in prep.launches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
