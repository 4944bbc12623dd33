"""Helpers of the stage-2 (``mamba_mimo_bwd_bwd``) tests and scripts: golden path, stand-in policies, inputs.

The real ``RoundingPolicy`` with a ``mamba_mimo_bwd_bwd`` section is built by the integrator from ``sites.SITES``;
until then :func:`standin_policy` builds a ``types.SimpleNamespace`` with the same fields (the operator contract's
presets ``upstream_sm90``, ``upstream_sm90_fp16``, ``fp32`` and ``fp64``).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Dict, Optional

import torch

from mimo_numerics import reference as stage1_reference
from mimo_numerics.cases import CaseSpec, make_inputs
from mimo_numerics.ops.mamba_mimo_bwd_bwd.reference import mamba_mimo_bwd_bwd
from mimo_numerics.ops.mamba_mimo_bwd_bwd.sites import OP_NAME, SITES
from mimo_numerics.ops.mamba_mimo_bwd_bwd.spec import INPUT_NAMES
from mimo_numerics.outputs import INPUT_NAMES as STAGE1_INPUT_NAMES

#: The whole-op golden file of the real upstream op on an H200 (README beside it); the ONE place the path is set.
GOLDEN_FULL_OP = Path("/work/shared/golden/upstream_h200_full_op_cases.pt")

_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
_PRESETS = {
    "upstream_sm90": dict(lp_dtype="bfloat16", math_dtype="float32", diag_mode="fma", silu_form="tanh",
                          state_update="accumulate_into", round_outputs=True, sites=True),
    "upstream_sm90_fp16": dict(lp_dtype="float16", math_dtype="float32", diag_mode="fma", silu_form="tanh",
                               state_update="accumulate_into", round_outputs=True, sites=True),
    "fp32": dict(lp_dtype="bfloat16", math_dtype="float32", diag_mode="mul_then_add", silu_form="sigmoid",
                 state_update="separate", round_outputs=True, sites=False),
    "fp64": dict(lp_dtype="bfloat16", math_dtype="float64", diag_mode="mul_then_add", silu_form="sigmoid",
                 state_update="separate", round_outputs=False, sites=False),
}
PRESET_NAMES = tuple(_PRESETS)


def standin_policy(name: str, sites: Optional[Dict[str, bool]] = None, **knobs) -> types.SimpleNamespace:
    """A stand-in policy: preset ``name`` with some switches (``sites``) and knobs (``lp_dtype=...``) changed."""
    base = dict(_PRESETS[name])
    every = base.pop("sites")
    unknown = sorted(set(knobs) - set(base))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; knobs: {sorted(base)}")
    base.update(knobs)
    switches = {s: every for s in SITES}
    for site, value in (sites or {}).items():
        if site not in SITES:
            raise ValueError(f"unknown site {site!r}")
        switches[site] = value
    return types.SimpleNamespace(lp_torch_dtype=_TORCH[base["lp_dtype"]], math_torch_dtype=_TORCH[base["math_dtype"]],
                                 **base, **{OP_NAME: types.SimpleNamespace(**switches)})


def load_golden() -> dict:
    """The whole-op golden cases, name -> case dict (``torch.load(..., weights_only=True)``)."""
    return torch.load(GOLDEN_FULL_OP, weights_only=True)


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
        policy = standin_policy(policy)
    return mamba_mimo_bwd_bwd(*args_of(inputs), **kwargs_of(inputs), policy=policy, record=record)


#: Outputs whose last sum cancels heavily; their errors are also judged against Σ|terms| (abs_term_sums).
CANCELLING_OUTPUTS = ("dD", "ddA", "dangles")


def abs_term_sums(inputs: dict) -> dict:
    """Σ|terms| of the last sum of dD ``[B, H]``, ddA ``[B, H, S]`` and dangles ``[B, S, H, N/d]``, in FP64.

    Computed from the reference's record under the ``fp64`` preset: dD sums the ``dd_terms`` (t, r, p), ddA the
    ``dda_terms`` of its chunk (n, p), dangles the four ``dangles_terms`` of every rank. None where an output is.
    """
    record = {}
    out = run_reference(inputs, "fp64", record=record)
    C, S = inputs["chunk_size"], inputs["q"].shape[1]
    sums = {"dD": None if out.dD is None else record["dd_terms"].abs().sum(dim=(2, 3, 4))}
    sums["ddA"] = record["dda_terms"].abs().sum(dim=(-1, -2)).repeat_interleave(C, dim=2)[:, :, :S]
    sums["dangles"] = record["dangles_terms"].abs().sum(dim=(3, 4)).permute(0, 2, 1, 3)
    return sums


def rel_to_abs_terms(actual: torch.Tensor, expected: torch.Tensor, abs_sums: torch.Tensor) -> float:
    """``||actual − expected||₂ / ||Σ|terms|||₂``: the error on the scale of the summed magnitudes (FP64)."""
    diff = actual.to(torch.float64) - expected.to(torch.float64)
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(abs_sums.to(torch.float64))).item()
