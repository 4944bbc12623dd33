#!/usr/bin/env python
"""First call of the whole op on kernels under one policy (it compiles every kernel specialization of the chain)
against the second call: the compile cost a policy sweep pays per policy.

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/bench_first_call.py --policy upstream_sm90_fp16 --dtype float16
    python benchmarks/bench_first_call.py --policy upstream_sm90_fp16 --dtype float16   # a filled disk cache
    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/bench_first_call.py --precompile ...      # compiles in parallel

``mn.mamba3_mimo(..., backend="triton")`` and ``Out.backward(dout)`` at B=1, S=``--seqlen``, H=``--heads`` (the
other sizes from :class:`~mimo_numerics.ops.mamba3_mimo.cases.OpCaseSpec`), twice in one fresh process, each call
timed to a device synchronize. Run it in a new process per policy: Triton's in-memory cache keeps what an earlier
call compiled; an empty ``TRITON_CACHE_DIR`` (Triton's own setting, it changes no result) makes the disk cache cold
too. ``--precompile``: first ``mn.precompile_mamba3_mimo`` on the same inputs (``kernels.compile_ahead``: every
specialization compiled in parallel on ``--workers`` threads, nothing run), timed and reported, then the two calls.
Prints the times; nothing is written.
"""

from __future__ import annotations

import argparse
import time

import torch

import mimo_numerics as mn
from mimo_numerics.ops.mamba3_mimo.cases import OP_INPUT_NAMES, OpCaseSpec, make_op_inputs


def _time_each_compile() -> None:
    """Print every kernel specialization's compile time as it finishes (synchronous compiles only)."""
    import triton

    started = {}

    def before(*, key, fn, **_):
        started[id(key)] = time.perf_counter()

    def after(*, key, fn, **_):
        print(f"  compiled {fn.name}: {time.perf_counter() - started.pop(id(key), time.perf_counter()):.2f} s",
              flush=True)

    triton.knobs.runtime.jit_cache_hook = before
    triton.knobs.runtime.jit_post_compile_hook = after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precompile", action="store_true", help="compile ahead in parallel before the first call")
    parser.add_argument("--workers", type=int, default=None, help="compile threads of --precompile (default: CPUs)")
    parser.add_argument("--per-kernel", action="store_true", help="print each specialization's compile time (Triton's "
                        "jit_cache_hook / jit_post_compile_hook around each compile of the first call)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda":
        raise SystemExit(f"--device must be a CUDA device (the kernels' compile cost), got {args.device!r}")
    raw = make_op_inputs(OpCaseSpec(batch=1, seqlen=args.seqlen, heads=args.heads, dtype=args.dtype))

    def call() -> None:
        leaves = [None if raw[n] is None else raw[n].to(device).requires_grad_() for n in OP_INPUT_NAMES]
        out = mn.mamba3_mimo(*leaves, chunk_size=raw["chunk_size"], rotary_dim_divisor=raw["rotary_dim_divisor"],
                             policy=args.policy, backend="triton")
        out.backward(raw["dout"].to(device).to(out.dtype))
        torch.cuda.synchronize(device)

    if args.per_kernel:
        _time_each_compile()
    if args.precompile:
        start = time.perf_counter()
        report = mn.precompile_mamba3_mimo(*[None if raw[n] is None else raw[n].to(device) for n in OP_INPUT_NAMES],
                                           raw["chunk_size"], raw["rotary_dim_divisor"], policy=args.policy,
                                           workers=args.workers)
        torch.cuda.synchronize(device)
        print(f"{args.policy}, B=1, S={args.seqlen}, H={args.heads}, {args.dtype}: precompile "
              f"{time.perf_counter() - start:.2f} s ({report.compiled} specializations from {report.launches} "
              f"launches on {report.workers} threads, parallel={report.parallel}, {report.launchers} C launchers "
              "built ahead)", flush=True)
    for index in (1, 2):
        start = time.perf_counter()
        call()
        print(f"{args.policy}, B=1, S={args.seqlen}, H={args.heads}, {args.dtype}: call {index} "
              f"{time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
