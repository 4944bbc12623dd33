"""Helpers of the stage-2 (``mamba_mimo_bwd_bwd``) tests, its oracle's and the epilogue's: golden path and file, policies,
inputs, argument builders."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from mimo_numerics import golden_data, presets
from mimo_numerics.ops.mamba3_mimo import chain
from mimo_numerics.ops.mamba_mimo_bwd_fwd import reference as stage1_reference
from mimo_numerics.cases import CaseSpec
from mimo_numerics.ops.mamba_mimo_bwd_fwd.cases import make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.cancellation import (  # noqa: F401  (re-exported)
    CANCELLING_OUTPUTS, abs_term_sums, rel_to_abs_terms)
from mimo_numerics.ops.mamba_mimo_bwd_bwd.golden import golden_inputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
from mimo_numerics.ops.mamba_mimo_bwd_bwd.sites import OP_NAME, SITES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES
from mimo_numerics.ops.mamba_mimo_bwd_fwd.outputs import INPUT_NAMES as STAGE1_INPUT_NAMES

#: The whole-op golden file of the real upstream op on an H200 (tests/data/README.md; ``mimo_numerics.golden_data``).
GOLDEN_FULL_OP = golden_data.path("full_op")
PRESET_NAMES = ("upstream_sm90", "upstream_sm90_fp16", "fp32", "fp64")


def stage2_policy(name: str, sites: Optional[Dict[str, bool]] = None, **knobs):
    """Preset ``name`` with some stage-2 switches (``sites``) and knobs (``lp_dtype=...``) changed."""
    policy = presets.get(name).replace(**knobs) if knobs else presets.get(name)
    return policy.with_sites(OP_NAME, **sites) if sites else policy


def load_golden() -> dict:
    """The whole-op golden cases with a stage-2 output, name -> case dict (the shared 7 and the extra H200 cases:
    ``mimo_numerics.ops.mamba3_mimo.golden``)."""
    from mimo_numerics.ops.mamba3_mimo.golden import load

    return {name: case for name, case in load().items() if case.get("bwd_bwd") is not None}


golden_stage2_inputs = golden_inputs


def synthetic_stage2_inputs(spec: CaseSpec) -> dict:
    """Stage-2 arguments for a drawn case: stage 1's inputs (``mimo_numerics.cases``) plus ``states`` and
    ``qk_dot`` from the stage-1 reference under ``upstream_sm90`` (``upstream_sm90_fp16`` for float16 cases)."""
    inputs = make_inputs(spec)
    stage1 = stage1_reference.mamba_mimo_bwd_fwd(
        *[inputs[n] for n in STAGE1_INPUT_NAMES], chunk_size=inputs["chunk_size"],
        rotary_dim_divisor=inputs["rotary_dim_divisor"],
        policy="upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16")
    out = {name: inputs.get(name) for name in INPUT_NAMES if name not in ("states", "qk_dot")}
    out["states"], out["qk_dot"] = stage1.states, stage1.qk_dot
    out["chunk_size"], out["rotary_dim_divisor"] = inputs["chunk_size"], inputs["rotary_dim_divisor"]
    return out


def args_of(inputs: dict) -> list:
    """The 19 tensors in upstream's order."""
    return [inputs[n] for n in INPUT_NAMES]


def kwargs_of(inputs: dict) -> dict:
    """``chunk_size`` and ``rotary_dim_divisor``."""
    return {"chunk_size": inputs["chunk_size"], "rotary_dim_divisor": inputs["rotary_dim_divisor"]}


def run_reference(inputs: dict, policy, record=None):
    """``mamba_mimo_bwd_bwd`` reference on stage-2 ``inputs`` under ``policy`` (a stand-in or preset name)."""
    if isinstance(policy, str):
        policy = stage2_policy(policy)
    return mamba_mimo_bwd_bwd(*args_of(inputs), **kwargs_of(inputs), policy=policy, record=record)


# --- the stage-2 oracle's and the epilogue's helpers (the golden whole-op file, argument builders) ---

GOLDEN_FULL_OP_SHA256 = golden_data.FILES["full_op"].sha256


def load_full_op() -> dict:
    """The golden whole-op cases, ``name -> case`` (``tests/data/README.md``); cached by ``golden_data``."""
    return golden_data.load("full_op")


def case_names() -> list:
    return sorted(load_full_op())


# The argument builders and the FP64 stage-1 helper live in the package (``mimo_numerics.ops.mamba3_mimo.chain``),
# where ``mamba3_mimo``'s autograd function uses them; re-exported here for the tests and scripts that import them.
stage1_args = chain.stage1_args
stage2_args = chain.stage2_args
stage2_kwargs = chain.stage2_kwargs
epilogue_args = chain.epilogue_args
epilogue_kwargs = chain.epilogue_kwargs
stage1_oracle_fp64 = chain.stage1_oracle_fp64
