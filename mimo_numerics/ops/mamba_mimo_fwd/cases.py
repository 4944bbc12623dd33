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


def kernel_cases() -> tuple:
    """Small stage-1 case specs that gate the forward Triton kernel in the interpreter (each a few interpreter
    programs): together the reduced and full outputs, Z and D on and off, G = 1 < H and G = H, GQA with B > 1,
    R in {1, 2, 3, 4, 8}, tails (S not a multiple of C), rotary divisor 2, both input formulas, bf16 and fp16."""
    from ...cases import CaseSpec as c

    return (
        c(seqlen=13, state_dim=16, value_dim=16, rank=3, chunk_size=6, has_z=True, has_d=True),  # roZD, tail
        c(batch=2, heads=4, groups=2, seqlen=12, state_dim=16, value_dim=32, rank=2, chunk_size=8),  # ro--, GQA
        c(formula="realistic", seqlen=24, heads=2, groups=1, state_dim=32, value_dim=16, rank=2, chunk_size=8,
          reduce_o=False, has_z=True, has_d=True, rotary_dim_divisor=2),  # foZD, G = 1 < H, divisor 2
        c(seqlen=20, state_dim=32, value_dim=16, rank=1, chunk_size=16, reduce_o=False, has_d=True),  # fo-D, R = 1
        c(formula="realistic", seqlen=16, state_dim=16, value_dim=16, rank=4, chunk_size=4, has_z=True),  # roZ-
        c(seqlen=10, heads=2, groups=2, state_dim=16, value_dim=16, rank=8, chunk_size=4, has_z=True,
          has_d=True),  # roZD, R = 8, G = H, tail
        c(seqlen=19, heads=2, groups=2, state_dim=16, value_dim=16, rank=2, chunk_size=8, has_z=True, has_d=True,
          dtype="float16"),  # roZD fp16, G = H, tail
        c(seqlen=12, state_dim=16, value_dim=16, rank=1, chunk_size=4, reduce_o=False, has_z=True, dtype="float16",
          rotary_dim_divisor=2),  # foZ- fp16, R = 1
        c(formula="realistic", seqlen=9, state_dim=16, value_dim=16, rank=8, chunk_size=2, reduce_o=False,
          has_d=True, dtype="float16"),  # fo-D fp16, R = 8
    )


def kernel_policies(spec) -> list:
    """``(name, policy)`` pairs the forward kernel is gated under on ``spec``: the presets with forward semantics in
    the case's lp dtype (bf16: ``fp32``, ``upstream_sm90``, ``upstream_sm80``; fp16: ``upstream_sm90_fp16``,
    ``upstream_sm80_fp16`` and ``fp32`` with ``lp_dtype="float16"``)."""
    from ... import presets

    if spec.dtype == "bfloat16":
        return [(n, presets.get(n)) for n in ("fp32", "upstream_sm90", "upstream_sm80")]
    return ([(n, presets.get(n)) for n in ("upstream_sm90_fp16", "upstream_sm80_fp16")]
            + [("fp32@fp16", presets.get("fp32").replace(lp_dtype="float16"))])
