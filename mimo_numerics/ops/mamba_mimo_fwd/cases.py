"""Cases of the forward ``mamba_mimo_fwd``: the stage-1 case specs (``mimo_numerics.cases``) give the forward's
inputs (the same tensors less ``dout``); whole-op specs (``ops.mamba3_mimo.cases.OpCaseSpec``) go through upstream's
preprocessing in FP32 (``ops.mamba3_mimo.golden.preprocess``); stored golden cases give their stored inputs."""

from __future__ import annotations

from ..mamba3_mimo.cases import OpCaseSpec, make_op_inputs
from ..mamba3_mimo.golden import kernel_inputs, preprocess
from .spec import INPUT_NAMES
from ..mamba_mimo_bwd_fwd import cases as stage1_cases

_SCALARS = ("chunk_size", "rotary_dim_divisor")


def make_inputs(spec, device="cpu") -> dict:
    """The forward's 16 tensors by name plus ``chunk_size`` and ``rotary_dim_divisor`` for ``spec`` (a
    ``CaseSpec``, ``StoredCase`` or ``OpCaseSpec``)."""
    if isinstance(spec, OpCaseSpec):
        raw = make_op_inputs(spec)
        full = kernel_inputs(raw, preprocess(raw))
    else:
        full = stage1_cases.make_inputs(spec)
    out = {name: (None if full[name] is None else full[name].to(device)) for name in INPUT_NAMES}
    out.update({name: full[name] for name in _SCALARS})
    return out


def grids() -> dict:
    """The stage-1 grids (their inputs serve the forward too), and ``whole_op``: raw whole-op cases through
    upstream's FP32 preprocessing."""
    out = stage1_cases.grids()
    out["whole_op"] = (OpCaseSpec(seqlen=32, state_dim=32, value_dim=16, rank=2, chunk_size=8),
                       OpCaseSpec(seqlen=40, groups=2, rank=4, chunk_size=16, reduce_o=False, has_d=False, seed=1),
                       OpCaseSpec(seqlen=24, state_dim=32, value_dim=32, rank=4, chunk_size=8, dtype="float16",
                                  seed=2))
    return out
