#!/usr/bin/env python
"""The tensor-core models of ``gemm_model`` against the GPU's own tensor cores, bit for bit.

A Triton kernel computes ``C + A @ B`` (one [M, N] tile, K in steps of ``--k-step`` through ``tl.dot(a, b, acc)``,
ascending k, as upstream's GEMMs accumulate) on random low-precision operands whose exponents spread over
``2^±spread`` (alignment truncation), with zeros, fp16 subnormals and accumulators that cancel the product. On an
sm_90 GPU Triton issues ``wgmma`` (m64nNk16) for these tiles, on sm_80 ``mma.sync`` m16n8k16; the result must
equal :func:`mimo_numerics.tensor_core.tensor_core_matmul` under ``sm90_wgmma`` / ``sm80_mma`` on every element.
The script prints one line per draw and writes a JSON summary (mismatching elements per draw, and how many of the
elements plain FP32 accumulation would have got wrong, which shows the draw can tell the models apart).

Run on the GPU (repository root; CUDA torch and Triton)::

    python scripts/check_tensor_core_model.py --out reports/tensor_core_model_h200.json

It needs CUDA: Triton's CPU interpreter computes ``tl.dot`` with numpy in FP32, not with a tensor core.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from mimo_numerics.tensor_core import tensor_core_matmul

LP = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def dot_chain(a_ptr, b_ptr, c_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  KSTEP: tl.constexpr):
        rows, cols = tl.arange(0, M), tl.arange(0, N)
        acc = tl.load(c_ptr + rows[:, None] * N + cols[None, :])
        for k0 in tl.static_range(0, K, KSTEP):
            ks = k0 + tl.arange(0, KSTEP)
            a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
            b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
            acc = tl.dot(a, b, acc)
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc)

    return dot_chain


def _draw(shape, fmt, spread, generator):
    mantissa = torch.randn(shape, generator=generator)
    exponent = torch.randint(-spread, spread + 1, shape, generator=generator).float()
    x = (mantissa * torch.exp2(exponent)).to(LP[fmt])
    x[torch.rand(shape, generator=generator) < 0.05] = 0
    return x


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON summary path")
    parser.add_argument("--model", default=None, help="gemm_model to compare (default: from the GPU's capability)")
    parser.add_argument("--k-step", type=int, default=16, help="K of one tl.dot (16: one wgmma k16 per step)")
    parser.add_argument("--draws", type=int, default=8, help="random draws per format and spread")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_tensor_core_model.py needs a CUDA GPU (the interpreter has no tensor core)", file=sys.stderr)
        return 2
    major, _ = torch.cuda.get_device_capability()
    model = args.model or ("sm90_wgmma" if major >= 9 else "sm80_mma")
    kernel = _kernel()
    M, N, K = 64, 64, 64
    generator = torch.Generator().manual_seed(0)
    rows, total_mismatch = [], 0
    for fmt in ("bfloat16", "float16"):
        for spread in (2, 9, 40 if fmt == "bfloat16" else 12):
            for draw in range(args.draws):
                a, b = _draw((M, K), fmt, spread, generator), _draw((K, N), fmt, spread, generator)
                c = torch.randn(M, N, generator=generator) * 2.0 ** spread
                c[::3] = -(a.double() @ b.double())[::3].float()  # cancel the product on every third row
                out = torch.empty(M, N, device="cuda")
                kernel[(1,)](a.cuda(), b.cuda(), c.cuda(), out, M=M, N=N, K=K, KSTEP=args.k_step)
                got = out.cpu()
                want = tensor_core_matmul(a.float(), b.float(), c, model, fmt)
                plain = (c.double() + a.double() @ b.double()).float()
                mismatch = int((got.view(torch.int32) != want.view(torch.int32)).sum())
                separable = int((plain.view(torch.int32) != want.view(torch.int32)).sum())
                total_mismatch += mismatch
                rows.append({"format": fmt, "spread": spread, "draw": draw, "mismatch": mismatch,
                             "plain_fp32_differs": separable})
                print(f"{fmt} spread {spread} draw {draw}: {mismatch} of {M * N} differ from {model} "
                      f"(plain FP32 accumulation differs on {separable})")
    summary = {"device": torch.cuda.get_device_name(), "model": model, "k_step": args.k_step,
               "shape": [M, N, K], "total_mismatch": total_mismatch, "draws": rows,
               "torch": torch.__version__}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"{model}: {total_mismatch} mismatching elements in {len(rows)} draws")
    return 0 if total_mismatch == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
