"""Cases of stage 2, ``mamba_mimo_bwd_bwd``: stage 1's inputs for a case spec plus ``states`` and ``qk_dot`` from
the stage-1 reference under ``upstream_sm90`` (``upstream_sm90_fp16`` for float16 cases) — the lp tensors upstream
hands from stage 1 to stage 2 — or, for a stored golden case, the recorded ones."""

from __future__ import annotations

from ..mamba_mimo_bwd_fwd.outputs import INPUT_NAMES as STAGE1_INPUT_NAMES
from .spec import INPUT_NAMES
from ..mamba_mimo_bwd_fwd import cases as stage1_cases

_SCALARS = ("chunk_size", "rotary_dim_divisor")


def make_inputs(spec, device="cpu") -> dict:
    """Stage 2's 19 tensors by name plus ``chunk_size`` and ``rotary_dim_divisor`` for ``spec``."""
    from ..mamba_mimo_bwd_fwd import reference as stage1_reference

    inputs = stage1_cases.make_inputs(spec)
    if "states" not in inputs:
        stage1 = stage1_reference.mamba_mimo_bwd_fwd(
            *[inputs[n] for n in STAGE1_INPUT_NAMES], chunk_size=inputs["chunk_size"],
            rotary_dim_divisor=inputs["rotary_dim_divisor"],
            policy="upstream_sm90" if spec.dtype == "bfloat16" else "upstream_sm90_fp16")
        inputs["states"], inputs["qk_dot"] = stage1.states, stage1.qk_dot
    out = {name: (None if inputs[name] is None else inputs[name].to(device)) for name in INPUT_NAMES}
    out.update({name: inputs[name] for name in _SCALARS})
    return out


def grids() -> dict:
    """The stage-1 grids: the reference handles every one of their cases, tails and 1 < G < H included (which no
    upstream run can confirm: the full backward refuses them, docs/stage2.md)."""
    return stage1_cases.grids()
