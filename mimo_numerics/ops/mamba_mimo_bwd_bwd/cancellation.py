"""Stage 2's cancelling outputs: errors judged on the scale of the summed magnitudes as well as of the result.

``dD``, ``ddA`` and ``dangles`` end in a sum whose terms cancel heavily, so a rel RMS against the (small) result
overstates the rounding error; :func:`abs_term_sums` gives ``Σ|terms|`` of that last sum (FP64, from the
reference's record under the ``fp64`` preset) and :func:`rel_to_abs_terms` the error on that scale. Used by the
stage-2 tests and ``scripts/stage2_site_sensitivity.py``.
"""

from __future__ import annotations

import torch

#: Outputs whose last sum cancels heavily; their errors are also judged against Σ|terms| (abs_term_sums).
CANCELLING_OUTPUTS = ("dD", "ddA", "dangles")


def abs_term_sums(inputs: dict) -> dict:
    """Σ|terms| of the last sum of dD ``[B, H]``, ddA ``[B, H, S]`` and dangles ``[B, S, H, N/d]``, in FP64.

    ``inputs``: stage-2 arguments by name (``golden.golden_inputs``). Computed from the reference's record under the
    ``fp64`` preset (in the inputs' lp dtype): dD sums the ``dd_terms`` (t, r, p), ddA the ``dda_terms`` of its
    chunk (n, p), dangles the four ``dangles_terms`` of every rank. None where an output is.
    """
    from ... import presets
    from .reference import mamba_mimo_bwd_bwd
    from .spec import INPUT_NAMES

    record: dict = {}
    lp = "float16" if inputs["q"].dtype == torch.float16 else "bfloat16"
    out = mamba_mimo_bwd_bwd(*[inputs[n] for n in INPUT_NAMES], chunk_size=inputs["chunk_size"],
                             rotary_dim_divisor=inputs["rotary_dim_divisor"],
                             policy=presets.get("fp64").replace(lp_dtype=lp), record=record)
    C, S = inputs["chunk_size"], inputs["q"].shape[1]
    sums = {"dD": None if out.dD is None else record["dd_terms"].abs().sum(dim=(2, 3, 4))}
    sums["ddA"] = record["dda_terms"].abs().sum(dim=(-1, -2)).repeat_interleave(C, dim=2)[:, :, :S]
    sums["dangles"] = record["dangles_terms"].abs().sum(dim=(3, 4)).permute(0, 2, 1, 3)
    return sums


def rel_to_abs_terms(actual: torch.Tensor, expected: torch.Tensor, abs_sums: torch.Tensor) -> float:
    """``||actual − expected||₂ / ||Σ|terms|||₂``: the error on the scale of the summed magnitudes (FP64)."""
    diff = actual.to(torch.float64) - expected.to(torch.float64)
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(abs_sums.to(torch.float64))).item()
