"""The forward's golden cases: the whole-op H200 data (``ops.mamba3_mimo.golden``) with upstream's recorded
preprocessing as the forward's inputs and ``fwd.o`` as its output."""

from __future__ import annotations

from ..mamba3_mimo import golden as _golden
from .spec import INPUT_NAMES


def stored_cases(paths=None):
    """The cases as ``StoredCase`` objects (inputs from the recorded ``pre``)."""
    return _golden.stored_cases("fwd", INPUT_NAMES, paths=paths)


def upstream_outputs(name: str, paths=None):
    """Upstream's ``{"o": ...}`` for case ``name``."""
    return _golden.upstream_outputs(name, "fwd", paths)


def golden_args(case: dict) -> dict:
    """The forward's keyword arguments for a golden whole-op ``case``: raw inputs plus upstream's recorded
    preprocessing (``pre``: ``angles`` = the cumulative angles, ``da_cs``, ``da_cs_rev``, ``segsum``)."""
    inputs, pre = case["inputs"], case["pre"]
    return dict(q=inputs["Q"], k=inputs["K"], v=inputs["V"], q_bias=inputs["Q_bias"], k_bias=inputs["K_bias"],
                mimo_v=inputs["MIMO_V"], mimo_o=inputs["MIMO_Out"], z=inputs["Z"], d=inputs["D"],
                mimo_z=inputs["MIMO_Z"], angles=pre["angles_cumsum"], da_cs=pre["da_cs"],
                da_cs_rev=pre["da_cs_rev"], dt=inputs["DT"], trap=inputs["Trap"], segsum=pre["segsum"],
                chunk_size=inputs["chunk_size"], rotary_dim_divisor=inputs["rotary_dim_divisor"])


def case_policy(preset: str, case: dict):
    """Preset ``preset`` in the lp dtype of golden ``case`` (``upstream_sm90`` of an fp16 case is
    ``upstream_sm90_fp16``)."""
    from ... import presets

    lp = str(case["inputs"]["Q"].dtype).replace("torch.", "")
    if preset == "upstream_sm90" and lp == "float16":
        preset = "upstream_sm90_fp16"
    policy = presets.get(preset)
    return policy if policy.lp_dtype == lp else policy.replace(lp_dtype=lp)


def golden_table(golden: dict) -> list:
    """Per golden case (``name -> case`` with a ``fwd`` section): rel RMS against upstream's ``fwd.o`` of the
    reference under ``upstream_sm90``, ``fp32`` and ``fp64`` (each in the case's lp dtype), and the fraction of
    elements bit-equal to upstream under ``upstream_sm90``. One dict per case, sorted by name."""
    from ...metrics import bit_equal_fraction, rel_rms
    from .reference import mamba_mimo_fwd

    rows = []
    for name in sorted(golden):
        args, want = golden_args(golden[name]), golden[name]["fwd"]["o"]
        row = {"case": name}
        for preset in ("upstream_sm90", "fp32", "fp64"):
            got = mamba_mimo_fwd(**args, policy=case_policy(preset, golden[name])).o
            row[preset] = rel_rms(got, want)
            if preset == "upstream_sm90":
                row["bit_equal"] = bit_equal_fraction(got, want)
        rows.append(row)
    return rows
