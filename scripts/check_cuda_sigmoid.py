#!/usr/bin/env python
"""Check the model of torch's CUDA ``sigmoid`` and ``exp`` (float32) against the GPU on every float32 bit pattern.

The decode step's gate ``σ(trap_proj)`` is formed by ``Mamba3.step`` with ``torch.sigmoid`` on the device, outside
the kernels; under ``special_functions="fast_sm90"`` the package models it as torch's CUDA kernel on the H200
(``SpecialFunctions.torch_sigmoid``: ``1 / (1 + expf(−x))``, CUDA's accurate ``expf`` as
``mimo_numerics.ops._common.special.cuda_expf``). This script runs ``torch.sigmoid`` and ``torch.exp`` on the GPU and
the models on the same GPU, chunk by chunk over all 2^32 float32 inputs (or every ``--stride``-th), and counts the
inputs whose bits differ (NaN equal to NaN), with examples. ``--device cpu`` (a smoke run: there is no CUDA kernel
to compare with) reports only the models' distance from the correctly rounded values (float64 rounded once).

Usage::

    python scripts/check_cuda_sigmoid.py --out $OUT/cuda_sigmoid.md              # on the GPU machine
    python scripts/check_cuda_sigmoid.py --device cpu --stride 65537 --out /tmp/s.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from mimo_numerics import envinfo, provenance
from mimo_numerics.ops._common.special import SpecialFunctions, cuda_expf

ALL = 1 << 32
CHUNK = 1 << 24
EXAMPLES = 8


def _inputs(start: int, count: int, stride: int, device) -> torch.Tensor:
    """float32 values of the bit patterns ``start + i·stride`` (i < count) on ``device``."""
    bits = torch.arange(count, dtype=torch.int64, device=device) * stride + start
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)
    return bits.view(torch.float32)


def _differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    both_nan = torch.isnan(a) & torch.isnan(b)
    return (a.view(torch.int32) != b.view(torch.int32)) & ~both_nan


def _ulps_from_exact(model: torch.Tensor, exact64: torch.Tensor) -> torch.Tensor:
    """|model − exact| in float32 ulps of the correctly rounded value (finite, normal results only)."""
    rounded = exact64.float()
    ulp = (torch.nextafter(rounded.abs(), torch.full_like(rounded, float("inf"))) - rounded.abs()).double()
    ok = torch.isfinite(rounded) & (rounded.abs() >= torch.finfo(torch.float32).tiny)
    return torch.where(ok, (model.double() - exact64).abs() / ulp, torch.zeros_like(exact64))


def run(device: str, stride: int) -> dict:
    functions = SpecialFunctions("fast_sm90")
    total = -(-ALL // stride)
    checks = {"sigmoid": dict(model=functions.torch_sigmoid, torch=torch.sigmoid,
                              exact=lambda x: torch.sigmoid(x.double())),
              "exp": dict(model=cuda_expf, torch=torch.exp, exact=lambda x: torch.exp(x.double()))}
    result = {name: {"mismatches": 0, "examples": [], "max_ulps_from_exact": 0.0} for name in checks}
    on_gpu = torch.device(device).type == "cuda"
    started = time.perf_counter()
    for first in tqdm(range(0, total, CHUNK), desc=f"float32 inputs (stride {stride})", unit="chunk"):
        count = min(CHUNK, total - first)
        x = _inputs(first * stride, count, stride, device)
        for name, check in checks.items():
            model = check["model"](x)
            entry = result[name]
            entry["max_ulps_from_exact"] = max(entry["max_ulps_from_exact"],
                                               _ulps_from_exact(model, check["exact"](x)).max().item())
            if not on_gpu:
                continue
            differ = _differ(model, check["torch"](x))
            entry["mismatches"] += int(differ.sum().item())
            if differ.any() and len(entry["examples"]) < EXAMPLES:
                where = differ.nonzero().flatten()[: EXAMPLES - len(entry["examples"])]
                gpu = check["torch"](x[where])
                entry["examples"] += [{"x": float(a), "x_bits": f"{int(b) & 0xFFFFFFFF:08x}", "model": float(m),
                                       "gpu": float(g)}
                                      for a, b, m, g in zip(x[where].tolist(), x[where].view(torch.int32).tolist(),
                                                            model[where].tolist(), gpu.tolist())]
    return {"device": device, "device_name": envinfo.device_name(device), "stride": stride, "inputs": total,
            "compared_with_gpu": on_gpu, "seconds": round(time.perf_counter() - started, 1), "functions": result}


def render(result: dict, prov: dict) -> str:
    lines = ["# torch's CUDA `sigmoid` and `exp` (float32) against the package's models, every float32 input", "",
             provenance.markdown_header(prov), ""] + (
             ["**Smoke run (a strided subset, no CUDA): checks that the script runs; not the report's figures.**", ""]
             if result["stride"] > 1 or not result["compared_with_gpu"] else []) + [
             "`SpecialFunctions(\"fast_sm90\").torch_sigmoid` (`1 / (1 + expf(-x))`, IEEE division) and `cuda_expf` "
             "(CUDA's accurate `expf`: range reduction by two FMAs, MUFU.EX2 by the table model, the scale by 2^n "
             "rounded once), run on the same device as torch; NaN counts as equal to NaN. `ulps from exact`: the "
             "model against the correctly rounded value (float64 rounded once; normal results).", "",
             f"Inputs: {result['inputs']} float32 bit patterns (every {result['stride']}-th) on "
             f"{result['device_name']}, {result['seconds']} s.", "",
             "| function | inputs differing from torch on the GPU | largest ulps from exact |", "|---|---|---|"]
    for name, entry in result["functions"].items():
        differing = entry["mismatches"] if result["compared_with_gpu"] else "not compared (no CUDA)"
        lines.append(f"| `{name}` | {differing} | {entry['max_ulps_from_exact']:.3g} |")
    for name, entry in result["functions"].items():
        if entry["examples"]:
            lines += ["", f"Examples for `{name}`:", "", "| x | bits | model | GPU |", "|---|---|---|---|"]
            lines += [f"| {e['x']!r} | {e['x_bits']} | {e['model']!r} | {e['gpu']!r} |" for e in entry["examples"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stride", type=int, default=1, help="check every stride-th bit pattern (default: all)")
    parser.add_argument("--out", type=Path, required=True, help="the report (.md); its JSON twin beside it")
    args = parser.parse_args(argv)
    if args.stride < 1:
        parser.error(f"--stride must be >= 1, got {args.stride}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("check_cuda_sigmoid.py needs a CUDA GPU (or --device cpu for a smoke run that compares nothing with "
              "the GPU)", file=sys.stderr)
        return 2
    result = run(args.device, args.stride)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance.collect()
    args.out.write_text(render(result, prov))
    args.out.with_suffix(".json").write_text(json.dumps(dict(result, provenance=prov), indent=1))
    print(f"wrote {args.out}: " + ", ".join(f"{n} {e['mismatches']} differing" for n, e in result["functions"].items()))
    return 1 if any(e["mismatches"] for e in result["functions"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
