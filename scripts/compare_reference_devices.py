#!/usr/bin/env python
"""Run the policy reference on CPU and on another device over the golden cases and a few longer realistic cases.

Reports per case and output the rel RMS between devices (FP32 summation-order noise of one implementation) and
each device's rel RMS against the real upstream outputs. Writes ``reports/reference_devices_<device>.md``.

    python scripts/compare_reference_devices.py --device cuda
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import mimo_numerics as mn
from mimo_numerics import provenance
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
from mimo_numerics.metrics import bit_equal_fraction, rel_rms
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

ROOT = Path(__file__).resolve().parents[1]
LONG_CASES = [
    CaseSpec(batch=2, seqlen=256, heads=2, reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=1),
    CaseSpec(batch=1, seqlen=2048, heads=2, reduce_o=True, has_z=True, has_d=True, formula="realistic", seed=2),
    CaseSpec(batch=1, seqlen=1024, heads=1, state_dim=128, reduce_o=True, has_z=True, has_d=True,
             formula="realistic", seed=3),
]


def _to(inputs: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _run(inputs: dict, policy: str):
    return stage1_reference.mamba_mimo_bwd_fwd(*as_args(inputs), **as_kwargs(inputs), policy=policy)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--policy", default="upstream_sm90")
    parser.add_argument("--out", default=str(ROOT / "reports"))
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        device_name = torch.cuda.get_device_name(args.device)
    else:
        device_name = args.device
    golden = torch.load(ROOT / "tests" / "data" / "upstream_h200_seed_cases.pt", weights_only=True)
    cases = [(name, case["inputs"], case["upstream"]) for name, case in sorted(golden.items())]
    cases += [(spec.case_id, make_inputs(spec), None) for spec in LONG_CASES]
    lines = [f"# Reference on CPU vs {device_name}, policy {args.policy}", "",
             provenance.markdown_header() + " rel RMS (bit-equal fraction for lp outputs).", "",
             "| case | output | CPU vs device | CPU vs upstream | device vs upstream |", "|---|---|---|---|---|"]
    worst = 0.0
    for name, inputs, upstream in cases:
        cpu = _run(inputs, args.policy)
        dev = _run(_to(inputs, args.device), args.policy)
        for output in mn.OUTPUT_NAMES:
            a, b = getattr(cpu, output), getattr(dev, output)
            if a is None:
                continue
            b = b.cpu()
            err = rel_rms(b, a)
            worst = max(worst, err)
            cell = f"{err:.2e}" + (f" ({bit_equal_fraction(b, a):.4f})" if a.dtype != torch.float32 else "")
            up = upstream[output] if upstream else None
            up_cpu = f"{rel_rms(a, up):.2e}" if up is not None else "–"
            up_dev = f"{rel_rms(b, up):.2e}" if up is not None else "–"
            lines.append(f"| {name} | {output} | {cell} | {up_cpu} | {up_dev} |")
    lines += ["", f"Largest CPU-vs-device rel RMS: {worst:.2e}"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"reference_devices_{args.device.split(':')[0]}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-8:]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
