"""Shared set-up of tests/ops/mamba_mimo_fwd/test_fwd_reference.py, test_fwd_kernels(_gpu).py and
scripts/measure_fwd_golden.py: policies, the golden file's path, and calls of the forward reference on golden cases
and on ``mimo_numerics.cases`` inputs (the golden-case arguments and table live in the package:
``mimo_numerics.ops.mamba_mimo_fwd.golden``); the forward kernel's golden gate."""

from __future__ import annotations

import torch

from mimo_numerics import golden_data, presets, tolerances
from mimo_numerics.ops.mamba_mimo_fwd.golden import golden_args, golden_table  # noqa: F401  (re-exported)
from mimo_numerics.ops.mamba_mimo_fwd.reference import mamba_mimo_fwd
from mimo_numerics.ops.mamba_mimo_fwd.sites import SITES
from mimo_numerics.ops.mamba_mimo_fwd.spec import INPUT_NAMES

#: The whole-op golden data (tests/data/README.md), from ``mimo_numerics.golden_data``.
GOLDEN_FULL_OP = golden_data.path("full_op")
#: The presets the tests run the forward under.
PRESETS = ("upstream_sm90", "upstream_sm90_fp16", "fp32", "fp64")
OP = "mamba_mimo_fwd"


def fwd_policy(preset: str, sites=None, **knobs):
    """``preset`` with ``knobs`` and the forward's ``sites`` ({site: bool}) changed."""
    policy = presets.get(preset).replace(**knobs) if knobs else presets.get(preset)
    return policy.with_sites(OP, **sites) if sites else policy


def load_golden() -> dict:
    """The golden whole-op cases with a forward output, by name (the shared 7 and the extra H200 cases:
    ``mimo_numerics.ops.mamba3_mimo.golden``)."""
    from mimo_numerics.ops.mamba3_mimo.golden import load

    return {name: case for name, case in load().items() if case.get("fwd") is not None}


def case_policy(preset: str, case: dict, sites=None, **knobs):
    """``preset`` in the lp dtype of golden ``case`` (``upstream_sm90`` of an fp16 case is ``upstream_sm90_fp16``)."""
    lp = str(case["inputs"]["Q"].dtype).replace("torch.", "")
    if preset == "upstream_sm90" and lp == "float16":
        preset = "upstream_sm90_fp16"
    policy = fwd_policy(preset, sites=sites, **knobs)
    return policy if policy.lp_dtype == lp else policy.replace(lp_dtype=lp)


def case_args(inputs: dict) -> dict:
    """The forward's arguments from ``mimo_numerics.cases.make_inputs`` output (stage 1's inputs less dout)."""
    args = {name: inputs[name] for name in INPUT_NAMES}
    args.update(chunk_size=inputs["chunk_size"], rotary_dim_divisor=inputs["rotary_dim_divisor"])
    return args


def run_forward(args: dict, policy, **kw):
    """``mamba_mimo_fwd`` on the keyword arguments ``args`` (those of ``golden_args`` or ``case_args``)."""
    return mamba_mimo_fwd(**args, policy=policy, **kw)


def site_is_live(site: str, kw: dict, inputs: dict) -> bool:
    """Whether switching ``site`` off alone can change the output of a golden case (its branch runs).

    ``out_accum`` needs R > 2: with ``out_proj`` on, the terms are lp values, the first step ``rnd(0 + x)`` is
    exact, and at R = 2 the one remaining rounding ``rnd(x0 + x1)`` is the one the output store makes anyway.
    ``out_proj`` needs R > 1: with one rank, the rounded term is the output and the store rounds it anyway.
    """
    reduced, has_z, has_d = inputs["MIMO_Out"] is not None, inputs["Z"] is not None, inputs["D"] is not None
    live = {"phi_weight": reduced, "out_proj": reduced and kw["R"] > 1, "phi_gate": reduced and has_z,
            "out_accum": reduced and kw["R"] > 2, "gate": has_z, "d_term": has_d}
    return live.get(site, True)


def kernel_golden_rows(device) -> list:
    """Per golden case, the forward Triton kernel on ``device`` against upstream's ``fwd.o``: rel RMS under
    ``upstream_sm90`` and ``fp32`` (each in the case's lp dtype), the bit-equal fraction under ``upstream_sm90``."""
    from mimo_numerics import kernels
    from mimo_numerics.metrics import bit_equal_fraction, rel_rms

    rows = []
    for name, case in sorted(load_golden().items()):
        args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in golden_args(case).items()}
        want = case["fwd"]["o"].to(device)
        row = {"case": name, "fp16": case["inputs"]["Q"].dtype == torch.float16}
        for preset in ("upstream_sm90", "fp32"):
            got = kernels.mamba_mimo_fwd(**args, policy=case_policy(preset, case), poison=True).o
            row[preset] = rel_rms(got, want)
            if preset == "upstream_sm90":
                row["bit_equal"] = bit_equal_fraction(got, want)
        rows.append(row)
    return rows


def check_kernel_golden(device) -> list:
    """The forward reference's golden gates applied to the forward kernel on ``device`` (issue 23, acceptance 2):
    within ``fwd_golden_upstream_sm90_rel_rms`` of upstream, bit-equal on at least ``fwd_golden_bit_equal_min``
    (``_fp16``) of the elements, and ``fp32`` at least ``fwd_golden_fp32_over_sm90_ratio_min`` times further."""
    rows = kernel_golden_rows(device)
    for row in rows:
        print(row)
        assert row["upstream_sm90"] <= tolerances.get("fwd_golden_upstream_sm90_rel_rms"), row
        assert row["bit_equal"] >= tolerances.get("fwd_golden_bit_equal_min" + ("_fp16" if row["fp16"] else "")), row
        assert row["fp32"] >= tolerances.get("fwd_golden_fp32_over_sm90_ratio_min") * row["upstream_sm90"], row
    return rows
