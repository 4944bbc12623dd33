#!/usr/bin/env python
"""Exhaustive probe of the GPU's fast-math special functions (MUFU), the measurement behind issue 24's
``special_functions`` knob.

Upstream's kernels are compiled with fast math: ``exp`` is ``ex2.approx.ftz.f32`` of ``x·log2 e``, ``sin``/``cos``
are ``sin/cos.approx.ftz.f32`` (an ``FMUL.RZ`` by 1/2π, then ``MUFU.SIN/COS``), ``tanh`` is ``tanh.approx.f32``
and a division is ``rcp.approx.ftz.f32`` times the numerator. A CPU model of them must be bit-exact, which only an
exhaustive measurement can establish. For every function this script runs the PTX instruction (Triton inline
assembly) on **all 2^32 float32 bit patterns**, in chunks, and records

* the histogram of its distance in ulps to the correctly rounded value (float64 math on the GPU), with the counts
  of non-finite disagreements;
* structure probes that decide what a compact table must hold:
  ``ex2``: whether ``ex2(x) = 2^⌊x⌋ · ex2(x − ⌊x⌋)`` for every x (range reduction), and the fewest fraction bits F
  such that ``ex2(x) = ex2(⌊x·2^F⌋ / 2^F)`` on [0, 1) (a fixed-point input, as MUFU's range reduction suggests);
  ``sin``/``cos``: how many low mantissa bits of x can be cleared on [0, 2π) without changing any output;
  ``tanh``, ``rcp``: the same quantisation probe on [1, 2) (``rcp`` is scale-invariant in the exponent, which the
  range-reduction probe checks as for ``ex2``);
* for ``ex2`` on [0, 1) at that F (when F <= 24): the table of its outputs on the grid j / 2^F as int8 ulp offsets
  from the correctly rounded 2^x (``mufu_ex2_table.npz``), the table a CPU emulation would use.

Run on the H200 (repository root; CUDA torch and Triton), about a minute of GPU time per function::

    python scripts/probe_mufu.py --out $OUT/mufu            # writes summary.json and the tables

Needs CUDA: Triton's interpreter cannot run PTX.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

#: PTX of each function (one f32 in, one f32 out), as nvcc emits it under --use_fast_math.
PTX = {
    "ex2": "ex2.approx.ftz.f32 $0, $1;",
    "sin": "sin.approx.ftz.f32 $0, $1;",
    "cos": "cos.approx.ftz.f32 $0, $1;",
    "tanh": "tanh.approx.f32 $0, $1;",
    "rcp": "rcp.approx.ftz.f32 $0, $1;",
}
#: The correctly rounded function in float64 (torch, on the GPU).
EXACT = {"ex2": torch.exp2, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "rcp": torch.reciprocal}
CHUNK = 1 << 26
BLOCK = 1024


def _kernels():
    import triton
    import triton.language as tl

    def make(asm):
        @triton.jit
        def run(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
            y = tl.inline_asm_elementwise(asm, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
            tl.store(y_ptr + offs, y, mask=mask)
        return run

    return {name: make(asm) for name, asm in PTX.items()}


def apply(kernel, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    kernel[(triton_cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def bits_range(start: int, stop: int) -> torch.Tensor:
    """float32 values of the bit patterns [start, stop) (uint32 order), on the GPU."""
    return torch.arange(start, stop, dtype=torch.int64, device="cuda").to(torch.int32).view(torch.float32)


def ulp_distance(got: torch.Tensor, exact64: torch.Tensor) -> torch.Tensor:
    """got − RN32(exact) in ulps (int64; the ordered-integer distance, so it is defined across binades)."""
    want = exact64.to(torch.float32)

    def ordered(v):
        i = v.view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)

    return ordered(got) - ordered(want)


def histogram(name: str, kernel) -> dict:
    counts = {}
    nonfinite_mismatch = 0
    for start in range(0, 1 << 32, CHUNK):
        x = bits_range(start, start + CHUNK)
        got = apply(kernel, x)
        exact = EXACT[name](x.double())
        finite = torch.isfinite(got) & torch.isfinite(exact.float())
        nonfinite_mismatch += int((~finite & ~(got.isnan() & exact.isnan()) & (got != exact.float())).sum())
        d = ulp_distance(got[finite], exact[finite]).clamp(-64, 64)
        values, n = torch.unique(d, return_counts=True)
        for v, c in zip(values.tolist(), n.tolist()):
            counts[v] = counts.get(v, 0) + c
    return {"ulp_histogram": dict(sorted(counts.items())), "nonfinite_mismatch": nonfinite_mismatch}


def quantisation(kernel, lo: float, hi: float, max_bits: int = 12) -> dict:
    """For x in [lo, hi): the largest k such that clearing the k low mantissa bits of x never changes the output."""
    start = int(torch.tensor(lo, dtype=torch.float32).view(torch.int32))
    stop = int(torch.tensor(hi, dtype=torch.float32).view(torch.int32))
    result = {}
    for k in range(1, max_bits + 1):
        changed = 0
        for s in range(start, stop, CHUNK):
            x = bits_range(s, min(s + CHUNK, stop))
            cleared = (x.view(torch.int32) & ~((1 << k) - 1)).view(torch.float32)
            changed += int((apply(kernel, x).view(torch.int32) != apply(kernel, cleared).view(torch.int32)).sum())
        result[k] = changed
        if changed:
            break
    invariant = [k for k, c in result.items() if c == 0]
    return {"cleared_bits_without_change": max(invariant, default=0), "changes_at_next": result}


def fixed_point_ex2(kernel, fractions=range(16, 25)) -> dict:
    """For x in [0, 1): per F, how many x have ex2(x) != ex2(trunc(x·2^F) / 2^F); the smallest F with none."""
    stop = int(torch.tensor(1.0, dtype=torch.float32).view(torch.int32))
    changed = {}
    for F in fractions:
        count = 0
        for s in range(0, stop, CHUNK):
            x = bits_range(s, min(s + CHUNK, stop))
            grid = torch.trunc(x.double() * 2.0 ** F) / 2.0 ** F  # exact in float32 too for F <= 24 on [0, 1)
            count += int((apply(kernel, x) != apply(kernel, grid.float())).sum())
        changed[F] = count
        if count == 0:
            break
    exact = [F for F, c in changed.items() if c == 0]
    return {"fraction_bits": min(exact) if exact else None, "changed_per_F": changed}


def range_reduction_ex2(kernel) -> dict:
    """Count x with a normal result where ex2(x) != 2^floor(x) · ex2(x − floor(x))."""
    from mimo_numerics.tensor_core import pow2

    bad = total = 0
    for start in range(0, 1 << 32, CHUNK):
        x = bits_range(start, start + CHUNK)
        x = x[torch.isfinite(x) & (x.abs() < 126)]
        whole = torch.floor(x)
        frac = x - whole  # exact for |x| < 2^23
        got = apply(kernel, x)
        recon = (apply(kernel, frac).double() * pow2(whole.to(torch.int32))).float()
        normal = got.abs() >= torch.finfo(torch.float32).tiny
        bad += int((normal & (got != recon)).sum())
        total += int(normal.sum())
    return {"violations": bad, "normal_results": total}


def ex2_table(kernel, fraction_bits: int) -> np.ndarray:
    """ex2 on the grid j / 2^F of [0, 1): int8 offsets in ulps from RN32(2^x)."""
    offsets = []
    for s in range(0, 1 << fraction_bits, CHUNK):
        j = torch.arange(s, min(s + CHUNK, 1 << fraction_bits), device="cuda", dtype=torch.float64)
        x = (j / 2.0 ** fraction_bits).float()
        offsets.append(ulp_distance(apply(kernel, x), torch.exp2(x.double())).clamp(-127, 127).to(torch.int8).cpu())
    return torch.cat(offsets).numpy()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--functions", nargs="+", default=list(PTX), choices=list(PTX))
    parser.add_argument("--skip-histogram", action="store_true", help="structure probes and tables only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_mufu.py needs a CUDA GPU (Triton's interpreter cannot run PTX)", file=sys.stderr)
        return 2
    kernels = _kernels()
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "functions": {}}
    domains = {"ex2": (0.0, 1.0), "sin": (0.0, 2 * math.pi), "cos": (0.0, 2 * math.pi), "tanh": (1.0, 2.0),
               "rcp": (1.0, 2.0)}
    for name in args.functions:
        t0 = time.time()
        entry = {} if args.skip_histogram else histogram(name, kernels[name])
        entry["quantisation"] = {f"[{domains[name][0]:.6g}, {domains[name][1]:.6g})":
                                 quantisation(kernels[name], *domains[name])}
        if name == "ex2":
            entry["range_reduction"] = range_reduction_ex2(kernels[name])
            entry["fixed_point"] = fixed_point_ex2(kernels[name])
            F = entry["fixed_point"]["fraction_bits"]
            if F is not None and F <= 24:
                table = ex2_table(kernels[name], F)
                np.savez_compressed(args.out / "mufu_ex2_table.npz", offsets=table, fraction_bits=F)
                values, counts = np.unique(table, return_counts=True)
                entry["table"] = {"entries": int(table.size), "fraction_bits": F,
                                  "offset_counts": {int(v): int(c) for v, c in zip(values, counts)}}
        entry["seconds"] = round(time.time() - t0, 1)
        summary["functions"][name] = entry
        print(name, json.dumps(entry)[:400], flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
