"""Helpers of the stage-2 (``mamba_mimo_bwd_bwd``) tests and scripts: golden path, policies, inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import torch

from mimo_numerics import presets
from mimo_numerics import reference as stage1_reference
from mimo_numerics.cases import CaseSpec, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
from mimo_numerics.ops.mamba_mimo_bwd_bwd.sites import OP_NAME, SITES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES
from mimo_numerics.outputs import INPUT_NAMES as STAGE1_INPUT_NAMES

#: The whole-op golden file of the real upstream op on an H200 (tests/data/README.md); the ONE place the path is set.
GOLDEN_FULL_OP = Path(__file__).parent / "data" / "upstream_h200_full_op_cases.pt"
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


def golden_stage2_inputs(case: dict) -> dict:
    """Stage-2 arguments by name from a golden case: raw inputs, the ``pre`` tensors, stage 1's outputs, ``dout``."""
    inp, pre, bwd_fwd = case["inputs"], case["pre"], case["bwd_fwd"]
    return {
        "dout": inp["dout"], "q": inp["Q"], "k": inp["K"], "v": inp["V"], "q_bias": inp["Q_bias"],
        "k_bias": inp["K_bias"], "mimo_v": inp["MIMO_V"], "mimo_o": inp["MIMO_Out"], "states": bwd_fwd["states"],
        "z": inp["Z"], "mimo_z": inp["MIMO_Z"], "angles": pre["angles_cumsum"], "da_cs": pre["da_cs"],
        "da_cs_rev": pre["da_cs_rev"], "dt": inp["DT"], "trap": inp["Trap"], "d": inp["D"],
        "qk_dot": bwd_fwd["qk_dot"], "segsum": pre["segsum"],
        "chunk_size": inp["chunk_size"], "rotary_dim_divisor": inp["rotary_dim_divisor"],
    }


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


#: Outputs whose last sum cancels heavily; their errors are also judged against Σ|terms| (abs_term_sums).
CANCELLING_OUTPUTS = ("dD", "ddA", "dangles")


def abs_term_sums(inputs: dict) -> dict:
    """Σ|terms| of the last sum of dD ``[B, H]``, ddA ``[B, H, S]`` and dangles ``[B, S, H, N/d]``, in FP64.

    Computed from the reference's record under the ``fp64`` preset: dD sums the ``dd_terms`` (t, r, p), ddA the
    ``dda_terms`` of its chunk (n, p), dangles the four ``dangles_terms`` of every rank. None where an output is.
    """
    record = {}
    lp = "float16" if inputs["q"].dtype == torch.float16 else "bfloat16"
    out = run_reference(inputs, presets.get("fp64").replace(lp_dtype=lp), record=record)
    C, S = inputs["chunk_size"], inputs["q"].shape[1]
    sums = {"dD": None if out.dD is None else record["dd_terms"].abs().sum(dim=(2, 3, 4))}
    sums["ddA"] = record["dda_terms"].abs().sum(dim=(-1, -2)).repeat_interleave(C, dim=2)[:, :, :S]
    sums["dangles"] = record["dangles_terms"].abs().sum(dim=(3, 4)).permute(0, 2, 1, 3)
    return sums


def rel_to_abs_terms(actual: torch.Tensor, expected: torch.Tensor, abs_sums: torch.Tensor) -> float:
    """``||actual − expected||₂ / ||Σ|terms|||₂``: the error on the scale of the summed magnitudes (FP64)."""
    diff = actual.to(torch.float64) - expected.to(torch.float64)
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(abs_sums.to(torch.float64))).item()
