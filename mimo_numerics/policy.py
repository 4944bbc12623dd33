"""``RoundingPolicy``: one switch per rounding site of ``mamba_mimo_bwd_fwd`` plus the knobs that change its numerics.

The switch names are those of ``upstream_rounding_sites.md`` §3.1; each, when on, rounds one quantity to the
low-precision dtype (round to nearest even) where the upstream kernel does. The policy is the only way to change
the numerics of the reference and of the kernels: no environment variable does.

JSON form: ``{"schema_version": 1, "<field>": <value>, ...}``. Loading fills fields that an older file lacks with
their defaults, so knobs can be added without breaking stored policies; unknown fields or values raise
``ValueError`` naming them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Any, Dict, Tuple

import torch

SCHEMA_VERSION = 1

#: The rounding switches, in kernel order (``upstream_rounding_sites.md`` §3.1), with the sites each one rounds.
SWITCHES: Dict[str, str] = {
    "psi_weight": "S3: round Ψ (MIMO_V) before forming ΨV",
    "qk_bias": "S4: round q_bias and k_bias before the add",
    "phi_weight": "S34 operand: round Φ (MIMO_O) in dΦO (reduced DOUT with Z)",
    "dt_input": "S5, S8: round DT (dt_t and dt_{t+1})",
    "qk_biased": "S12, S13: round q + b_q and k + b_k",
    "psiv": "S11: round v·Ψ",
    "shifted_gamma": "S6: round dt_{t+1}·σ(−trap_{t+1})",
    "trap_scale": "S10: round γ + shifted γ",
    "qk_dot_internal": "S14: round q̃·k̃ᵀ before it feeds the diagonal term",
    "rotary": "S16, S17: round the rotated q and k halves",
    "k_scaled": "S18: round k_rot·trap_scale",
    "state_operand": "S19: round h before the inter-chunk GEMM",
    "causal_scores": "S22: round the masked, decayed scores before the intra GEMM",
    "diag_accum": "S26: carry the diagonal rank sum in lp, rounding at each rank step (see diag_mode)",
    "diag_gamma": "S27: round diag·γ",
    "out": "S30: round o before the gate and projections",
    "dphio": "S34, S35, S36: round dout·Φ and (·)·out, or DOUT_r·out",
    "dz_accum": "S38: carry the DZ rank sum in lp, rounding at each step",
    "k_state": "S42: round k̂·exp(da_cs_rev) before the state GEMM",
}

#: Knobs honoured today, with their allowed values.
KNOBS: Dict[str, Tuple[Any, ...]] = {
    "lp_dtype": ("bfloat16", "float16"),
    "diag_mode": ("fma", "mul_then_add"),
    "math_dtype": ("float32", "float64"),
    "state_update": ("accumulate_into", "separate"),
    "silu_form": ("tanh", "sigmoid"),
    "round_outputs": (True, False),
}

#: FP32-level knobs of ``upstream_rounding_sites.md`` §3.2 that are declared but not honoured yet: every value but
#: the first raises ``NotImplementedError`` naming the knob (no silent fallback).
FUTURE_KNOBS: Dict[str, Tuple[Any, ...]] = {
    "gemm_model": ("fp32", "sm90_wgmma", "sm80_mma"),
    "special_functions": ("accurate", "fast"),
    "fp32_fma": (False, True),
    "reduction_order": ("pairwise", "sequential_time"),
}

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                 "float64": torch.float64}


@dataclass(frozen=True)
class RoundingPolicy:
    """Which quantities of ``mamba_mimo_bwd_fwd`` are rounded to low precision, and how.

    Every switch defaults to on and the knobs default to upstream-on-Hopper values; see ``mimo_numerics.presets``
    for the named policies. Instances are frozen and hashable; change them with ``replace``.
    """

    psi_weight: bool = True
    qk_bias: bool = True
    phi_weight: bool = True
    dt_input: bool = True
    qk_biased: bool = True
    psiv: bool = True
    shifted_gamma: bool = True
    trap_scale: bool = True
    qk_dot_internal: bool = True
    rotary: bool = True
    k_scaled: bool = True
    state_operand: bool = True
    causal_scores: bool = True
    diag_accum: bool = True
    diag_gamma: bool = True
    out: bool = True
    dphio: bool = True
    dz_accum: bool = True
    k_state: bool = True
    lp_dtype: str = "bfloat16"
    diag_mode: str = "fma"
    math_dtype: str = "float32"
    state_update: str = "accumulate_into"
    silu_form: str = "tanh"
    round_outputs: bool = True
    gemm_model: str = "fp32"
    special_functions: str = "accurate"
    fp32_fma: bool = False
    reduction_order: str = "pairwise"

    def __post_init__(self):
        for name in SWITCHES:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"RoundingPolicy.{name} must be a bool (a rounding switch), got {value!r}")
        for name, allowed in KNOBS.items():
            value = getattr(self, name)
            if not any(value == a and type(value) is type(a) for a in allowed):
                raise ValueError(f"RoundingPolicy.{name}={value!r} is not a known value; expected one of {allowed}")
        for name, allowed in FUTURE_KNOBS.items():
            value = getattr(self, name)
            if not any(value == a and type(value) is type(a) for a in allowed):
                raise ValueError(f"RoundingPolicy.{name}={value!r} is not a known value; expected one of {allowed}")
            if value != allowed[0]:
                raise NotImplementedError(
                    f"RoundingPolicy.{name}={value!r} is declared but not implemented yet; only "
                    f"{name}={allowed[0]!r} is honoured by the reference and the kernels")

    # ------------------------------------------------------------------ derived values
    @property
    def lp_torch_dtype(self) -> torch.dtype:
        """The low-precision torch dtype (``torch.bfloat16`` or ``torch.float16``)."""
        return _TORCH_DTYPES[self.lp_dtype]

    @property
    def math_torch_dtype(self) -> torch.dtype:
        """The dtype the reference computes in (``torch.float32`` or ``torch.float64``)."""
        return _TORCH_DTYPES[self.math_dtype]

    @property
    def name(self) -> str:
        """The preset name this policy equals, or ``"custom"``."""
        from . import presets

        return presets.name_of(self) or "custom"

    def switches_on(self) -> Tuple[str, ...]:
        """Names of the switches that are on."""
        return tuple(s for s in SWITCHES if getattr(self, s))

    # ------------------------------------------------------------------ edits and comparisons
    def replace(self, **changes) -> "RoundingPolicy":
        """A copy with ``changes`` applied; unknown field names raise ``ValueError`` naming them."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            raise ValueError(f"unknown RoundingPolicy field(s) {unknown}; known fields: {list(field_names())}")
        return dataclasses.replace(self, **changes)

    def diff(self, other: "RoundingPolicy") -> Dict[str, Tuple[Any, Any]]:
        """Fields that differ, as ``{field: (value in self, value in other)}``, in field order."""
        if not isinstance(other, RoundingPolicy):
            raise TypeError(f"other must be a RoundingPolicy, got {type(other).__name__}")
        return {f: (getattr(self, f), getattr(other, f)) for f in field_names()
                if getattr(self, f) != getattr(other, f)}

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> Dict[str, Any]:
        """``{"schema_version": 1, field: value, ...}`` with plain JSON types."""
        out: Dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        out.update({f: getattr(self, f) for f in field_names()})
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "RoundingPolicy":
        """Inverse of ``to_dict``. Missing fields take their defaults; unknown fields raise ``ValueError``."""
        if not isinstance(data, dict):
            raise TypeError(f"policy data must be a dict, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ValueError(f"policy schema_version {version!r} is not supported (this package reads "
                             f"schema_version {SCHEMA_VERSION})")
        unknown = sorted(set(data) - set(field_names()))
        if unknown:
            raise ValueError(f"unknown RoundingPolicy field(s) {unknown}; known fields: {list(field_names())}")
        return cls(**data)

    def to_json(self, indent: int = 2) -> str:
        """The policy as a JSON document (see ``to_dict``)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "RoundingPolicy":
        """Inverse of ``to_json``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"policy JSON is not valid JSON: {exc}") from None
        return cls.from_dict(data)


def field_names() -> Tuple[str, ...]:
    """All policy fields in declaration order (switches, then knobs)."""
    return tuple(f.name for f in fields(RoundingPolicy))
