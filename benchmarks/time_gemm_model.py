#!/usr/bin/env python
"""Seconds per call of stage 1's reference with FP32 GEMMs and with the tensor-core model, on the realistic golden
cases (``tests/data/upstream_h200_realistic_outputs.pt``, inputs regenerated), each timed after one warm-up call.

    python benchmarks/time_gemm_model.py [--device cpu|cuda]

Prints one line per case: the seconds under ``gemm_model="fp32"`` (on CPU the blocked CPU path) and
``"sm90_wgmma"`` (the generic path with ``mimo_numerics.tensor_core``), and their ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

import mimo_numerics as mn
from mimo_numerics import golden_data
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_fwd.reference import mamba_mimo_bwd_fwd


def seconds(x: dict, policy, device: str) -> float:
    mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)  # warm-up (layouts, caches)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    for name, case in golden_data.load("realistic_outputs")["cases"].items():
        x = make_inputs(CaseSpec.from_dict(case["spec"]), device=args.device)
        base = mn.presets.get("upstream_sm90" if x["q"].dtype == torch.bfloat16 else "upstream_sm90_fp16")
        t = {m: seconds(x, base.replace(gemm_model=m), args.device) for m in ("fp32", "sm90_wgmma")}
        print(f"{name}: fp32 {t['fp32']:.3f} s, sm90_wgmma {t['sm90_wgmma']:.2f} s, "
              f"ratio {t['sm90_wgmma'] / t['fp32']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
