#!/usr/bin/env python
"""Profile one reference call at the headline shape with torch.profiler; prints the top ops by device time.

    python scripts/profile_reference.py --device cuda --policy upstream_sm90
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import mimo_numerics as mn
from mimo_numerics.cases import as_args, as_kwargs, make_inputs

from bench_reference import HEADLINE


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--policy", default="upstream_sm90")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    inputs = make_inputs(HEADLINE, device=args.device)
    call = lambda: mn.reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=args.policy)
    call()
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        call()
        torch.cuda.synchronize()
    key = "cuda_time_total" if args.device.startswith("cuda") else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))


if __name__ == "__main__":
    main()
