#!/usr/bin/env python
"""Where the whole op's reference spends its launches: one forward + backward under torch.profiler, the operators
it starts, grouped by the line of ``mimo_numerics`` that started them.

    python benchmarks/profile_whole_op.py --device cpu --seqlen 8192 --heads 1      # op counts, cheap on CPU
    python benchmarks/profile_whole_op.py --device cuda --seqlen 8192 --heads 16    # and the device kernels
    python benchmarks/profile_whole_op.py --device cuda --seqlen 8192 --heads 16 --backend triton   # on the kernels
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy -o prof \
        python benchmarks/profile_whole_op.py --device cuda --batch 8 --seqlen 4096 --heads 32 --backend triton --ncu
    ncu --import prof.ncu-rep --csv --page details > prof.csv
    python benchmarks/ncu_summary.py prof.csv     # per kernel: time, what bounds it (reports/bench/ncu_whole_op_triton.md)

Shape: ``G=1, N=P=64, R=4, C=16``, reduced DOUT, Z, D (``bench_whole_op.py``'s fixed part), B/S/H (and N with
``--state-dim``) from the arguments. A first call warms up (and captures the CUDA graphs); the profiled call's table is printed: per source line
the count of top-level operators (each a host launch on CUDA; a graph replay counts once) and their host time, and
on CUDA the device kernels by name and time (on the H200's torch 2.11 the profiler did not link the host operators to
Python frames, so there every operator reads "(outside mimo_numerics)": use ``--cprofile`` for the host side). A
diagnostic, not a benchmark:
the figures in ``reports/bench/`` come from ``bench_whole_op.py``.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench_whole_op import FIXED, whole_op_call  # the benchmark's shape and call (benchmarks/ is on sys.path)
from mimo_numerics.ops.mamba3_mimo.cases import OpCaseSpec


def _frame(event) -> str:
    """The innermost ``mimo_numerics`` line of ``event``'s stack (walking up to the nearest parent with a stack)."""
    while event is not None:  # newer torch records Python frames as parent events named "file(line): function"
        for line in list(event.stack or ()) + [event.name]:
            if "mimo_numerics/" in line:
                return line.split("mimo_numerics/")[-1]
            if "/kernels/" in line:
                return line[line.index("/kernels/") + 1:]
        event = event.cpu_parent
    return "(outside mimo_numerics)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--backend", default="reference", choices=("reference", "triton"))
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--ncu", action="store_true",
                        help="bracket one warm call with cudaProfilerStart/Stop for `ncu --profile-from-start off` "
                             "(no torch profiler; see benchmarks/ncu_summary.py)")
    parser.add_argument("--state-dim", type=int, default=None, help="N (default the benchmark's 64)")
    parser.add_argument("--cprofile", action="store_true",
                        help="also profile the host with cProfile (cumulative time per mimo_numerics function)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sizes = dict(batch=args.batch, seqlen=args.seqlen, heads=args.heads)
    if args.state_dim is not None:
        sizes["state_dim"] = args.state_dim
    case_id = OpCaseSpec(**{**FIXED, **sizes}).case_id
    whole_op = whole_op_call(sizes, device, args.policy, args.backend)

    def call():
        whole_op()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call()
    if args.ncu:  # exactly one warm call between the markers: ncu --profile-from-start off sees its launches only
        if device.type != "cuda":
            raise SystemExit("--ncu needs --device cuda")
        torch.cuda.profiler.start()
        call()
        torch.cuda.profiler.stop()
        print(f"{case_id} under {args.policy}, backend {args.backend}: one call profiled between the markers")
        return 0
    if args.cprofile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(call)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats("mimo_numerics", args.rows)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.rows)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities, with_stack=True) as prof:
        call()
    wall_ms = (time.perf_counter() - start) * 1e3
    count, time_us = collections.Counter(), collections.Counter()
    for event in prof.events():  # host side: the top-level operators, by the line that called them
        if (event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("aten::")
                and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::"))):
            frame = _frame(event)
            count[frame] += 1
            time_us[frame] += event.self_cpu_time_total
    line = (f"{case_id} on {device} under {args.policy}, backend {args.backend}: {sum(count.values())} top-level ops "
            f"({sum(time_us.values()) / 1e3:.1f} ms of host self time)")
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        line += (f", {len(kernels)} device kernels ({sum(e.time_range.elapsed_us() for e in kernels) / 1e3:.1f} ms,"
                 " graph replays included)")
    print(line + f", profiled wall {wall_ms:.0f} ms")
    if cuda:  # the device kernels by name: what the GPU spends its time on
        by_name, n_by_name = collections.Counter(), collections.Counter()
        for e in kernels:
            by_name[e.name[:110]] += e.time_range.elapsed_us()
            n_by_name[e.name[:110]] += 1
        print(f"{'kernels':>7} {'dev ms':>8}  kernel")
        for name, us in by_name.most_common(args.rows):
            print(f"{n_by_name[name]:7d} {us / 1e3:8.2f}  {name}")
    print(f"{'ops':>7} {'host ms':>8}  line")
    for frame, n in count.most_common(args.rows):
        print(f"{n:7d} {time_us[frame] / 1e3:8.2f}  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
