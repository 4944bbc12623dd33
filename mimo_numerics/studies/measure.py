"""Measurements of the FP64 side of the whole op against the golden H200 data (one case of
``upstream_h200_full_op_cases.pt``: ``inputs``, ``pre``, ``fwd``, ``autograd``), shared by the tests and
``scripts/measure_fp64_vs_golden.py``.

Every error is ``metric(upstream, fp64)``: the upstream value is the ``actual``, our model the ``expected``.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch

from ..metrics import bit_equal_fraction, max_abs, rel_rms
from ..ops.mamba_mimo_fwd.oracle import mamba_mimo_fwd_oracle
from ..ops.mamba3_mimo.diagnostics import d_skip_terms
from ..ops.mamba3_mimo.fp64_model import INPUT_NAMES, mamba3_mimo_fp64
from ..ops.mamba3_mimo.preprocess import angle_cumsum, dacs_segsum

PRE_TENSORS = ("angles_cumsum", "da_cs", "da_cs_rev", "segsum")


def wrapped_max_abs(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected|`` of angles, the difference taken on the circle (in ``[-π, π)``)."""
    diff = actual.to(torch.float64) - expected.to(torch.float64)
    return torch.remainder(diff + math.pi, 2 * math.pi).sub(math.pi).abs().max().item()


def preprocess(case: dict, math_dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Our ``pre`` tensors of a golden case in ``math_dtype``."""
    inputs = case["inputs"]
    chunk = inputs["chunk_size"]
    da_cs, da_cs_rev, segsum = dacs_segsum(inputs["ADT"], chunk, math_dtype=math_dtype)
    angles = angle_cumsum(inputs["Angles"], inputs["DT"], chunk, math_dtype=math_dtype)
    return {"angles_cumsum": angles, "da_cs": da_cs, "da_cs_rev": da_cs_rev, "segsum": segsum}


def preprocess_figures(case: dict, math_dtype: torch.dtype) -> Dict[str, Dict[str, float]]:
    """Per ``pre`` tensor: ``max_abs``, ``rel_rms``, ``bit_equal`` (float32 form only; ``nan`` for float64) and,
    for the angles, ``wrapped_max_abs``."""
    ours = preprocess(case, math_dtype)
    figures = {}
    for name in PRE_TENSORS:
        want, got = case["pre"][name], ours[name]
        row = {"max_abs": max_abs(want, got), "rel_rms": rel_rms(want, got),
               "bit_equal": bit_equal_fraction(got, want) if got.dtype == want.dtype else math.nan}
        if name == "angles_cumsum":
            row["wrapped_max_abs"] = wrapped_max_abs(want, got)
        figures[name] = row
    return figures


def fwd_oracle_on_golden_pre(case: dict) -> torch.Tensor:
    """``mamba_mimo_fwd_oracle`` on the case's raw inputs and upstream's own ``pre`` tensors."""
    x, pre = case["inputs"], case["pre"]
    return mamba_mimo_fwd_oracle(x["Q"], x["K"], x["V"], x["Q_bias"], x["K_bias"], x["MIMO_V"], x["MIMO_Out"],
                                 x["Z"], x["D"], x["MIMO_Z"], pre["angles_cumsum"], pre["da_cs"], pre["da_cs_rev"],
                                 x["DT"], x["Trap"], pre["segsum"], x["chunk_size"], x["rotary_dim_divisor"])


def model_output_and_grads(case: dict, clamp_backward: str = "upstream"
                           ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """``mamba3_mimo_fp64`` on the case's inputs, and the gradients of ``Σ Out·dout`` by autograd.

    Returns:
        tuple: ``Out`` (float64) and ``{"dQ": ..., ...}`` for every input that is not None (float64).
    """
    x = case["inputs"]
    leaves = {name: (None if x[name] is None else x[name].detach().to(torch.float64).requires_grad_(True))
              for name in INPUT_NAMES}
    out = mamba3_mimo_fp64(*[leaves[name] for name in INPUT_NAMES], x["chunk_size"], x["rotary_dim_divisor"],
                           clamp_backward=clamp_backward)
    present = [name for name in INPUT_NAMES if leaves[name] is not None]
    grads = torch.autograd.grad(out, [leaves[name] for name in present], grad_outputs=x["dout"].to(torch.float64))
    return out.detach(), {"d" + name: grad for name, grad in zip(present, grads)}


def dd_error_over_abs_terms(case: dict, dd_fp64: torch.Tensor) -> float:
    """``max_h |dD_upstream[h] - dD_fp64[h]| / Σ_{b,t,r,p} |terms[h]|`` (``diagnostics.d_skip_terms``)."""
    x = case["inputs"]
    terms = d_skip_terms(x["dout"], x["V"], x["MIMO_V"], x["MIMO_Z"], x["MIMO_Out"], x["Z"])
    abs_sum = terms.abs().sum(dim=(0, 1, 2, 4))  # [H]
    error = (case["autograd"]["dD"].to(torch.float64) - dd_fp64).abs()
    return (error / abs_sum).max().item()


def fwd_oracle_vs_model(inputs: dict, chunk_size: int, rotary_dim_divisor: int) -> float:
    """rel RMS between ``mamba_mimo_fwd_oracle`` (given ``preprocess``'s float64 outputs) and the forward of
    ``mamba3_mimo_fp64`` on the same raw inputs (``cases.make_op_inputs``)."""
    x = inputs
    da_cs, da_cs_rev, segsum = dacs_segsum(x["ADT"], chunk_size, math_dtype=torch.float64)
    angles = angle_cumsum(x["Angles"], x["DT"], chunk_size, math_dtype=torch.float64)
    oracle = mamba_mimo_fwd_oracle(x["Q"], x["K"], x["V"], x["Q_bias"], x["K_bias"], x["MIMO_V"], x["MIMO_Out"],
                                   x["Z"], x["D"], x["MIMO_Z"], angles, da_cs, da_cs_rev, x["DT"], x["Trap"], segsum,
                                   chunk_size, rotary_dim_divisor)
    with torch.no_grad():
        model = mamba3_mimo_fp64(*[x[name] for name in INPUT_NAMES], chunk_size, rotary_dim_divisor)
    return rel_rms(oracle, model)


def tanh_ulp_offsets_at_first_token(case: dict, search: int = 300) -> torch.Tensor:
    """How far upstream's ``tanh.approx.f32`` is from torch's fp32 tanh, inferred from the golden angles at t = 0.

    At t = 0 upstream's angle is ``fl(fl(tanh_approx(a) · π₃₂) · dt)`` (state 0, no wrap), so every fp32 ``y`` with
    ``fl(fl(y · π₃₂) · dt)`` equal to the golden value is a candidate for ``tanh_approx(a)``. Returns, per element,
    the candidate nearest to ``torch.tanh(a)`` as a signed distance in fp32 ulps (steps of the bit pattern), or
    ``search + 1`` where none lies within ``search`` ulps.

    Returns:
        Tensor: int64, ``[B, H, K]`` (the first token's angles).
    """
    angles = case["inputs"]["Angles"][:, 0]  # [B, H, K]
    dt = case["inputs"]["DT"][:, :, :1]  # [B, H, 1]
    want = case["pre"]["angles_cumsum"][:, 0]
    base = torch.tanh(angles.to(torch.float32)).view(torch.int32)
    pi32 = torch.tensor(math.pi, dtype=torch.float32)
    best = torch.full(base.shape, search + 1, dtype=torch.int64)
    for distance in range(search + 1):
        for offset in ((distance, -distance) if distance else (0,)):
            candidate = (base + offset).view(torch.float32)
            hit = ((candidate * pi32) * dt == want) & (best > search)
            best[hit] = offset
    return best
