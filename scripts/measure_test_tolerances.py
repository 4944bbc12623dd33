"""Measure what the tight tolerances of the test suite guard (issue 26, Tests 3 and 4).

Each group below recomputes, on the very cases of its test, the quantity a tolerance of
``mimo_numerics/tolerances.py`` bounds, and the script writes the worst value of each over its sweep to
``reports/measurements/test_tolerances.json`` (with a short ``.md`` beside it). tolerances.py cites this file: each
entry is the worst measured value over the sweep named here times a margin stated in the entry.

The sweep runs once in this process (``native``) and, with ``--configs``, again in subprocesses under the emulated
CPUs of ``scripts/cpu_emulation_suite.sh`` (``avx2``: torch's AVX2 kernels, MKL's AVX2 path, OpenBLAS Haswell;
``scalar``: no AVX, MKL SSE4.2, OpenBLAS Nehalem), so that the worst value also covers those BLAS and vector paths
(docs/reproducibility.md). The environment variables only select the emulated CPU of a child process; they change
no result of the package.

Groups (each named after the test it measures):

* ``kernels``: ``tests/ops/mamba_mimo_bwd_fwd/test_kernels.py::test_kernels_match_reference``: the Triton kernels under the CPU interpreter
  vs the reference, same policy, on the 8 cases x policies of the test (24 pairs), per output: rel RMS, and for lp
  outputs the number of differing elements and the rel RMS one flipped lp rounding of the largest element gives
  (``one_flip``: how large a single flip, the kind of change another BLAS order makes, is on these small outputs).
* ``stage2_paths``: ``tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py`` tail / groups / strided, run as they
  are: each asserts its outputs bit-equal (``failed`` 0).
* ``stage2_state_update``: the two ``state_update`` orders of stage 2's dstates on the drawn cases with two k16
  steps (C·R > 16): rel RMS (``stage2_state_update_orders_rel_rms``).
* ``stage2_fp64``: ``test_bwd_bwd_fp64_matches_oracle`` (stage 2's fp64 preset vs its FP64 oracle on the 11 golden and
  5 drawn cases), run with the recorder (``stage2_fp64_reference_vs_oracle_rel_rms``).
* ``epilogue``: the FP32 epilogue vs the golden upstream post/autograd entries on the 7 whole-op golden cases:
  differing elements of the outputs asserted bit-equal; dTrap's bit-equal fraction and the fraction of its
  elements whose FP64 value lies within 8 fp32 ulps of an lp rounding midpoint (the elements an ulp-level change
  of torch's sigmoid could flip).
* ``golden_realistic``: ``tests/ops/mamba_mimo_bwd_fwd/test_golden_realistic.py``: the stage-1 reference under ``upstream_sm90`` /
  ``upstream_sm90_fp16`` vs the H200 outputs of the 6 realistic cases, per dtype (``golden_upstream_sm90_rel_rms``,
  ``float16.golden_upstream_sm90_rel_rms``).
* ``fwd_branches``, ``drift``, ``preprocess``: thresholds the tests used to write themselves (issue 26, Tests 4):
  the forward's upstream_sm90 vs fp32 preset on ``BRANCH_SPECS``, the FP32-level and lp-level drift of
  ``tests/test_drift.py``, the FP32 preprocessing vs its FP64 form (``tests/ops/mamba3_mimo/test_mamba3_mimo_preprocess.py``).
* ``training``: ``tests/studies/test_mamba3_mimo_training.py``: the fp64 policy's step against the FP64 layer and the
  smoke run's first step (the ``training_*`` entries).
* ``fp64_entries``: the FP64 reference/oracle entries of stage 1 and the forward, measured by running their tests
  with ``scripts/rel_rms_recorder.py`` (every rel RMS they compute is recorded; no set-up is copied here).
* ``fp64_chain``, ``whole_op_fp64``: the FP64 backward chain vs torch autograd of the FP64 model (the chain cases of
  ``tests/ops/mamba3_mimo_epilogue/test_epilogue.py``, slow ones included, its clamp case and stage 2's tail-chunk
  oracle case), and ``mamba3_mimo(policy="fp64")`` (``tests/ops/mamba3_mimo/test_mamba3_mimo_autograd.py`` and the
  float64-leaf cases of ``tests/ops/mamba3_mimo/test_newcomer_float64_leaves.py``), run with the recorder
  (``fp64_chain_vs_autograd_rel_rms``, ``whole_op_fp64_vs_autograd_rel_rms``).

The groups ``stage2_paths``, ``stage2_fp64``, ``fp64_chain``, ``whole_op_fp64`` and ``fp64_entries`` run the tests
themselves (``RECORDED``, ``BIT_EQUAL_TESTS``): pytest in a subprocess with ``scripts/rel_rms_recorder.py``, which
records every rel RMS a test computes, by calling line (a line asserting a rel RMS *above* a bound is left out: a
lower bound, not what the tolerance bounds). The others recompute their quantity here, on the tests' cases.

Usage (a few minutes per configuration on an idle 2-core machine; the kernels group is most of it)::

    python scripts/measure_test_tolerances.py --configs native,avx2,scalar
    python scripts/measure_test_tolerances.py --groups stage2_fp64 --out /tmp/x.json   # one group, elsewhere
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List

import torch
from mimo_numerics import operator as _operator
from mimo_numerics.ops.mamba_mimo_bwd_fwd import cases as stage1_cases
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "measurements" / "test_tolerances.json"

#: The emulated CPUs (scripts/cpu_emulation_suite.sh); the variables only pick the code paths of a child process.
CONFIGS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OPENBLAS_CORETYPE": "Haswell"},
    "scalar": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OPENBLAS_CORETYPE": "Nehalem"},
}


# ---------------------------------------------------------------------------------------------------- helpers
def _rel_rms(a, b) -> float:
    from mimo_numerics.metrics import rel_rms

    return float(rel_rms(a, b))


def _differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose values differ (``-0 == 0``), NaNs counted as differing."""
    return int((a != b).sum().item())


def _one_flip(x: torch.Tensor) -> float:
    """rel RMS of ``x`` with its largest element moved by one ulp of its lp dtype: ``ulp(max|x|) / ||x||``."""
    mant = {torch.bfloat16: 7, torch.float16: 10}[x.dtype]
    xf = x.double()
    top = xf.abs().max()
    norm = torch.linalg.vector_norm(xf)
    if top == 0 or norm == 0:
        return 0.0
    return float(2.0 ** (torch.floor(torch.log2(top)).item() - mant) / norm.item())


def _near_midpoint_fraction(x64: torch.Tensor, lp: torch.dtype, ulps: int = 8) -> float:
    """Fraction of the elements of the FP64 tensor ``x64`` within ``ulps`` fp32 ulps of a rounding midpoint of
    ``lp`` (where an fp32 value that moves by that much can round to the other neighbour)."""
    mant = {torch.bfloat16: 7, torch.float16: 10}[lp]
    x = x64.abs()
    x = x[x > 0]
    if x.numel() == 0:
        return 0.0
    e = torch.floor(torch.log2(x))
    lp_ulp = torch.pow(2.0, e - mant)
    frac = torch.remainder(x, lp_ulp) / lp_ulp  # position between two lp neighbours, in [0, 1)
    dist = (frac - 0.5).abs() * lp_ulp  # distance to the midpoint
    return float((dist <= ulps * torch.pow(2.0, e - 23)).double().mean().item())


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_cases():
    """The cases of tests/ops/mamba_mimo_bwd_fwd/test_kernels.py (CASES) and the policies each is gated under (``_policies_for``)."""
    import mimo_numerics as mn
    from mimo_numerics.cases import CaseSpec

    c = CaseSpec
    cases = (
        c(seqlen=13, state_dim=16, value_dim=16, rank=3, chunk_size=6, has_z=True, has_d=True),
        c(batch=2, heads=4, groups=2, seqlen=12, state_dim=16, value_dim=32, rank=2, chunk_size=8),
        c(formula="realistic", seqlen=24, heads=2, groups=1, state_dim=32, value_dim=16, rank=2, chunk_size=8,
          reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2),
        c(seqlen=20, state_dim=32, value_dim=16, rank=1, chunk_size=16, reduce_o=False, has_d=True),
        c(formula="realistic", seqlen=16, state_dim=16, value_dim=16, rank=4, chunk_size=4, has_z=True),
        c(seqlen=11, state_dim=16, value_dim=16, rank=2, chunk_size=8, reduce_o=False),
        c(seqlen=19, heads=2, groups=2, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True,
          dtype="float16"),
        c(seqlen=12, state_dim=16, value_dim=16, rank=1, chunk_size=4, reduce_o=False, has_z=True, dtype="float16",
          rotary_dim_divisor=2),
    )
    out = []
    for spec in cases:
        if spec.dtype == "bfloat16":
            pols = [(n, mn.presets.get(n)) for n in ("fp32", "seed_bf16", "upstream_sm90")]
        else:
            pols = [("upstream_sm90_fp16", mn.presets.get("upstream_sm90_fp16"))] + [
                (f"{n}@fp16", mn.presets.get(n).replace(lp_dtype="float16")) for n in ("fp32", "seed_bf16")]
        out += [(spec, name, pol) for name, pol in pols]
    return out


def measure_kernels() -> dict:
    import mimo_numerics as mn
    from mimo_numerics import kernels
    from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs
    from mimo_numerics.metrics import ulp_distance
    from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import OUTPUT_NAMES

    rows = []
    for spec, name, policy in kernel_cases():
        x = make_inputs(spec)
        got = kernels.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy, poison=True)
        ref = stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)
        for o in OUTPUT_NAMES:
            a, b = getattr(got, o), getattr(ref, o)
            if b is None:
                continue
            row = {"case": f"{spec.case_id}-{name}", "output": o, "rel_rms": _rel_rms(a.float(), b.float()),
                   "differing": _differing(a, b), "numel": b.numel()}
            if b.dtype in (torch.bfloat16, torch.float16):
                row["one_flip"] = _one_flip(b)
                row["max_ulps"] = int(ulp_distance(a, b, b.dtype).abs().max().item())
            rows.append(row)
    lp = [r for r in rows if "one_flip" in r]
    fp32 = [r for r in rows if "one_flip" not in r]
    return {
        "cases": sorted({r["case"] for r in rows}),
        "rows": rows,
        "worst_rel_rms": max(r["rel_rms"] for r in rows),
        "worst_lp_rel_rms": max(r["rel_rms"] for r in lp),
        "worst_fp32_rel_rms": max(r["rel_rms"] for r in fp32),
        "max_lp_differing": max(r["differing"] for r in lp),
        "max_lp_ulps": max(r["max_ulps"] for r in lp),
        "max_one_flip": max(r["one_flip"] for r in lp),
        "pairs_exactly_equal": sum(all(r["differing"] == 0 for r in rows if r["case"] == c)
                                   for c in {r["case"] for r in rows}),
    }


def measure_fwd_kernels() -> dict:
    """The forward Triton kernel under the interpreter vs the forward reference, on the cases and policies of
    ``tests/ops/mamba_mimo_fwd/test_fwd_kernels.py`` (``ops.mamba_mimo_fwd.cases.kernel_cases``)."""
    from mimo_numerics import kernels
    from mimo_numerics.metrics import ulp_distance
    from mimo_numerics.ops.mamba_mimo_fwd.cases import kernel_cases, kernel_policies, make_inputs
    from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd

    op = _operator.get("mamba_mimo_fwd")
    rows = []
    for spec in kernel_cases():
        x = make_inputs(spec)
        args, kw = op.args(x), op.kwargs(x)
        for name, policy in kernel_policies(spec):
            got = kernels.mamba_mimo_fwd(*args, **kw, policy=policy, poison=True).o
            want = mamba_mimo_fwd(*args, **kw, policy=policy).o
            rows.append({"case": f"{spec.case_id}-{name}", "rel_rms": _rel_rms(got.float(), want.float()),
                         "differing": _differing(got, want), "numel": want.numel(),
                         "max_ulps": int(ulp_distance(got, want, want.dtype).abs().max().item())})
    return {"rows": rows, "worst_rel_rms": max(r["rel_rms"] for r in rows),
            "max_lp_differing": max(r["differing"] for r in rows), "max_lp_ulps": max(r["max_ulps"] for r in rows)}


def measure_stage2_kernels() -> dict:
    """The stage-2 Triton kernels under the interpreter vs the stage-2 reference, on the cases and policies of
    ``tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_kernels.py`` (the forward kernel's case list)."""
    from mimo_numerics import kernels
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.cases import make_inputs
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import OUTPUT_NAMES
    from mimo_numerics.ops.mamba_mimo_fwd.cases import kernel_cases, kernel_policies

    op = _operator.get("mamba_mimo_bwd_bwd")
    rows = []
    for spec in kernel_cases():
        x = make_inputs(spec)
        args, kw = op.args(x), op.kwargs(x)
        for name, policy in kernel_policies(spec):
            got = kernels.mamba_mimo_bwd_bwd(*args, **kw, policy=policy, poison=True)
            want = mamba_mimo_bwd_bwd(*args, **kw, policy=policy)
            for o in OUTPUT_NAMES:
                if getattr(want, o) is not None:
                    rows.append({"case": f"{spec.case_id}-{name}", "output": o,
                                 "rel_rms": _rel_rms(getattr(got, o).float(), getattr(want, o).float())})
    return {"rows": rows, "worst_rel_rms": max(r["rel_rms"] for r in rows)}


# ---------------------------------------------------------------------------------------------------- stage 2
def stage2_synthetic_specs():
    """SYNTHETIC of tests/ops/mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py."""
    from mimo_numerics.cases import CaseSpec

    return [
        CaseSpec(seqlen=40, state_dim=16, value_dim=16, rank=1, chunk_size=16, has_z=True, has_d=True,
                 formula="realistic", seed=21),
        CaseSpec(batch=2, seqlen=32, heads=2, state_dim=16, value_dim=32, rank=2, chunk_size=8, reduce_o=False,
                 has_z=True, formula="realistic", seed=22),
        CaseSpec(seqlen=27, heads=2, state_dim=32, value_dim=16, rank=4, chunk_size=8, has_z=True, has_d=True,
                 dtype="float16", formula="realistic", seed=23),
        CaseSpec(seqlen=20, heads=4, groups=2, state_dim=16, value_dim=16, rank=8, chunk_size=4, reduce_o=False,
                 has_d=True, seed=24),
        CaseSpec(seqlen=24, state_dim=32, value_dim=16, rank=4, chunk_size=8, formula="realistic", seed=25,
                 rotary_dim_divisor=2),
    ]


def _stage2_inputs(spec) -> dict:
    """Stage-2 arguments of a drawn case: stage 1's inputs plus states and qk_dot from the stage-1 reference under
    upstream_sm90 (upstream_sm90_fp16 for float16), as the tests' ``synthetic_stage2_inputs``."""
    import mimo_numerics as mn
    from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES

    x = make_inputs(spec)
    s1 = stage1_reference.mamba_mimo_bwd_fwd(*[x[n] for n in mn.INPUT_NAMES], chunk_size=x["chunk_size"],
                                         rotary_dim_divisor=x["rotary_dim_divisor"],
                                         policy="upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16")
    out = {n: x.get(n) for n in INPUT_NAMES if n not in ("states", "qk_dot")}
    out["states"], out["qk_dot"] = s1.states, s1.qk_dot
    out["chunk_size"], out["rotary_dim_divisor"] = x["chunk_size"], x["rotary_dim_divisor"]
    return out


def _stage2_policy(name: str, inputs: dict, **knobs):
    from mimo_numerics import presets

    lp = "float16" if inputs["q"].dtype == torch.float16 else "bfloat16"
    if name == "upstream_sm90" and lp == "float16":
        name = "upstream_sm90_fp16"
        return presets.get(name).replace(**knobs) if knobs else presets.get(name)
    return presets.get(name).replace(lp_dtype=lp, **knobs)


def _stage2_run(inputs: dict, policy, record=None):
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
    from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES

    return mamba_mimo_bwd_bwd(*[inputs[n] for n in INPUT_NAMES], chunk_size=inputs["chunk_size"],
                              rotary_dim_divisor=inputs["rotary_dim_divisor"], policy=policy, record=record)


def measure_stage2_state_update() -> dict:
    rows = []
    for spec in stage2_synthetic_specs():
        if spec.chunk_size * spec.rank <= 16:
            continue  # one k16 step: the two orders are the same sum
        inputs = _stage2_inputs(spec)
        rec_a, rec_b = {}, {}
        _stage2_run(inputs, _stage2_policy("upstream_sm90", inputs), record=rec_a)
        _stage2_run(inputs, _stage2_policy("upstream_sm90", inputs, state_update="separate"), record=rec_b)
        rows.append({"case": spec.case_id, "rel_rms": _rel_rms(rec_a["dstates"], rec_b["dstates"]),
                     "differing": _differing(rec_a["dstates"], rec_b["dstates"])})
    return {"cases": [r["case"] for r in rows], "rows": rows, "worst_rel_rms": max(r["rel_rms"] for r in rows)}


# ---------------------------------------------------------------------------------------------------- epilogue
def measure_epilogue() -> dict:
    from mimo_numerics.metrics import bit_equal_fraction
    from mimo_numerics.ops.mamba3_mimo.chain import epilogue_args, epilogue_kwargs
    from mimo_numerics.ops.mamba3_mimo_epilogue.oracle import mamba3_mimo_epilogue_oracle
    from mimo_numerics.ops.mamba3_mimo_epilogue.reference import mamba3_mimo_epilogue_reference
    from mimo_numerics.ops.mamba3_mimo_epilogue.spec import GRAD_NAMES, POST_NAMES

    exact = ("dQ", "dK", "dV", "dZ", "dQ_bias", "dK_bias", "dMIMO_V", "dMIMO_Z", "dMIMO_Out", "dD")
    golden = torch.load(ROOT / "tests" / "data" / "upstream_h200_full_op_cases.pt", weights_only=True)
    rows = []
    for name in sorted(golden):
        case = golden[name]
        inputs = case["inputs"]
        args = epilogue_args(inputs, case["pre"], case["bwd_fwd"], case["bwd_bwd"])
        kwargs = epilogue_kwargs(inputs)
        got = mamba3_mimo_epilogue_reference(*args, **kwargs)
        orc = mamba3_mimo_epilogue_oracle(*args, **kwargs)
        targets = {k: v for k, v in case["autograd"].items() if k in GRAD_NAMES}
        for post_name, key in POST_NAMES.items():
            targets[key] = case["post"][post_name]
        row = {"case": name, "exact_differing": sum(_differing(got[o], targets[o]) for o in exact
                                                    if targets.get(o) is not None)}
        row["dTrap_bit_equal"] = float(bit_equal_fraction(got["dTrap"], targets["dTrap"]))
        row["dTrap_near_midpoint_8ulp"] = _near_midpoint_fraction(orc["dTrap"], inputs["Q"].dtype)
        rows.append(row)
    return {"cases": [r["case"] for r in rows], "rows": rows,
            "max_exact_differing": max(r["exact_differing"] for r in rows),
            "min_dTrap_bit_equal": min(r["dTrap_bit_equal"] for r in rows),
            "max_dTrap_near_midpoint_8ulp": max(r["dTrap_near_midpoint_8ulp"] for r in rows)}


# ---------------------------------------------------------------------------------------------------- realistic golden
def measure_golden_realistic() -> dict:
    import mimo_numerics as mn
    from mimo_numerics.cases import CaseSpec
    from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import as_args, as_kwargs, make_inputs

    data = torch.load(ROOT / "tests" / "data" / "upstream_h200_realistic_outputs.pt", weights_only=True)
    rows = []
    for name, case in sorted(data["cases"].items()):
        spec = CaseSpec.from_dict(case["spec"])
        policy = {"bfloat16": "upstream_sm90", "float16": "upstream_sm90_fp16"}[spec.dtype]
        x = make_inputs(spec)
        out = stage1_reference.mamba_mimo_bwd_fwd(*as_args(x), **as_kwargs(x), policy=policy)
        for o, want in case["upstream"].items():
            if want is not None:
                rows.append({"case": name, "dtype": spec.dtype, "output": o,
                             "rel_rms": _rel_rms(getattr(out, o), want)})
    res = {"cases": sorted(data["cases"]), "rows": rows}
    for dt in ("bfloat16", "float16"):
        sel = [r for r in rows if r["dtype"] == dt]
        worst = max(sel, key=lambda r: r["rel_rms"])
        res[f"worst_{dt}_rel_rms"] = worst["rel_rms"]
        res[f"worst_{dt}_at"] = f"{worst['case']}:{worst['output']}"
    return res


# ---------------------------------------------------------------------------------------------------- thresholds
def measure_fwd_branches() -> dict:
    """tests/ops/mamba_mimo_fwd/test_fwd_reference.py::test_fwd_branches_give_upstream_layout_and_finite_values: rel RMS of the forward
    under upstream_sm90 (upstream_sm90_fp16) against the fp32 preset on the 5 BRANCH_SPECS."""
    from mimo_numerics import presets
    from mimo_numerics.cases import CaseSpec
    from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs
    from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd
    from mimo_numerics.ops.mamba_mimo_fwd.spec import INPUT_NAMES

    specs = [CaseSpec(seqlen=13, state_dim=16, value_dim=8, rank=2, chunk_size=4, reduce_o=ro, has_z=hz, has_d=hd,
                      seed=s)
             for s, (ro, hz, hd) in enumerate([(True, False, False), (True, True, False), (False, False, True),
                                               (False, True, True)])]
    specs.append(CaseSpec(seqlen=11, heads=4, groups=2, state_dim=16, value_dim=8, rank=3, chunk_size=4, has_z=True,
                          has_d=True, dtype="float16", seed=9))
    rows = []
    for spec in specs:
        x = make_inputs(spec)
        args = dict({n: x[n] for n in INPUT_NAMES}, chunk_size=x["chunk_size"],
                    rotary_dim_divisor=x["rotary_dim_divisor"])
        sm90 = presets.get("upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16")
        o = mamba_mimo_fwd(**args, policy=sm90).o
        fp32 = mamba_mimo_fwd(**args, policy=presets.get("fp32").replace(lp_dtype=spec.dtype)).o
        rows.append({"case": spec.case_id, "rel_rms": _rel_rms(o, fp32)})
    return {"cases": [r["case"] for r in rows], "rows": rows, "worst_rel_rms": max(r["rel_rms"] for r in rows),
            "least_rel_rms": min(r["rel_rms"] for r in rows)}


def measure_drift() -> dict:
    """tests/test_drift.py: the per-stage drift levels of the TINY case (fp32 preset and upstream_sm90 vs fp64), the
    kernel emulation run vs the reference, and the golden device run's dmimo_o."""
    from mimo_numerics import cases, drift
    from mimo_numerics.ops.mamba_mimo_bwd_fwd import golden

    tiny = stage1_cases.make_inputs(cases.CaseSpec(seqlen=20, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True,
                                            has_d=True))
    runs = drift.standard_runs(tiny, ("fp32", "seed_bf16", "upstream_sm90"), emulation_policy=None)
    pivot = drift.stage_drift(runs, "fp64").pivot()
    fp32, bf16 = pivot["fp32"], pivot["upstream_sm90"]
    out = {"fp32_internal_max": max(fp32[s] for s in drift.STAGES[:23]),
           "bf16_entry_stages_min": min(bf16[s] for s in ("q_biased", "psiv", "state", "out", "dz_accum")),
           "bf16_before_q_biased_max": max([bf16[s] for s in drift.STAGES[:drift.STAGES.index("q_biased")]] or [0.0]),
           "fp32_output_states": fp32["output.states"], "fp32_output_dmimo_o": fp32["output.dmimo_o"]}
    small = stage1_cases.make_inputs(cases.CaseSpec(seqlen=8, state_dim=16, value_dim=16, rank=2, chunk_size=4,
                                             has_z=True))
    if drift.kernels_available():
        table = drift.stage_drift({"kernel": drift.kernel_run(small, "seed_bf16")},
                                  drift.reference_run(small, "seed_bf16"))
        out["kernel_vs_reference_max"] = max(r.rel_rms for r in table.rows)
    inputs, upstream = golden.golden_case(golden.DEFAULT_CASE)
    runs = drift.standard_runs(inputs, ("seed_bf16", "upstream_sm90"), device_outputs=upstream,
                               device_label="device")
    out["device_output_dmimo_o"] = drift.stage_drift(runs, "upstream_sm90").pivot()["device"]["output.dmimo_o"]
    return out


def measure_preprocess() -> dict:
    """tests/ops/mamba3_mimo/test_mamba3_mimo_preprocess.py: dacs_segsum float32 vs float64 (the test's draws; worst |error| over
    (2e-7 + 2e-6 |fp64|), assert_close's measure), and the float32 angle_cumsum (C = 8, 16) vs the float64 one
    (wrapped max |error|)."""
    from mimo_numerics.studies import measure
    from mimo_numerics.ops.mamba3_mimo.preprocess import angle_cumsum, dacs_segsum

    def draw(shape, seed, positive_fraction=0.0):  # the test's _draw
        gen = torch.Generator().manual_seed(seed)
        x = -torch.rand(shape, generator=gen, dtype=torch.float64) * 0.2
        return x + positive_fraction * 0.2 if positive_fraction else x

    dacs = {"max_abs": 0.0, "max_rel": 0.0}
    for seqlen, chunk in ((13, 4), (40, 16), (64, 32), (128, 64)):
        adt = draw((2, 2, seqlen), seed=seqlen, positive_fraction=0.5).float()
        for got, want in zip(dacs_segsum(adt, chunk, math_dtype=torch.float32),
                             dacs_segsum(adt, chunk, math_dtype=torch.float64)):
            err = (got.double() - want).abs()
            dacs["max_abs"] = max(dacs["max_abs"], float(err.max()))
            dacs["max_rel"] = max(dacs["max_rel"], float((err / want.abs().clamp_min(1e-30)).max()))
    gen = torch.Generator().manual_seed(3)
    angles = 2 * torch.rand(1, 37, 2, 4, generator=gen)
    dt = torch.rand(1, 2, 37, generator=gen) * 0.5
    ref = angle_cumsum(angles, dt, 8, math_dtype=torch.float64)
    wrapped = max(measure.wrapped_max_abs(angle_cumsum(angles, dt, c, math_dtype=torch.float32), ref) for c in (8, 16))
    return {"dacs_fp32_max_abs": dacs["max_abs"], "dacs_fp32_max_rel": dacs["max_rel"],
            "angle_cumsum_fp32_wrapped_max_abs": float(wrapped)}


def measure_training() -> dict:
    """tests/studies/test_mamba3_mimo_training.py: under ``fp64`` the op's gradients against the independent FP64
    layer (``training.TINY_LAYER``/``TINY_TASK``, seeds 0-5: loss, the bf16-stored ``in_proj`` gradient and the
    float32 parameters), and the smoke run's first step (default layer and task, seeds 0-4): the spread of the
    first losses over its three policies and ``upstream_sm90``'s first ``MIMO_V`` gradient error over ``fp64``'s."""
    from mimo_numerics.studies import training

    out = {"fp64_loss_rel": 0.0, "fp64_in_proj_min": math.inf, "fp64_in_proj_max": 0.0, "fp64_fp32_params_max": 0.0,
           "smoke_first_loss_spread_max": 0.0, "smoke_first_mimo_v_ratio_min": math.inf}
    layer, task = training.TINY_LAYER, training.TINY_TASK
    for seed in range(6):
        params = training.init_params(layer, seed=seed)
        x, y = training.make_batch(layer, task, training.teacher(layer, task, seed), seed, step=0)
        loss, grads, values = training.policy_step(params, x, y, layer, "fp64")
        loss64, grads64 = training.fp64_step(params, x, y, layer, op_values=values)
        out["fp64_loss_rel"] = max(out["fp64_loss_rel"], abs(loss - loss64) / abs(loss64))
        for name in training.PARAM_NAMES:
            err = _rel_rms(grads[name], grads64[name])
            if name == "in_proj":
                out["fp64_in_proj_min"] = min(out["fp64_in_proj_min"], err)
                out["fp64_in_proj_max"] = max(out["fp64_in_proj_max"], err)
            else:
                out["fp64_fp32_params_max"] = max(out["fp64_fp32_params_max"], err)
    layer, task = training.LayerConfig(), training.TaskConfig()
    for seed in range(5):
        first = {label: training.train(layer, task, label, seed, 1) for label in training.SMOKE_POLICIES}
        losses = [run["loss"][0] for run in first.values()]
        out["smoke_first_loss_spread_max"] = max(out["smoke_first_loss_spread_max"], max(losses) / min(losses) - 1)
        ratio = first["upstream_sm90"]["grad_rel_rms"]["MIMO_V"][0] / first["fp64"]["grad_rel_rms"]["MIMO_V"][0]
        out["smoke_first_mimo_v_ratio_min"] = min(out["smoke_first_mimo_v_ratio_min"], ratio)
    return out


# ---------------------------------------------------------------------------------------------------- the tests' own values
# These groups measure by running the tests themselves: pytest with scripts/rel_rms_recorder.py records every rel RMS
# a test computes (the values its assertions bound), so no test set-up is copied here.
_TESTS = "tests/ops/"
#: per group, per quantity: the tests whose rel RMS values it is the worst of (each test is a node id prefix; a
#: parametrized test counts with all its cases; slow-marked ones included)
RECORDED = {
    "stage2_fp64": {"worst_rel_rms": [
        _TESTS + "mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py::test_bwd_bwd_fp64_matches_oracle"]},
    "fp64_chain": {"worst_rel_rms": [
        _TESTS + "mamba3_mimo_epilogue/test_epilogue.py::test_fp64_chain_equals_autograd_of_fp64_forward",
        _TESTS + "mamba3_mimo_epilogue/test_epilogue.py::test_fp64_chain_equals_autograd_of_fp64_forward_slow",
        _TESTS + "mamba3_mimo_epilogue/test_epilogue.py::test_fp64_chain_follows_upstream_through_the_clamp",
        _TESTS + "mamba_mimo_bwd_bwd/test_bwd_bwd_oracle.py::test_bwd_bwd_oracle_with_a_tail_chunk_gives_the_gradients"]},
    "whole_op_fp64": {"worst_rel_rms": [
        _TESTS + "mamba3_mimo/test_mamba3_mimo_autograd.py::test_fp64_backward_equals_autograd_of_the_fp64_model",
        _TESTS + "mamba3_mimo/test_mamba3_mimo_autograd.py::test_fp64_backward_equals_autograd_of_the_fp64_model_slow",
        _TESTS + "mamba3_mimo/test_mamba3_mimo_autograd.py::test_fp64_forward_equals_the_fp64_model",
        _TESTS + "mamba3_mimo/test_newcomer_float64_leaves.py::test_float64_leaves_off_the_lp_grid_match_the_fp64_model"]},
    "fp64_entries": {
        "fp64_reference_vs_oracle_rel_rms": [
            _TESTS + "mamba_mimo_bwd_fwd/test_reference.py::test_reference_fp64_matches_oracle",
            "tests/test_reliability_properties.py::test_fp64_reference_matches_oracle",
            "tests/studies/test_mamba3_mimo_report.py::test_fp64_stages_agree_with_the_fp64_oracles"],
        "fwd_oracle_vs_fp64_model_rel_rms": [
            _TESTS + "mamba_mimo_fwd/test_fwd_oracle.py::test_fwd_oracle_matches_the_fp64_model"],
        "fwd_fp64_identity_rel_rms": [
            _TESTS + "mamba_mimo_fwd/test_fwd_reference.py::test_fwd_fp64_output_does_not_depend_on_the_chunk_size",
            _TESTS + "mamba_mimo_fwd/test_fwd_reference.py::test_fwd_fp64_one_token_closed_form",
            _TESTS + "mamba_mimo_fwd/test_fwd_reference.py::test_fwd_fp64_gqa_equals_the_expanded_groups"]},
}
#: tests that assert bit-equality (``torch.equal``) of two paths: passing means 0 differing elements
BIT_EQUAL_TESTS = {"stage2_paths": [
    _TESTS + "mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py::test_bwd_bwd_tail_chunk_equals_the_padded_sequence",
    _TESTS + "mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py::test_bwd_bwd_groups_map_heads_as_expanded_heads",
    _TESTS + "mamba_mimo_bwd_bwd/test_bwd_bwd_reference.py::test_bwd_bwd_strided_inputs_give_the_same_outputs"]}


def _run_tests(tests: List[str], record: bool = True) -> dict:
    """Run ``tests`` (node ids: ``path::test`` runs every case of a parametrized test; ``slow`` ones too) with pytest in a subprocess, the recorder
    loaded; ``{nodeid: {"calls", "max", "nan"}}`` of the rel RMS values, and ``"__returncode__"``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rel_rms.json"
        env = dict(os.environ, MIMO_REL_RMS_RECORD=str(out),
                   PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "rel_rms_recorder", "-p",
                               "no:cacheprovider", "-m", "slow or not slow", *tests],
                              env=env, cwd=ROOT)
        values = json.loads(out.read_text()) if out.is_file() else {}
    values["__returncode__"] = done.returncode
    return values


def _matches(node: str, test: str) -> bool:
    return node == test or node.startswith(test + "[")


#: a calling line that asserts a rel RMS *above* a bound (``rel_rms(...) > x``): a lower bound, not what an upper
#: tolerance bounds, so its values are left out
_LOWER_BOUND = re.compile(r"rel_rms\(.*\)\s*>[^=]")


def _bounded_calls(by_caller: dict) -> List[dict]:
    return [v for v in by_caller.values() if not _LOWER_BOUND.search(v["source"])]


def measure_recorded(group: str) -> dict:
    """The worst rel RMS each quantity of ``RECORDED[group]`` bounds, over the tests named for it, with the number of
    values and the worst test case (a test whose values the recorder did not see, or that fails, is an error)."""
    quantities = RECORDED[group]
    values = _run_tests([t for tests in quantities.values() for t in tests])
    if values.pop("__returncode__"):
        raise RuntimeError(f"{group}: a measured test failed (see its output above)")
    out = {}
    for quantity, tests in quantities.items():
        worst, calls, worst_at = 0.0, 0, None
        for test in tests:
            hits = [(node, v) for node, by_caller in values.items() if _matches(node, test)
                    for v in _bounded_calls(by_caller)]
            if not sum(v["calls"] for _, v in hits):
                raise RuntimeError(f"{test}: the recorder saw no rel RMS (renamed test, or rel_rms bound otherwise)")
            if any(v["nan"] for _, v in hits):
                raise RuntimeError(f"{test}: a NaN rel RMS")
            for node, v in hits:
                calls += v["calls"]
                if v["max"] > worst:
                    worst, worst_at = v["max"], node
        out[quantity], out[quantity + "_values"], out[quantity + "_worst_at"] = worst, calls, worst_at
    return out


def measure_bit_equal(group: str) -> dict:
    """``failed``: how many of ``BIT_EQUAL_TESTS[group]`` fail (0: every compared output bit-equal)."""
    tests = BIT_EQUAL_TESTS[group]
    values = _run_tests(tests)
    return {"tests": len(tests), "failed": 0 if values["__returncode__"] == 0 else len(tests)}


GROUPS: Dict[str, Callable[[], dict]] = {
    "kernels": measure_kernels,
    "fwd_kernels": measure_fwd_kernels,
    "stage2_kernels": measure_stage2_kernels,
    "stage2_paths": lambda: measure_bit_equal("stage2_paths"),
    "stage2_state_update": measure_stage2_state_update,
    "stage2_fp64": lambda: measure_recorded("stage2_fp64"),
    "epilogue": measure_epilogue,
    "golden_realistic": measure_golden_realistic,
    "fwd_branches": measure_fwd_branches,
    "drift": measure_drift,
    "preprocess": measure_preprocess,
    "fp64_chain": lambda: measure_recorded("fp64_chain"),
    "whole_op_fp64": lambda: measure_recorded("whole_op_fp64"),
    "training": measure_training,
    "fp64_entries": lambda: measure_recorded("fp64_entries"),
}

#: per group, the summary keys to take the worst of over the configurations, and whether worst means max or min
SUMMARY = {
    "kernels": {"worst_rel_rms": max, "worst_lp_rel_rms": max, "worst_fp32_rel_rms": max, "max_lp_differing": max,
                "max_lp_ulps": max, "max_one_flip": max, "pairs_exactly_equal": min},
    "fwd_kernels": {"worst_rel_rms": max, "max_lp_differing": max, "max_lp_ulps": max},
    "stage2_kernels": {"worst_rel_rms": max},
    "stage2_paths": {"failed": max},
    "stage2_state_update": {"worst_rel_rms": max},
    "epilogue": {"max_exact_differing": max, "min_dTrap_bit_equal": min, "max_dTrap_near_midpoint_8ulp": max},
    "golden_realistic": {"worst_bfloat16_rel_rms": max, "worst_float16_rel_rms": max},
    "fwd_branches": {"worst_rel_rms": max, "least_rel_rms": min},
    "drift": {"fp32_internal_max": max, "bf16_entry_stages_min": min, "bf16_before_q_biased_max": max,
              "fp32_output_states": min, "fp32_output_dmimo_o": max, "kernel_vs_reference_max": max,
              "device_output_dmimo_o": max},
    "preprocess": {"dacs_fp32_max_abs": max, "dacs_fp32_max_rel": max, "angle_cumsum_fp32_wrapped_max_abs": max},
    "training": {"fp64_loss_rel": max, "fp64_in_proj_min": min, "fp64_in_proj_max": max, "fp64_fp32_params_max": max,
                 "smoke_first_loss_spread_max": max, "smoke_first_mimo_v_ratio_min": min},
    **{group: {**{q: max for q in quantities}, **{q + "_values": min for q in quantities}}
       for group, quantities in RECORDED.items()},
}


# ---------------------------------------------------------------------------------------------------- driver
def _provenance(argv: List[str]) -> dict:
    """mimo_numerics.provenance's record of this run (commit, ``git describe --dirty``, command, versions, machine)."""
    from mimo_numerics import provenance

    return provenance.collect(command=" ".join(["python", "scripts/measure_test_tolerances.py"] + argv))


def run_groups(groups: List[str]) -> dict:
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    for g in groups:
        out[g] = GROUPS[g]()
    return out


def _child(config: str, groups: List[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "child.json"
        env = dict(os.environ, **CONFIGS[config])
        cmd = [sys.executable, __file__, "--child", str(path), "--groups", ",".join(groups)]
        subprocess.run(cmd, env=env, check=True, cwd=ROOT)
        return json.loads(path.read_text())


def _grouped(result: dict) -> dict:
    """``{group: {provenance, configs, worst, by_config}}`` of a result file (also of the one-run layout, where
    provenance, configs and by_config are shared by every group)."""
    if "by_group" in result:
        return result["by_group"]
    return {g: {"provenance": result["provenance"], "configs": result["configs"], "worst": result["worst"][g],
                "by_config": {c: result["by_config"][c][g] for c in result["configs"]}} for g in result["groups"]}


def _markdown(by_group: dict) -> str:
    lines = ["# What the test tolerances guard: measured worst values", "",
             "Generated by `scripts/measure_test_tolerances.py` (the command of each group below). Data: "
             "`test_tolerances.json` beside this file; the tolerances citing it are in `mimo_numerics/tolerances.py`. "
             "Configurations: the emulated CPUs of `scripts/cpu_emulation_suite.sh` (docs/reproducibility.md).", ""]
    runs = {}
    for g, r in by_group.items():
        p = r["provenance"]
        clean = {True: "source tree clean", False: "source tree NOT clean"}.get(p.get("source_clean"), "tree unknown")
        runs.setdefault((p["command"], p["describe"], clean, p["machine"]["cpu"], p["versions"]["torch"]),
                        []).append(g)
    for (command, describe, clean, cpu, torch_version), groups in runs.items():
        lines.append(f"* `{command}` at commit `{describe}` ({clean}; `-dirty` counts `reports/` too), {cpu}, "
                     f"torch {torch_version}: {', '.join(groups)}")
    lines += ["", "| group | quantity | worst over the configurations | per configuration |", "|---|---|---|---|"]
    for g, r in by_group.items():
        for k, v in r["worst"].items():
            per = ", ".join(f"{c} {r['by_config'][c][k]:.3g}" for c in r["configs"])
            lines.append(f"| {g} | `{k}` | {v:.3g} | {per} |")
    lines += ["", "Cases of each group: the `cases` lists in the JSON (the tests' own case lists).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="native", help="comma-separated, of " + ", ".join(CONFIGS))
    ap.add_argument("--groups", default=",".join(GROUPS), help="comma-separated, of " + ", ".join(GROUPS))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--update", action="store_true",
                    help="keep the other groups of an existing --out file (each group records its own run)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown groups {unknown}; known: {list(GROUPS)}")
    if args.child:
        args.child.write_text(json.dumps(run_groups(groups)))
        return 0
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configurations {bad}; known: {list(CONFIGS)}")
    provenance = _provenance(argv)  # before measuring: the tree that runs
    by_config = {}
    for c in configs:
        print(f"measuring {groups} under {c}", flush=True)
        by_config[c] = run_groups(groups) if c == "native" else _child(c, groups)
    by_group = _grouped(json.loads(args.out.read_text())) if args.update and args.out.is_file() else {}
    for g in groups:
        by_group[g] = {"provenance": provenance, "configs": configs,
                       "worst": {k: agg(by_config[c][g][k] for c in configs) for k, agg in SUMMARY[g].items()},
                       "by_config": {c: dict(by_config[c][g], cpu_capability=by_config[c]["cpu_capability"],
                                             threads=by_config[c]["threads"]) for c in configs}}
    by_group = {g: by_group[g] for g in GROUPS if g in by_group}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"by_group": by_group}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(_markdown(by_group))
    print(json.dumps({g: by_group[g]["worst"] for g in groups}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
