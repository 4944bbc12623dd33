#!/usr/bin/env python
"""Profile one reference call at the headline shape with torch.profiler; prints the top ops by self time.

    python benchmarks/profile_reference.py --device cpu --policy upstream_sm90
    python benchmarks/profile_reference.py --device cuda --policy upstream_sm90 --stacks

``--stacks`` groups by python call site (the line of ``reference.py`` or ``rounding.py`` that launched the op).
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import mimo_numerics as mn
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs

from mimo_numerics.benchmark_cases import HEADLINE
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--rows", type=int, default=30, help="rows of the table")
    parser.add_argument("--stacks", action="store_true", help="group by python call site")
    args = parser.parse_args()
    inputs = make_inputs(HEADLINE, device=args.device)
    call = lambda: stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=args.policy)
    call()  # warm-up
    _sync(args.device)
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_stack=args.stacks) as prof:
        call()
        _sync(args.device)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages(group_by_stack_n=4) if args.stacks else prof.key_averages()
    print(averages.table(sort_by=key, row_limit=args.rows))


if __name__ == "__main__":
    main()
