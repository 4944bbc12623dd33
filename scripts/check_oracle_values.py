#!/usr/bin/env python
"""Prove a rewrite of the FP64 oracles value-preserving: save their outputs, then compare to a relative tolerance
(not a test).

The FP64 oracles are not bit-stable under a change of summation order (a blocked sum rounds differently from a
whole-sequence one, by a few ulp), so unlike ``check_reference_bits.py`` this compares values:
``max |new - old| / max |old|`` per tensor, NaN and infinity positions equal. Targets and cases are those of
``check_reference_bits.py`` (``--quick``: the registered operators' smoke and gate grids and stress cases, the
epilogue and the whole op on the quick whole-op cases; without ``--quick`` also the sweep cases and the longer
whole-op cases):

* every registered operator: ``Operator.run_oracle`` on its cases, drawn in bf16 and fp16;
* the epilogue: its FP64 oracle on the inputs the whole op hands it (``EpilogueTarget.draw``);
* the whole op: ``mn.mamba3_mimo(..., policy="fp64")``, forward and backward (the chain of every FP64 oracle).

Usage::

    python scripts/check_oracle_values.py save --baseline /tmp/oracles.pt [--quick]
    python scripts/check_oracle_values.py compare --baseline /tmp/oracles.pt [--quick] [--tol 1e-12]

Exit status 0 when every tensor agrees within ``--tol`` on the entries finite before and now, and has its
non-finite entries where they were, 1 otherwise (each offender is printed). In the stress cases with a NaN and
infinities in the inputs the non-finite entries are listed, not checked: the oracles are no non-finite reference
(``docs/nonfinite.md``: their masked weights are exact zeros that multiply every token's values, so where a NaN
spreads depends on how the sums are grouped).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from mimo_numerics.metrics import max_rel

ROOT = Path(__file__).resolve().parents[1]
#: Case labels of check_reference_bits.py's stress cases with a NaN and infinities in the inputs.
NONFINITE_STRESS = "stress-nan_inf"


def _bits_module():
    spec = importlib.util.spec_from_file_location("check_reference_bits", ROOT / "scripts" / "check_reference_bits.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_reference_bits"] = module
    spec.loader.exec_module(module)
    return module


def _oracle_entries(bits, target, inputs) -> Dict[str, Optional[torch.Tensor]]:
    if isinstance(target, bits.OperatorTarget):
        outputs = target.op.run_oracle(inputs)
        return dict(zip(target.op.output_names, outputs))
    if isinstance(target, bits.EpilogueTarget):
        from mimo_numerics.ops.mamba3_mimo_epilogue.oracle import mamba3_mimo_epilogue_oracle

        return dict(mamba3_mimo_epilogue_oracle(**inputs))
    from mimo_numerics import presets

    lp = inputs["Q"].dtype
    policy = presets.get("fp64")
    if lp != policy.lp_torch_dtype:
        policy = policy.replace(lp_dtype=str(lp).replace("torch.", ""))
    return target.run(inputs, policy, None)


def collect(quick: bool, only: Optional[str] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Every oracle output of the plan (of target ``only`` if given), keyed ``target|case|lp|entry`` (float64, CPU)."""
    bits = _bits_module()
    out: Dict[str, Optional[torch.Tensor]] = {}
    for name, make in bits.all_targets().items():
        if only is not None and name != only:
            continue
        target = make()
        lps = ("bfloat16", "float16")
        for case in target.cases(quick, None, False):
            for lp in lps:
                inputs = target.draw(case, lp)
                for entry, value in _oracle_entries(bits, target, inputs).items():
                    out[f"{name}|{case.label}|{lp}|{entry}"] = None if value is None else value.detach().cpu()
        print(f"{name}: {sum(k.startswith(name + '|') for k in out)} tensors", flush=True)
    return out


def relative_difference(new: torch.Tensor, old: torch.Tensor) -> Tuple[float, str]:
    """``max |new - old| / max |old|`` over the entries finite in both, and whether the non-finite entries are the
    same (``"same"``) or not (``"changed"``; inf for a shape change)."""
    if new.shape != old.shape:
        return math.inf, "changed"
    new, old = new.double(), old.double()
    bad_new, bad_old = ~torch.isfinite(new), ~torch.isfinite(old)
    same = torch.equal(bad_new, bad_old) and torch.equal(new[bad_new].nan_to_num(nan=7.0),
                                                         old[bad_old].nan_to_num(nan=7.0))
    pattern = "same" if same else "changed"
    both = ~(bad_new | bad_old)
    return max_rel(new[both], old[both]), pattern


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("save", "compare"))
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tol", type=float, default=1e-12)
    parser.add_argument("--target", default=None, help="compare one target only (an operator, "
                        "mamba3_mimo_epilogue or mamba3_mimo)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    values = collect(args.quick, args.target)
    if args.command == "save":
        torch.save(values, args.baseline)
        print(f"saved {len(values)} tensors to {args.baseline} in {time.perf_counter() - start:.0f} s")
        return 0
    old = torch.load(args.baseline)
    bad, changed, worst = [], [], (0.0, "")
    if args.target is not None:
        old = {key: value for key, value in old.items() if key.startswith(args.target + "|")}
    for key in sorted(set(old) | set(values)):
        a, b = values.get(key, "missing"), old.get(key, "missing")
        if isinstance(a, str) or isinstance(b, str) or (a is None) != (b is None):
            bad.append(f"{key}: present {a is not None and not isinstance(a, str)} now, "
                       f"{b is not None and not isinstance(b, str)} before")
            continue
        if a is None:
            continue
        rel, pattern = relative_difference(a, b)
        worst = max(worst, (rel, key))
        if not rel <= args.tol:
            bad.append(f"{key}: relative difference {rel:.3g} > {args.tol:g}")
        if pattern == "changed":
            line = (f"{key}: {int((~torch.isfinite(a)).sum())} non-finite entries now "
                    f"({int(a.isnan().sum())} NaN), {int((~torch.isfinite(b)).sum())} before ({int(b.isnan().sum())} NaN)")
            (changed if key.split("|")[1].startswith(NONFINITE_STRESS) else bad).append(line)
    if changed:
        print(f"non-finite entries changed in the {NONFINITE_STRESS} cases (reported, not checked: the oracles are "
              "no non-finite reference, docs/nonfinite.md):")
        print("\n".join("  " + line for line in changed))
    print("\n".join(bad))
    print(f"{len(values)} tensors compared in {time.perf_counter() - start:.0f} s; worst {worst[0]:.3g} ({worst[1]}); "
          f"{len(bad)} over {args.tol:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
